"""analysis/metrics.py and analysis/slo.py on the tiny hand-computed run (see rundir_fixtures)."""

import pytest
from rundir_fixtures import synthetic_run, tiny_steps, tiny_summary, write_run

from analysis.metrics import (
    memory_fractions,
    memory_means,
    memory_timeseries,
    request_metrics,
    run_metrics,
    time_binned,
)
from analysis.rundir import load_run
from analysis.slo import format_slo, parse_slo


def test_parse_slo_units_and_keys():
    assert parse_slo("ttft=2s,tpot=100ms,e2e=30s") == {"ttft": 2.0, "tpot": 0.1, "e2e": 30.0}
    assert parse_slo(" TTFT = 1.5s , queue=250ms ") == {"ttft": 1.5, "queue": 0.25}
    assert parse_slo("") == {} and parse_slo(None) == {}
    assert format_slo({"ttft": 2.0, "tpot": 0.1}) == "ttft=2000ms,tpot=100ms"


@pytest.mark.parametrize("text, message", [
    ("ttft=2", "KEY=NUMBER<s|ms>"),          # unit required
    ("ttft=2min", "KEY=NUMBER<s|ms>"),
    ("latency=2s", "unknown SLO key 'latency'"),
    ("ttft=1s,ttft=2s", "given twice"),
    ("ttft", "KEY=NUMBER<s|ms>"),
])
def test_parse_slo_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_slo(text)


def test_request_metrics_are_the_recorded_latencies(tiny_run):
    req = request_metrics(load_run(tiny_run))
    assert req["ttft_s"].tolist()[:3] == [1.0, 2.0, 4.0]
    assert req["queue_s"].tolist()[:3] == [0.0, 1.0, 2.0]
    assert req["norm_latency_s"].tolist()[:3] == [1.0, 2.0, 4.0]
    assert req["status"].tolist() == ["finished"] * 3 + ["rejected"]


def test_run_throughput_and_latency_exact(tiny_run):
    m = run_metrics(load_run(tiny_run))
    assert (m["requests"], m["finished"], m["rejected"]) == (4, 3, 1)
    assert m["requests_per_s"] == 3 / 8
    assert m["output_tokens_per_s"] == (4 * 1 + 2 * 2 + 1 * 1) / 8, "n sequences each produce output_tokens"
    assert m["total_tokens_per_s"] == (9 + 10 + 20 + 6) / 8, "rejected prompts are not counted"
    assert m["offered_rate_req_s"] == 1.0
    assert m["ttft_mean_s"] == pytest.approx(7 / 3)
    assert (m["ttft_p50_s"], m["ttft_p90_s"], m["ttft_p99_s"]) == pytest.approx((2.0, 3.6, 3.96))
    assert (m["tpot_mean_s"], m["tpot_p90_s"]) == pytest.approx((1.5, 1.9)), "NaN TPOT is left out"
    assert m["e2e_p99_s"] == 4.0 and m["queue_mean_s"] == 1.0
    assert m["norm_latency_mean_s"] == pytest.approx(7 / 3)


def test_run_preemption_swap_and_recompute_counts(tiny_run):
    m = run_metrics(load_run(tiny_run))
    assert (m["preemptions"], m["swap_outs"]) == (2, 1)
    assert (m["blocks_swapped_in"], m["blocks_swapped_out"], m["bytes_swapped"]) == (3, 3, 6144)
    assert m["recomputed_tokens"] == 6
    assert "prefix_hit_rate" not in m, "no prefix-cache counters, no hit rate"


def test_prefix_hit_rate_when_present(tmp_path):
    summary = {**tiny_summary(), "prefix_cache_hits": 30, "prefix_cache_queries": 40}
    assert run_metrics(load_run(write_run(tmp_path / "r", summary=summary)))["prefix_hit_rate"] == 0.75


@pytest.mark.parametrize("slo, good", [
    ("ttft=2s,tpot=1500ms", 1),   # r0 only: r1's TPOT 2 s, r2's TTFT 4 s are over
    ("ttft=5s,tpot=1ms", 1),      # r2 only: it has no TPOT (one output token)
    ("e2e=4s", 3),                # bounds are inclusive; the rejected request never counts
    ("queue=500ms", 1),
])
def test_goodput(tiny_run, slo, good):
    m = run_metrics(load_run(tiny_run), parse_slo(slo))
    assert m["goodput_requests"] == good
    assert m["goodput_requests_per_s"] == good / 8
    assert m["slo_attainment"] == good / 4


def test_memory_time_weighted_means_and_fractions(tiny_run):
    run = load_run(tiny_run)
    # Durations 1, 3, 2, 2 s; e.g. token states (10*1 + 40*3 + 30*2 + 0*2) / 8 = 23.75 slots.
    assert memory_means(run) == {"token_states": 23.75, "reservation": 6.25, "internal_frag": 6.875,
                                 "external_frag": 8.125, "free": 55.0}
    fr = memory_fractions(run)
    assert fr == pytest.approx({"token_states_frac": 0.2375, "reservation_frac": 0.0625,
                                "internal_frag_frac": 0.06875, "external_frag_frac": 0.08125,
                                "free_frac": 0.55})
    assert sum(fr.values()) == pytest.approx(1.0), "the five categories sum to capacity"


def test_memory_means_without_elapsed_time_are_plain_means(tmp_path):
    steps = tiny_steps().assign(duration_s=0.0)
    run = load_run(write_run(tmp_path / "r", steps=steps))
    assert memory_means(run)["token_states"] == (10 + 40 + 30 + 0) / 4


def test_memory_timeseries_per_step_and_binned(tiny_run):
    run = load_run(tiny_run)
    ts = memory_timeseries(run)
    assert ts.index.tolist() == [0.0, 1.0, 4.0, 6.0] and ts["free"].tolist() == [60, 20, 60, 100]
    binned = memory_timeseries(run, bins=4)  # 2 s bins; [2, 4) has no step and is dropped
    assert binned.index.tolist() == [1.0, 5.0, 7.0]
    assert binned["token_states"].tolist() == [(10 * 1 + 40 * 3) / 4, 30.0, 0.0]


def test_time_binned_rates_are_events_per_second(tiny_run):
    steps = load_run(tiny_run).steps
    rates = time_binned(steps, ["preempted", "blocks_swapped_out"], bins=4, how="rate")
    assert rates["preempted"].tolist() == [0.5, 0.0, 0.5, 0.0], "one preemption per 2 s bin"
    assert rates["blocks_swapped_out"].tolist() == [1.5, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        time_binned(steps, ["preempted"], how="median")


def test_time_binned_by_width(tiny_run):
    steps = load_run(tiny_run).steps
    assert len(time_binned(steps, ["running"], width_s=3.0, how="rate")) == 3, "8 s span in 3 s windows"


def test_large_runs_are_downsampled(tmp_path):
    run = load_run(synthetic_run(tmp_path / "big", 50_000, 100))
    binned = time_binned(run.steps, ["mem_free", "running"], bins=400)
    assert len(binned) == 400, "one row per non-empty bin, not per step"
    raw = run.steps["mem_free"]
    assert raw.min() <= binned["mem_free"].min() and binned["mem_free"].max() <= raw.max()


def test_metrics_come_from_the_records_not_the_summary(tmp_path):
    """The summary supplies capacity (and bytes swapped); its own throughput is not trusted."""
    path = write_run(tmp_path / "r", summary={**tiny_summary(), "requests_per_s": 99.0})
    assert run_metrics(load_run(path))["requests_per_s"] == 3 / 8
