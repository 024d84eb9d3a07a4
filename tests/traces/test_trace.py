import numpy as np
import pandas as pd
import pytest

from traces import Trace


def frame(**overrides):
    base = {"arrival_s": [0.0, 0.5, 2.0], "prompt_tokens": [10, 20, 30], "output_tokens": [1, 2, 3]}
    base.update(overrides)
    return pd.DataFrame(base)


def test_defaults_fill_request_id_n_and_priority():
    trace = Trace(frame())
    assert trace.df["request_id"].tolist() == [0, 1, 2]
    assert trace.df["n"].tolist() == [1, 1, 1], "n defaults to one sequence per request"
    assert trace.df["priority"].tolist() == [0, 0, 0]
    assert len(trace) == 3


def test_canonical_dtypes_and_column_order():
    trace = Trace(frame(prompt_tokens=np.array([10, 20, 30], dtype=np.int32)))
    assert list(trace.df.columns) == ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "priority"]
    assert trace.df["prompt_tokens"].dtype == np.int64
    assert trace.df["arrival_s"].dtype == np.float64


@pytest.mark.parametrize("overrides, words", [
    ({"prompt_tokens": [10, -1, 30]}, "prompt_tokens"),
    ({"output_tokens": [1.5, 2.0, 3.0]}, "integers"),
    ({"arrival_s": [0.0, 2.0, 1.0]}, "sorted"),
    ({"arrival_s": [1.0, 2.0, 3.0]}, "start at 0.0"),
    ({"arrival_s": [0.0, np.nan, 3.0]}, "finite"),
    ({"n": [1, 0, 1]}, "'n'"),
    ({"request_id": [1, 1, 2]}, "unique"),
])
def test_construction_rejects_broken_invariants(overrides, words):
    with pytest.raises(ValueError, match=words):
        Trace(frame(**overrides))


def test_prefix_hashes_must_match_prompt_blocks():
    ok = Trace(frame(prefix_hashes=[[1], [1, 2], [1, 2, 3]]), hash_block_tokens=10)
    assert ok.has_hashes
    with pytest.raises(ValueError, match="expected ceil"):
        Trace(frame(prefix_hashes=[[1], [1], [1, 2, 3]]), hash_block_tokens=10)
    with pytest.raises(ValueError, match="hash_block_tokens"):
        Trace(frame(prefix_hashes=[[1], [1, 2], [1, 2, 3]]))


def test_parquet_round_trip_keeps_name_block_size_and_hashes(tmp_path):
    trace = Trace(frame(prefix_hashes=[[1], [1, 2], [1, 2, 3]], priority=[0, 5, -1]), 10, "demo")
    trace.to_parquet(tmp_path / "t.parquet")
    back = Trace.from_parquet(tmp_path / "t.parquet")
    assert back.name == "demo" and back.hash_block_tokens == 10
    pd.testing.assert_frame_equal(back.df, trace.df)
    assert back.df["prefix_hashes"].iloc[2] == [1, 2, 3]


def test_empty_trace_is_allowed():
    trace = Trace(pd.DataFrame({"arrival_s": [], "prompt_tokens": [], "output_tokens": []}))
    assert len(trace) == 0 and "requests=0" in repr(trace)
