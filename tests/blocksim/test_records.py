"""blocksim/records: written run directories match the schema; summary.json and the analysis
package compute the same metrics, on every path into the engine."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces
from analysis.metrics import run_metrics
from analysis.rundir import Run, load_run
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config, replay
from blocksim.records import metrics, schema

# Summary keys that are not computed from the records (configuration, timing, allocator counters).
NOT_METRICS = {"version", "config", "wall_s", "rate_scale", "trace", "num_gpu_blocks", "num_cpu_blocks",
               "block_size", "capacity_tokens", "bytes_swapped", "reject_reasons"}

OFFSET_TRACE = pd.DataFrame({
    "arrival_s": [5.5, 5.6, 6.0, 6.1, 7.25, 9.0],
    "prompt_tokens": [100, 200, 300, 40, 64, 500],
    "output_tokens": [5, 1, 20, 30, 2, 12],
})


def assert_same(a, b, what: str) -> None:
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    assert both_nan or a == b, f"{what}: {a!r} != {b!r}"


def assert_metrics_agree(summary: dict, m: dict, where: str) -> None:
    shared = [k for k in summary if k not in NOT_METRICS and k in m]
    assert {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "ttft_p99_s", "simulated_s",
            "preemptions", "norm_latency_mean_s"} <= set(shared)
    for k in shared:
        assert_same(summary[k], m[k], f"{where}: summary.json vs analysis.run_metrics, {k}")


def assert_matches_schema(df: pd.DataFrame, dtypes: dict[str, str], name: str) -> None:
    assert list(df.columns) == list(dtypes), f"{name}: columns or their order differ from the schema"
    for col, dtype in dtypes.items():
        if dtype == "str":
            assert pd.api.types.is_string_dtype(df[col]), f"{name}.{col}: {df[col].dtype}, schema says text"
        else:
            assert df[col].dtype == np.dtype(dtype), f"{name}.{col}: {df[col].dtype}, schema says {dtype}"


@pytest.mark.parametrize("policy", ["vllm", "orca-pow2"])
def test_written_run_directory_matches_the_schema(tmp_path, policy):
    replay(OFFSET_TRACE, tmp_path, policy=policy, overrides={"num_gpu_blocks": 100})
    assert_matches_schema(pd.read_parquet(tmp_path / schema.REQUESTS_FILE), schema.REQUEST_DTYPES, "requests")
    assert_matches_schema(pd.read_parquet(tmp_path / schema.STEPS_FILE), schema.STEP_DTYPES, "steps")
    extents = tmp_path / schema.FREE_EXTENTS_FILE
    assert extents.is_file() == (policy == "orca-pow2"), "free extents only for contiguous allocators"
    if extents.is_file():
        assert_matches_schema(pd.read_parquet(extents), schema.FREE_EXTENT_DTYPES, "free_extents")
    summary = json.loads((tmp_path / schema.SUMMARY_FILE).read_text())
    assert set(schema.SUMMARY_KEYS) <= set(summary) and summary["version"] == schema.RUN_FORMAT_VERSION
    assert load_run(tmp_path).summary == summary


def test_what_readers_require_is_written():
    assert set(schema.REQUEST_REQUIRED) <= set(schema.REQUEST_COLUMNS)
    assert set(schema.STEP_REQUIRED) <= set(schema.STEP_COLUMNS)
    assert set(schema.MEMORY_COLUMNS) <= set(schema.STEP_REQUIRED)
    assert set(schema.SLO_COLUMNS.values()) <= set(schema.REQUEST_REQUIRED)


def test_a_late_first_arrival_gives_the_same_run_and_metrics_on_every_path(tmp_path):
    """The same trace as a DataFrame, as a CSV path and as a `traces.read_trace` Trace: arrivals are
    rebased to start at 0 s on each, and summary.json and analysis.run_metrics agree everywhere."""
    csv = tmp_path / "trace.csv"
    OFFSET_TRACE.to_csv(csv, index=False)
    paths = {"dataframe": OFFSET_TRACE, "csv path": str(csv), "read_trace": traces.read_trace(csv)}
    runs = {}
    for name, trace in paths.items():
        replay(trace, tmp_path / name, overrides={"num_gpu_blocks": 100})
        runs[name] = load_run(tmp_path / name)
    expected_arrivals = (OFFSET_TRACE.arrival_s - 5.5).to_numpy()
    ref = runs["dataframe"]
    for name, run in runs.items():
        np.testing.assert_allclose(run.requests.arrival_s, expected_arrivals, atol=1e-12,
                                   err_msg=f"{name}: arrivals rebased to 0 s")
        pd.testing.assert_frame_equal(run.requests, ref.requests, check_exact=True, obj=f"{name} requests")
        pd.testing.assert_frame_equal(run.steps, ref.steps, check_exact=True, obj=f"{name} steps")
        m = run_metrics(run)
        assert_metrics_agree(run.summary, m, name)
        for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "simulated_s"):
            assert_same(run.summary[k], ref.summary[k], f"{name} vs dataframe: {k}")
        assert m["requests_per_s"] == pytest.approx(6 / run.summary["simulated_s"], rel=1e-12)


def test_throughput_is_over_the_serving_interval_from_the_first_arrival():
    """Records whose arrivals start at 5.5 s (a run directory not rebased): the 5.5 s before the first
    arrival are not serving time."""
    requests = pd.DataFrame({"arrival_s": [5.5, 6.0], "status": ["finished", "finished"],
                             "output_tokens": [4, 2], "n": [1, 2], "prompt_tokens": [10, 20],
                             "ttft_s": [1.0, 2.0]})
    steps = pd.DataFrame({"start_s": [5.5, 7.0], "duration_s": [1.5, 3.0]})
    assert metrics.simulated_s(steps) == 10.0
    assert metrics.serving_interval_s(requests, steps) == 4.5
    assert metrics.throughput(requests, steps) == {
        "requests_per_s": 2 / 4.5, "output_tokens_per_s": 8 / 4.5, "total_tokens_per_s": 38 / 4.5}
    assert metrics.goodput(requests, steps, {"ttft": 1.5})["goodput_requests_per_s"] == 1 / 4.5


def test_no_finished_request_gives_nan_statistics():
    requests = pd.DataFrame({"arrival_s": [0.0], "status": ["rejected"], "output_tokens": [4], "n": [1],
                             "prompt_tokens": [10**6], "ttft_s": [np.nan], "norm_latency_s": [np.nan]})
    steps = pd.DataFrame({"start_s": pd.Series([], dtype=float), "duration_s": pd.Series([], dtype=float)})
    assert math.isnan(metrics.throughput(requests, steps)["requests_per_s"]), "no time passed"
    stats = metrics.latency_stats(requests, ("ttft",))
    assert all(math.isnan(v) for v in stats.values()) and set(stats) == {
        "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "norm_latency_mean_s"}


workloads = st.integers(1, 20).flatmap(lambda k: st.tuples(
    st.floats(0, 100),
    st.lists(st.floats(0, 0.2), min_size=k, max_size=k),
    st.lists(st.integers(1, 200), min_size=k, max_size=k),
    st.lists(st.integers(1, 60), min_size=k, max_size=k),
    st.lists(st.sampled_from([1, 1, 2, 3]), min_size=k, max_size=k),
))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads, blocks=st.integers(6, 40), policy=st.sampled_from(["vllm", "vllm-chunked", "orca-pow2"]),
       slo=st.sampled_from([None, {"ttft": 0.5}, {"e2e": 2.0, "tpot": 0.05}]))
def test_summary_and_analysis_metrics_agree_on_random_runs(workload, blocks, policy, slo):
    offset, gaps, prompts, outputs, ns = workload
    trace = pd.DataFrame({"arrival_s": offset + np.cumsum(gaps), "prompt_tokens": prompts,
                          "output_tokens": outputs, "n": ns})
    res = Engine(build_config(policy, num_gpu_blocks=blocks, block_size=16, max_num_seqs=8), trace).run()
    run = Run(path=None, requests=res.requests, steps=res.steps, summary=res.summary)
    m = run_metrics(run, slo)
    assert_metrics_agree(res.summary, m, policy)
    assert m["requests"] == len(trace) and res.requests.arrival_s.min() == 0.0
    if slo:
        good = metrics.slo_met(res.requests, slo).sum()
        assert_same(m["goodput_requests_per_s"], metrics.per_second(good, m["simulated_s"]), "goodput")


@pytest.mark.parametrize("comm", [False, True])
def test_step_recorder_keeps_every_value_across_chunk_boundaries(monkeypatch, comm):
    """Steps and spans of steps that straddle the recorder's chunks, its row buffer and its joins of span arrays
    come out in order, each value in its column's dtype, as the plain rows given; t_comm_s only in
    a tensor-parallel run's frame."""
    from blocksim.records import steps as steps_mod

    monkeypatch.setattr(steps_mod, "SEGMENT_CHUNK_ROWS", 3)
    monkeypatch.setattr(steps_mod, "PENDING_ARRAYS", 2)
    monkeypatch.setattr(steps_mod, "ROW_BUFFER", 2)
    rec = steps_mod.StepRecorder(comm=comm)
    rng = np.random.default_rng(3)
    expected = []
    for _ in range(20):
        if rng.random() < 0.5:
            row = [float(rng.random()) if c in steps_mod.FLOAT_COLUMNS else int(rng.integers(0, 2**40))
                   for c in steps_mod.ROW_COLUMNS]
            rec.add(steps_mod.StepRow(*row))
            expected.append(row)
        else:
            k = int(rng.integers(1, 17))
            constant, varying, row = {}, {}, []
            for c in steps_mod.ROW_COLUMNS:
                is_float = c in steps_mod.FLOAT_COLUMNS
                if rng.random() < 0.5:
                    high = 2**40 if rng.random() < 0.5 else 100  # large and small (kept as int32) values
                    varying[c] = rng.random(k) if is_float else rng.integers(0, high, k)
                elif rng.random() < 0.8:
                    constant[c] = float(rng.random()) if is_float else int(rng.integers(0, 2**40))
                row.append(varying.get(c, constant.get(c, 0)))  # a column in neither dict is 0
            rec.add_many(k, constant, varying)
            expected += [[v[j].item() if isinstance(v, np.ndarray) else v for v in row] for j in range(k)]
    part = rec.to_frame(("t_swap_s", "step", "finished"))  # built on its own, before the whole frame
    frame = rec.to_frame()
    pd.testing.assert_frame_equal(part, frame[["step", "finished", "t_swap_s"]], check_exact=True)
    with pytest.raises(ValueError, match="no column"):
        rec.to_frame(("finish",))
    assert rec.num_steps == len(expected) == len(frame)
    assert list(frame.columns) == list(schema.STEP_COLUMNS_TP if comm else schema.STEP_COLUMNS)
    assert frame.dtypes.astype(str).to_dict() == (schema.STEP_DTYPES_TP if comm else schema.STEP_DTYPES)
    assert frame.step.tolist() == list(range(len(expected)))
    for j, c in enumerate(schema.ROW_COLUMNS):
        if c == schema.COMM_COLUMN and not comm:
            continue
        assert frame[c].tolist() == [row[j] for row in expected], c
    assert rec.to_frame() is frame
    with pytest.raises(RuntimeError, match="already closed"):
        rec.add_many(1, {c: 0 for c in schema.ROW_COLUMNS}, {})
    groups = [pd.DataFrame(g) for g in rec.row_groups(5)]
    assert [len(g) for g in groups[:-1]] == [5] * (len(groups) - 1) and 0 < len(groups[-1]) <= 5
    pd.testing.assert_frame_equal(pd.concat(groups, ignore_index=True), frame, check_exact=True)
    for c in schema.ROW_COLUMNS:
        if c not in steps_mod.FLOAT_COLUMNS:
            assert rec.column_sum(c) == int(frame[c].sum()), c
    assert rec.end_s() == frame.start_s.iloc[-1] + frame.duration_s.iloc[-1]


