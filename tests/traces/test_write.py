"""`write_trace` and `traces convert` write the format the extension (or --to) names, and the
reader tells a file by its content."""

import warnings

import numpy as np
import pandas as pd
import pytest

from traces import TraceError, TraceWarning, bundled, head, read_trace
from traces.cli import main
from traces.write import output_format, write_trace


@pytest.mark.parametrize("name, fmt", [("t.parquet", "parquet"), ("t.csv", "csv"), ("t.jsonl", "jsonl"),
                                       ("t.ndjson", "jsonl"), ("T.CSV", "csv")])
def test_the_extension_names_the_format(name, fmt):
    assert output_format(name) == fmt and output_format(name, "parquet") == "parquet"


def test_an_unknown_extension_or_format_is_refused():
    with pytest.raises(TraceError, match="--to"):
        output_format("t.txt")
    with pytest.raises(TraceError, match="use one of"):
        output_format("t.csv", "xlsx")


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_every_format_reads_back_the_same_requests_and_prefix_hashes(tmp_path, suffix):
    trace = head(read_trace(bundled("mooncake")), 50)
    out = tmp_path / f"t{suffix}"
    assert write_trace(trace, out) == suffix[1:]
    back = read_trace(out, hash_block_tokens=trace.hash_block_tokens)
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "priority"]
    pd.testing.assert_frame_equal(back.df[cols], trace.df[cols])
    assert [list(h) for h in back.df["prefix_hashes"]] == [list(h) for h in trace.df["prefix_hashes"]]
    assert [p.name for p in tmp_path.iterdir()] == [out.name], "no temporary file left"


def test_convert_writes_csv_that_replay_reads_not_parquet_bytes(tmp_path, capsys):
    out = tmp_path / "out.csv"
    assert main(["convert", str(bundled("azure-conv")), str(out), "--head", "20"]) == 0
    assert out.read_text().startswith("request_id,arrival_s,prompt_tokens,output_tokens")
    assert len(read_trace(out)) == 20
    assert "as csv" in capsys.readouterr().out


def test_convert_to_overrides_the_extension_and_an_unknown_extension_stops_before_reading(tmp_path, capsys):
    out = tmp_path / "out.data"
    assert main(["convert", str(bundled("azure-conv")), str(out), "--head", "5", "--to", "parquet"]) == 0
    assert out.read_bytes().startswith(b"PAR1")
    assert main(["convert", str(tmp_path / "missing.csv"), str(tmp_path / "x.txt")]) == 2
    assert "x.txt" in capsys.readouterr().err, "the output is refused first, the missing input never read"


def test_content_wins_over_the_name_and_the_mismatch_is_named(tmp_path):
    parquet_named_csv = tmp_path / "out.csv"
    write_trace(head(read_trace(bundled("azure-conv")), 10), parquet_named_csv, to="parquet")
    with pytest.warns(TraceWarning, match="name says CSV but the content is PARQUET"):
        assert len(read_trace(parquet_named_csv)) == 10


def test_a_file_named_for_its_content_reads_without_warnings(tmp_path):
    out = tmp_path / "t.jsonl"
    write_trace(head(read_trace(bundled("azure-conv")), 10), out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_trace(out)) == 10


@pytest.mark.parametrize("unit, requests, words", [
    ("s", 100, "slower than a serving trace"),   # a 30 s trace in milliseconds read as seconds
    ("us", 100, "faster than a serving trace"),  # the same read as microseconds
    ("s", 5, "slower than a serving trace"),
])
def test_a_trace_in_the_wrong_time_unit_warns_whatever_its_size(write, unit, requests, words):
    ms = np.linspace(0, 30_000, requests).astype(int)
    path = write("t.csv", "ts,in,out\n" + "".join(f"{t},5,1\n" for t in ms))
    with pytest.warns(TraceWarning, match=f"column 'ts'.*{words}"):
        read_trace(path, mapping={"arrival_s": "ts", "prompt_tokens": "in", "output_tokens": "out"}, time_unit=unit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_trace(path, mapping={"arrival_s": "ts", "prompt_tokens": "in", "output_tokens": "out"}, time_unit="ms")
