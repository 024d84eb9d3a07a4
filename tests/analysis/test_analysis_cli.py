"""analysis/cli.py: the sub-commands as the main ``blocksim`` parser registers them."""

import argparse

import pytest
from rundir_fixtures import write_run

import blocksim.experiments.compare
from analysis.cli import add_analysis_commands
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


def test_compare_arguments():
    args = _parse(["compare", "t.csv", "--policy", "vllm", "--policy", "orca-max", "--rate-scale",
                   "0.5,1,2,4", "--slo", "ttft=2s,tpot=100ms", "--out", "o", "--max-requests", "50",
                   "--model", "m", "--set", "block_size=32", "--set", "watermark=0.01"])
    assert args.policy == ["vllm", "orca-max"] and args.rate_scale == [0.5, 1.0, 2.0, 4.0]
    assert args.slo == parse_slo("ttft=2s,tpot=100ms")
    assert args.set == [("block_size", 32), ("watermark", 0.01)]


@pytest.mark.parametrize("argv", [
    ["compare", "t.csv", "--out", "o"],                                     # no policy
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--rate-scale", "1,x"],
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--rate-scale", "-1"],
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--slo", "ttft=2"],
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--set", "novalue"],
])
def test_compare_bad_arguments_exit(argv):
    with pytest.raises(SystemExit):
        _parse(argv)


def test_compare_command_passes_overrides(tmp_path, monkeypatch, capsys):
    seen = []

    def runner(trace, out_dir, *, policy, rate_scale, overrides, progress, write_report):
        seen.append(overrides)
        if policy == "orca-max":
            raise RuntimeError("this run broke")
        write_run(tmp_path / out_dir)
        return {}

    monkeypatch.setattr(blocksim.experiments.compare, "replay_runner", runner)
    out = tmp_path / "cmp"
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    args = _parse(["compare", str(trace), "--policy", "vllm", "--policy", "orca-max", "--out", str(out),
                   "--workers", "1", "--max-requests", "50", "--gpu", "a100-80gb", "--set", "block_size=32",
                   "--no-progress"])
    assert args.func(args) == 1, "exit status 1 when a run failed"
    assert seen == [{"block_size": 32, "max_requests": 50, "gpu": "a100-80gb"}] * 2
    captured = capsys.readouterr()
    assert "this run broke" in captured.out and "1 of 2 runs failed" in captured.err
    assert (out / "summary.parquet").is_file() and (out / "report.html").is_file()


def test_compare_refuses_an_unknown_policy_before_running(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(blocksim.experiments.compare, "replay_runner", lambda *a, **k: ran.append(a))
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    args = _parse(["compare", str(trace), "--policy", "vllm", "--policy", "vllm-turbo", "--out", str(tmp_path / "o"),
                   "--workers", "1", "--no-progress"])
    assert args.func(args) == 2 and not ran
    assert "unknown policy 'vllm-turbo'" in capsys.readouterr().err


def test_compare_command_with_a_missing_trace(tmp_path, capsys):
    args = _parse(["compare", str(tmp_path / "nope.csv"), "--policy", "vllm", "--out", str(tmp_path / "o")])
    assert args.func(args) == 2
    assert "nope.csv not found" in capsys.readouterr().err
