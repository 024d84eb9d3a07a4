import argparse
import json

import pytest

from traces import Trace, TraceError, bundled
from traces.cli import (
    add_trace_read_options,
    add_traces_command,
    main,
    parse_mapping,
    read_trace_from_args,
)


def blocksim_like_parser() -> argparse.ArgumentParser:
    """What the main blocksim CLI does: register the command on its own sub-parsers."""
    parser = argparse.ArgumentParser(prog="blocksim")
    sub = parser.add_subparsers(dest="command", required=True)
    add_traces_command(sub)
    replay = sub.add_parser("replay")
    replay.add_argument("trace")
    add_trace_read_options(replay)
    return parser


def test_info_prints_statistics_as_json(capsys):
    args = blocksim_like_parser().parse_args(["traces", "info", str(bundled("mooncake")), "--json"])
    assert args.func(args) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 2000 and "prefix_reuse_ratio" in stats


def test_convert_shapes_and_writes_parquet(tmp_path, capsys):
    out = tmp_path / "out.parquet"
    assert main(["convert", str(bundled("azure-code")), str(out), "--head", "100", "--scale-rate", "2",
                 "--clip-max-len", "1024"]) == 0
    trace = Trace.from_parquet(out)
    assert len(trace) == 100 and (trace.df["prompt_tokens"] + trace.df["output_tokens"] <= 1024).all()
    assert "clipped" in capsys.readouterr().err


def test_convert_with_mapping_flags(tmp_path, write):
    src = write("g.csv", "ts,in,out\n0,3,4\n1500,5,6\n")
    out = tmp_path / "g.parquet"
    main(["convert", str(src), str(out), "--map", "arrival_s=ts", "--map", "prompt_tokens=in",
          "--map", "output_tokens=out", "--time-unit", "ms"])
    assert Trace.from_parquet(out).df["arrival_s"].tolist() == [0.0, 1.5]


@pytest.mark.parametrize("workload", ["plain", "shared-prefix", "multi-turn"])
def test_synth_writes_a_reproducible_trace(tmp_path, workload):
    paths = [tmp_path / f"{i}.parquet" for i in range(2)]
    for path in paths:
        main(["synth", str(path), "--workload", workload, "--requests", "30", "--arrivals", "gamma", "--cv", "2",
              "--prompt-len", "uniform:10:100", "--output-len", "fixed:5", "--seed", "7"])
    a, b = (Trace.from_parquet(p) for p in paths)
    assert len(a) > 0 and a.df.equals(b.df)
    assert a.has_hashes == (workload != "plain")


def test_replay_style_reading_uses_flags():
    args = blocksim_like_parser().parse_args(["replay", str(bundled("azure-conv")), "--format", "azure"])
    assert len(read_trace_from_args(args.trace, args)) == 2000


def test_read_trace_from_args_tolerates_missing_attributes(write):
    path = write("g.csv", "ts,in,out\n0,3,4\n")
    trace = read_trace_from_args(path, argparse.Namespace(), mapping={"arrival_s": "ts", "prompt_tokens": "in",
                                                                      "output_tokens": "out"})
    assert len(trace) == 1


def test_bad_map_flag():
    with pytest.raises(ValueError, match="FIELD=COLUMN"):
        parse_mapping(["arrival_s"])


def test_errors_surface_as_trace_error(write, capsys):
    path = write("empty.csv", "")
    args = blocksim_like_parser().parse_args(["traces", "info", str(path)])
    with pytest.raises(TraceError):
        args.func(args)
    assert main(["info", str(path)]) == 2, "the stand-alone entry point exits with status 2"
    assert "empty" in capsys.readouterr().err