def test_step_recorder_builds_deferred_columns_in_order(monkeypatch):
    """Spans whose columns are deferred (built from a description when pending spans are joined,
    runs of two specs interleaved with plain spans and steps) give the rows of the same columns
    given as arrays; a column given both ways among pending spans is refused."""
    from blocksim.records import steps as steps_mod

    monkeypatch.setattr(steps_mod, "PENDING_ARRAYS", 3)

    def build(args, steps):  # column c of a span (base, slope): base + slope * j
        assert len(args) == len(steps)
        return {c: np.concatenate([np.arange(k, dtype=np.int64) * slope + base for (base, slope), k in zip(args, steps)])
                for c in ("mem_free", "waiting")}

    first = steps_mod.DeferredColumns(("mem_free", "waiting"), build)
    second = steps_mod.DeferredColumns(("mem_free", "waiting"), build)
    deferred, explicit = steps_mod.StepRecorder(), steps_mod.StepRecorder()
    rng = np.random.default_rng(5)
    for i in range(25):
        k = int(rng.integers(1, 9))
        if i % 6 == 5:  # a single step between spans
            row = steps_mod.StepRow(*[0.5 if c in steps_mod.FLOAT_COLUMNS else 7 for c in steps_mod.ROW_COLUMNS])
            deferred.add(row)
            explicit.add(row)
            continue
        base, slope = int(rng.integers(0, 2**40)), int(rng.integers(-5, 5))
        values = np.arange(k, dtype=np.int64) * slope + base
        starts = rng.random(k)
        deferred.add_many(k, {"running": i}, {"start_s": starts}, ((first, second)[i // 4 % 2], (base, slope)))
        explicit.add_many(k, {"running": i}, {"start_s": starts, "mem_free": values, "waiting": values})
    pd.testing.assert_frame_equal(deferred.to_frame(), explicit.to_frame(), check_exact=True)
    assert deferred.column_sum("mem_free") == explicit.column_sum("mem_free")

    mixed = steps_mod.StepRecorder()
    mixed.add_many(2, {}, {"mem_free": np.arange(2)})
    mixed.add_many(2, {}, {}, (first, (0, 1)))
    with pytest.raises(ValueError, match="both as arrays and as deferred"):
        mixed.close()


def test_step_recorder_without_steps_gives_empty_columns():
    """A run without steps: a frame of no rows in the schema's dtypes, zero totals, ending at 0 s."""
    from blocksim.records.steps import StepRecorder

    rec = StepRecorder()
    frame = rec.to_frame()
    assert len(frame) == 0 and frame.dtypes.astype(str).to_dict() == schema.STEP_DTYPES
    assert rec.column_sum("blocks_swapped_in") == 0 and rec.end_s() == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=30),
       st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(math.nan)), min_size=1, max_size=40))
