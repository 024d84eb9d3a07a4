import math

import pandas as pd
import pytest

from traces import Trace, bundled, read_trace
from traces.stats import describe, prefix_reuse


def hashed(lists):
    count = len(lists)
    return Trace(pd.DataFrame({"arrival_s": [float(i) for i in range(count)],
                               "prompt_tokens": [len(h) * 4 for h in lists], "output_tokens": [1] * count,
                               "prefix_hashes": lists}), 4, "h")


def test_prefix_reuse_counts_leading_matches_only():
    # request 2 reuses [1, 2]; its 9 was seen, but after a miss (5), so it is no hit
    stats = prefix_reuse(hashed([[1, 2, 9], [1, 2, 5, 9]]))
    assert stats == {"hash_blocks": 7, "unique_hash_blocks": 4, "prefix_reuse_ratio": pytest.approx(2 / 7)}


def test_prefix_reuse_ignores_repeats_inside_one_request():
    assert prefix_reuse(hashed([[3, 3], []]))["prefix_reuse_ratio"] == 0.0


def test_describe_azure_sample():
    stats = describe(read_trace(bundled("azure-conv")))
    assert stats["requests"] == 2000
    assert stats["mean_rate_per_s"] == pytest.approx(2000 / stats["span_s"])
    assert stats["prompt_tokens_p50"] <= stats["prompt_tokens_p99"] <= stats["prompt_tokens_max"]
    assert "prefix_reuse_ratio" not in stats


def test_describe_mooncake_sample_reports_reuse():
    stats = describe(read_trace(bundled("mooncake")))
    assert 0 < stats["prefix_reuse_ratio"] < 1 and stats["hash_block_tokens"] == 512


def test_full_mooncake_reuse_matches_published_figure(shared_traces):
    stats = describe(read_trace(shared_traces / "mooncake" / "synthetic_trace.jsonl"))
    assert stats["hash_blocks"] == 121877 and stats["unique_hash_blocks"] == 43924
    assert stats["prefix_reuse_ratio"] == pytest.approx(0.640, abs=0.001)


def test_describe_single_request():
    stats = describe(hashed([[1]]))
    assert stats["requests"] == 1 and math.isnan(stats["interarrival_cv"])
