import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import (
    Trace,
    bundled,
    clip_to_max_len,
    head,
    poisson_retime,
    read_trace,
    scale_rate,
    subsample,
    window,
)


def make(arrival, prompt=None, output=None, hash_block_tokens=None, **extra):
    count = len(arrival)
    return Trace(pd.DataFrame({"arrival_s": arrival, "prompt_tokens": prompt or [10] * count,
                               "output_tokens": output or [5] * count, **extra}), hash_block_tokens, "t")


TRACE = make([0.0, 1.0, 2.0, 5.0, 9.0])


def test_window_keeps_half_open_interval_and_rebases():
    out = window(TRACE, 1.0, 5.0)
    assert out.df["request_id"].tolist() == [1, 2]
    assert out.df["arrival_s"].tolist() == [0.0, 1.0]
    assert len(window(TRACE, 5.0)) == 2, "no end means to the end of the trace"


def test_scale_rate_divides_inter_arrivals():
    assert scale_rate(TRACE, 2).df["arrival_s"].tolist() == [0.0, 0.5, 1.0, 2.5, 4.5]
    assert scale_rate(TRACE, 0.5).df["arrival_s"].iloc[-1] == 18.0
    with pytest.raises(ValueError):
        scale_rate(TRACE, 0)


def test_poisson_retime_keeps_lengths_and_hits_the_rate():
    trace = read_trace(bundled("azure-conv"))
    out = poisson_retime(trace, 10.0, seed=3)
    assert out.df["prompt_tokens"].tolist() == trace.df["prompt_tokens"].tolist()
    rate = len(out) / out.df["arrival_s"].iloc[-1]
    assert rate == pytest.approx(10.0, rel=0.1)
    assert out.df.equals(poisson_retime(trace, 10.0, seed=3).df), "same seed, same trace"


def test_subsample_by_fraction_or_count_keeps_order():
    trace = read_trace(bundled("azure-code"))
    by_fraction = subsample(trace, 0.25, seed=1)
    assert len(by_fraction) == 500
    assert by_fraction.df["request_id"].is_monotonic_increasing
    assert len(subsample(trace, count=7)) == 7
    with pytest.raises(ValueError):
        subsample(trace, 0.5, count=3)


def test_head():
    assert head(TRACE, 2).df["request_id"].tolist() == [0, 1]
    assert len(head(TRACE, 99)) == 5


def test_clip_to_max_len_reports_changes_and_cuts_hashes():
    trace = make([0.0, 1.0, 2.0], prompt=[100, 30, 10], output=[5, 90, 5],
                 prefix_hashes=[[1, 2, 3, 4], [5], [7]], hash_block_tokens=32)
    out, changed = clip_to_max_len(trace, 64)
    assert changed == 2
    assert out.df["prompt_tokens"].tolist() == [63, 30, 10]
    assert out.df["output_tokens"].tolist() == [1, 34, 5]
    assert out.df["prefix_hashes"].tolist() == [[1, 2], [5], [7]]


def test_shaping_returns_new_traces():
    before = TRACE.df.copy()
    scale_rate(TRACE, 3)
    window(TRACE, 1, 2)
    pd.testing.assert_frame_equal(TRACE.df, before)


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.floats(0, 100), min_size=1, max_size=50), factor=st.floats(0.01, 100),
       start=st.floats(0, 500), length=st.floats(0, 500), max_len=st.integers(2, 300))
def test_shaping_keeps_trace_invariants(gaps, factor, start, length, max_len):
    arrival = np.cumsum([0.0] + gaps[1:])
    trace = make(list(arrival), prompt=[int(g) for g in gaps], output=[int(g) % 7 + 1 for g in gaps])
    for out in (window(trace, start, start + length), scale_rate(trace, factor), head(trace, 3),
                subsample(trace, 0.5), poisson_retime(trace, factor)):
        arr = out.df["arrival_s"].to_numpy()
        assert len(arr) == 0 or (arr[0] == 0.0 and np.all(np.diff(arr) >= 0))
    clipped, changed = clip_to_max_len(trace, max_len)
    total = clipped.df["prompt_tokens"] + clipped.df["output_tokens"]
    assert (total <= max_len).all()
    assert changed == int((trace.df["prompt_tokens"] + trace.df["output_tokens"] > max_len).sum())
