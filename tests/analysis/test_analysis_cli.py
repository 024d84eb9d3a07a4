"""analysis/cli.py: the sub-commands as the main ``blocksim`` parser registers them."""

import argparse

import pytest
from rundir_fixtures import write_run

from analysis.cli import add_analysis_commands, slo_type
from analysis.slo import parse_slo


def _parse(argv):
    parser = argparse.ArgumentParser(prog="blocksim")
    add_analysis_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_report_command(tiny_run, capsys):
    args = _parse(["report", str(tiny_run), "--slo", "ttft=2s"])
    assert args.func(args) == 0
    assert str(tiny_run / "report.html") in capsys.readouterr().out


def test_report_command_names_missing_files(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    args = _parse(["report", str(tmp_path / "run")])
    assert args.func(args) == 2
    assert "missing requests.parquet" in capsys.readouterr().err


def test_fragmentation_command(tiny_run, capsys):
    args = _parse(["fragmentation", str(tiny_run), "--top-k", "2", "--window-s", "2"])
    assert args.func(args) == 0
    assert (tiny_run / "fragmentation.md").is_file()
    assert "37.5" in capsys.readouterr().out


def test_slo_type_reads_seconds_and_refuses_a_bound_without_a_unit():
    assert slo_type("ttft=2s,tpot=100ms") == parse_slo("ttft=2s,tpot=100ms") == {"ttft": 2.0, "tpot": 0.1}
    with pytest.raises(argparse.ArgumentTypeError, match="ttft=2"):
        slo_type("ttft=2")


def test_compare_is_not_an_analysis_command():
    with pytest.raises(SystemExit):
        _parse(["compare", "t.csv", "--policy", "vllm", "--out", "o"])
