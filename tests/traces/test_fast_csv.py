"""A clean CSV trace read by Arrow alone gives the trace the general reader gives; anything else
goes to the general reader."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import traces
import traces.read as read_module
from traces.fast_csv import read_plain_csv

ROOT = Path(__file__).resolve().parents[2]


def general(path, **kw):
    """The trace `read_trace` gives without the Arrow-only path."""
    saved = read_module.read_plain_csv
    read_module.read_plain_csv = lambda *a, **k: None
    try:
        return traces.read_trace(path, **kw)
    finally:
        read_module.read_plain_csv = saved


def assert_same(fast, slow):
    assert "_arrays" in fast.__dict__, "read by the Arrow-only path"
    for c, v in fast.arrays.items():
        want = slow.df[c].to_numpy()
        assert v.dtype == want.dtype and v.tobytes() == want.tobytes(), c
    assert fast.df.equals(slow.df) and list(fast.df.dtypes) == list(slow.df.dtypes)
    assert (fast.report, fast.name, fast.hash_block_tokens, len(fast)) == \
        (slow.report, slow.name, slow.hash_block_tokens, len(slow))


@pytest.mark.parametrize("name", ["azure-conv", "azure-code"])
def test_bundled_azure_samples_read_by_arrow_equal_the_general_reader(name):
    assert_same(traces.read_trace(traces.bundled(name)), general(traces.bundled(name)))


def test_unsorted_integer_arrivals_ids_and_counts_equal_the_general_reader(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("request_id,arrival_s,prompt_tokens,output_tokens,n,priority\n"
                 "7,30,10,5,1,0\n3,10,20,6,2,-1\n9,10,30,7,1,2\n4,20,40,8,1,0\n")
    fast = traces.read_trace(p)
    assert_same(fast, general(p))
    assert fast.arrays["request_id"].tolist() == [3, 9, 4, 7] and fast.arrays["arrival_s"].tolist() == [0, 0, 10, 20]


def test_float_arrivals_parse_as_the_general_reader_parses_them(tmp_path):
    rng = np.random.default_rng(0)
    arrival = np.sort(np.concatenate([rng.random(3000) * 3600, rng.random(1000) * 10.0 ** rng.integers(-6, 6, 1000)]))
    lines = [repr(float(a)) for a in arrival] + ["%.25f" % (1 / 3), "1234.50000000000000000001", "7e2", "12"]
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},10,5\n" for a in lines))
    assert_same(traces.read_trace(p), general(p))


@pytest.mark.parametrize("body", [
    "arrival_s,prompt_tokens,output_tokens\n0.5,10,5\nnan,20,6\n",   # a non-finite arrival
    "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,,6\n",          # a missing count
    "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6\n\n",      # a trailing blank line
    "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20.5,6\n",      # a fractional count
])
def test_files_the_arrow_path_leaves_to_the_general_reader(tmp_path, body):
    p = tmp_path / "t.csv"
    p.write_text(body)
    assert read_plain_csv(p, None, None, False, None, None, None) is None


def test_a_bad_row_is_named_by_the_general_reader(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,0,6\n")
    with pytest.raises(traces.TraceError, match="line 3"):
        traces.read_trace(p)


def test_a_replay_of_a_csv_trace_never_loads_pandas(tmp_path):
    script = ("import sys, runpy\n"
              "sys.argv = ['blocksim', 'replay', sys.argv[1], '--out', sys.argv[2], '--quiet', '--no-report']\n"
              "try:\n    runpy.run_module('blocksim', run_name='__main__')\n"
              "except SystemExit as e:\n    assert not e.code, e.code\n"
              "print('pandas' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script, str(traces.bundled("azure-conv")), str(tmp_path / "run")],
                          cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert (tmp_path / "run" / "requests.parquet").exists()