def test_summary_counts_and_means_of_request_columns_are_those_of_pandas(reasons, values):
    """The summary reads request columns, not a frame: reject reasons by frequency (ties in order of
    first occurrence) and means over the values that are not NaN, bit for bit as pandas takes them."""
    from blocksim.records.result import _by_frequency

    assert list(_by_frequency(np.array(reasons, dtype=object)).items()) == \
        list(pd.Series(reasons, dtype=object).value_counts().items())
    want = pd.Series(values, dtype=np.float64).mean()
    assert_same(metrics._mean(np.array(values)), float(want), "mean")


def test_requests_parquet_written_from_columns_reads_back_as_the_frame(tmp_path):
    cfg = build_config("vllm", num_gpu_blocks=64)
    result = Engine(cfg, traces.head(traces.read_trace(traces.bundled("azure-conv")), 60)).run()
    result.save(tmp_path)
    frame = result.requests  # built from the columns now
    back = pd.read_parquet(tmp_path / schema.REQUESTS_FILE)
    pd.testing.assert_frame_equal(back, frame)
    assert (frame.status == "rejected").any() or (frame.status == "finished").all()


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=7, max_size=7), st.integers(0, 5),
                                st.integers(1, 4)), max_size=30))
def test_tier_step_recorder_gives_each_steps_moves_as_a_row_per_step(calls):
    """`add(totals, onloading, steps)`: `steps - 1` steps that move nothing, then one ending with
    `totals`; the frame holds each step's differences, equal totals kept as runs or not."""
    from blocksim.records.tier_records import TierStepRecorder

    rec = TierStepRecorder()
    want_totals, want_onloading = [], []
    total = [0] * 7
    for moves, onloading, steps in calls:
        last = list(total)
        total = [t + m for t, m in zip(total, moves)]  # cumulative, as the tier store's counters
        want_totals += [last] * (steps - 1) + [total]
        want_onloading += [onloading] * steps
        rec.add(tuple(total), onloading, steps)
    frame = rec.to_frame()
    assert list(frame.columns) == list(schema.TIER_STEP_COLUMNS)
    assert dict(frame.dtypes.astype(str)) == schema.TIER_STEP_DTYPES
    tot = np.array(want_totals, np.int64).reshape(-1, 7)
    per = np.diff(tot, axis=0, prepend=np.zeros((1, 7), np.int64))
    assert frame.step.tolist() == list(range(len(want_totals)))
    assert frame.iloc[:, 1:8].to_numpy().tolist() == per.tolist()
    assert frame.onloading.tolist() == want_onloading


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(0, 1e6), st.just(math.nan)), min_size=1, max_size=300))
def test_nan_skipping_mean_is_pandas_series_mean(values):
    """The summary's tier onload wait mean, taken without a frame, is the float pandas' `Series.mean`
    gives (NaNs skipped, the same sum), NaN where every value is NaN."""
    from blocksim.records.tier_records import nan_skipping_mean

    got, want = nan_skipping_mean(np.array(values, np.float64)), float(pd.Series(values, dtype="float64").mean())
    assert got == want or (math.isnan(got) and math.isnan(want)), f"{got!r} != pandas' {want!r}"


def test_tier_tables_built_on_first_use_equal_the_saved_and_eager_ones(tmp_path):
    """A run with tiers keeps its tier tables as columns and records until they are read: the frames
    then built are those the request columns and `TierStepRecorder.to_frame` give at once, and
    those saved."""
    from blocksim.records.tier_records import tier_columns_frame, tier_request_columns

    cfg = build_config("vllm-v1", tier_host_gib=0.05, tier_disk_gib=0.2)
    engine = Engine(cfg, traces.head(traces.read_trace(traces.bundled("mooncake")), 80))
    result = engine.run()
    eager_req = tier_columns_frame(tier_request_columns(engine.groups, True))
    eager_steps = engine.tier_rec.to_frame()
    result.save(tmp_path)
    pd.testing.assert_frame_equal(result.tier_requests, eager_req)
    pd.testing.assert_frame_equal(result.tier_steps, eager_steps)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / schema.TIER_REQUESTS_FILE), eager_req)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / schema.TIER_STEPS_FILE), eager_steps)
    assert result.summary["tier_onload_wait_mean_s"] == float(eager_req.onload_wait_s.mean())
