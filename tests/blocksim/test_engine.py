"""End-to-end replays: nothing lost, blocks conserved after every step, spans equal to single steps."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocksim.engine import Engine, EngineError
from blocksim.experiments.runner import build_config


def workload(draw_lists):
    arrivals, prompts, outputs, ns = draw_lists
    return pd.DataFrame({"arrival_s": np.cumsum(arrivals), "prompt_tokens": prompts,
                         "output_tokens": outputs, "n": ns})


requests = st.integers(1, 25).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=k, max_size=k),
    st.lists(st.integers(1, 120), min_size=k, max_size=k),
    st.lists(st.integers(1, 80), min_size=k, max_size=k),
    st.lists(st.sampled_from([1, 1, 1, 2, 3]), min_size=k, max_size=k),
))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, blocks=st.integers(6, 60), block_size=st.sampled_from([1, 4, 16]),
       mode=st.sampled_from(["auto", "recompute", "swap"]), watermark=st.sampled_from([0.0, 0.05]),
       cpu_gib=st.sampled_from([0.0, 1.0]))
def test_every_request_finishes_or_is_rejected_and_blocks_are_conserved(lists, blocks, block_size, mode,
                                                                         watermark, cpu_gib):
    trace = workload(lists)
    cfg = build_config(model="llama-2-7b", gpu="h100-80gb", num_gpu_blocks=blocks, block_size=block_size,
                       preemption=mode, watermark=watermark, swap_space_gib=cpu_gib, max_num_seqs=8)
    res = Engine(cfg, trace, check_invariants=True).run()  # checks ref counts and free lists every step
    r = res.requests
    assert len(r) == len(trace)
    assert set(r.status) <= {"finished", "rejected"}
    assert (r.reject_reason[r.status == "rejected"] != "").all()
    done = r[r.status == "finished"]
    assert (done.finish_s >= done.first_token_s).all() and (done.first_token_s > done.arrival_s).all()
    steps = res.steps
    mem = steps[["mem_token_states", "mem_reservation", "mem_internal_frag", "mem_external_frag", "mem_free"]]
    assert (mem.sum(axis=1) == blocks * block_size).all(), "the five memory categories sum to capacity"
    assert (steps.gpu_blocks_used <= blocks).all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, blocks=st.integers(8, 80), block_size=st.sampled_from([2, 8, 16]),
       preset=st.sampled_from(["vllm", "vllm-prefix", "vllm-chunked", "vllm-0.6", "orca-pow2", "static", "priority",
                               "sjf", "vllm-v1", "v1-priority"]),
       priorities=st.lists(st.integers(0, 2), min_size=25, max_size=25))
def test_spans_give_exactly_the_single_step_result(lists, blocks, block_size, preset, priorities):
    trace = workload(lists)
    trace["priority"] = priorities[: len(trace)]
    knobs = {"scheduler": preset} if preset in ("priority", "sjf", "v1-priority") else {}
    if preset not in ("orca-pow2", "static", "vllm-v1", "v1-priority"):  # no watermark there
        knobs["watermark"] = 0.0
    base = "vllm-v1" if preset == "v1-priority" else "vllm" if "scheduler" in knobs else preset
    cfg = build_config(base, num_gpu_blocks=blocks, block_size=block_size, max_num_seqs=8, **knobs)
    a = Engine(cfg, trace, spans=True).run()
    b = Engine(cfg, trace, spans=False).run()
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)


KV_BYTES_PER_TOKEN = 2 * 32 * 32 * 128 * 2  # llama-2-7b


@st.composite
def engine_options(draw):
    """A preset and the options that combine with it: schedulers, preemption, block sizes,
    chunked-prefill budgets, and KV tiers for the prefix-caching presets."""
    preset = draw(st.sampled_from(["vllm", "vllm-prefix", "vllm-chunked", "vllm-0.6", "vllm-v1", "orca-max",
                                   "orca-pow2", "orca-oracle", "static", "sglang"]))
    kw = {}
    unit = draw(st.sampled_from([1, 4, 8, 16, 32]))
    if preset == "sglang":
        unit = kw["page_size"] = draw(st.sampled_from([1, 4, 16]))
        kw.update(num_gpu_blocks=draw(st.integers(100, 1500)), max_running_requests=draw(st.integers(1, 8)),
                  schedule_policy=draw(st.sampled_from(["fcfs", "lpm", "dfs-weight", "lof", "random"])),
                  chunked_prefill_size=draw(st.sampled_from([-1, 64, 256])))
    else:
        kw.update(block_size=unit, num_gpu_blocks=draw(st.integers(4, 80)), max_num_seqs=draw(st.integers(1, 8)))
    if preset.startswith("vllm") and preset != "vllm-v1":
        kw.update(preemption=draw(st.sampled_from(["auto", "recompute", "swap"])),
                  swap_space_gib=draw(st.sampled_from([0.0, 0.01, 1.0])), watermark=draw(st.sampled_from([0.0, 0.1])),
                  victim=draw(st.sampled_from(["newest", "largest", "fewest-blocks"])),
                  v0_release=draw(st.sampled_from(["0.1", "0.2", "0.4", "0.6.4"])))
        if draw(st.booleans()):
            kw["scheduler"] = draw(st.sampled_from(["fcfs", "priority", "sjf"]))
    if preset == "vllm-v1":
        kw.update(scheduler=draw(st.sampled_from(["v1", "v1-priority"])),
                  max_num_batched_tokens=draw(st.sampled_from([8, 32, 128, 2048])),
                  long_prefill_token_threshold=draw(st.sampled_from([0, 24])))
    if preset == "vllm-chunked":
        kw["max_num_batched_tokens"] = draw(st.sampled_from([16, 64, 512]))
    if preset in ("vllm-prefix", "vllm-v1", "sglang") and draw(st.booleans()):
        chunk = unit * draw(st.sampled_from([1, 2, 4]))
        per_chunk = chunk * KV_BYTES_PER_TOKEN / 2**30
        kw.update(tier_host_gib=per_chunk * draw(st.integers(1, 30)),
                  tier_disk_gib=per_chunk * draw(st.sampled_from([0, 3, 40])), tier_chunk_tokens=chunk, tier_host_eviction=draw(st.sampled_from(["lru", "lfu", "arc"])),
                  tier_disk_eviction=draw(st.sampled_from(["lru", "lfu", "arc"])),
                  tier_host_write=draw(st.sampled_from(["write-through", "write-through-selective", "write-back"])),
                  tier_disk_write=draw(st.sampled_from(["write-through", "write-through-selective", "write-back"])),
                  tier_onload=draw(st.sampled_from(["wait", "deadline", "recompute"])),
                  tier_write_hits=draw(st.integers(1, 3)))
    return preset, kw


families = st.integers(1, 18).flatmap(lambda k: st.tuples(*(st.lists(x, min_size=k, max_size=k) for x in (
    st.floats(0, 0.05), st.integers(1, 150), st.integers(1, 60), st.integers(0, 3), st.sampled_from([1, 1, 1, 2, 3]),
    st.integers(0, 2)))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(options=engine_options(), lists=families)
def test_any_preset_with_any_options_keeps_its_invariants_and_spans_equal_single_steps(options, lists):
    """Presets crossed with the options that combine with them (a configuration the options refuse
    is skipped): blocks conserved after every step, every request finished or rejected, spans giving
    the records of stepping one by one, and with KV tiers the tiers' whole-list paths the records of
    their one-chunk-at-a-time paths (tier tables included)."""
    import traces
    from hypothesis import assume

    from blocksim.config import ConfigError
    arrivals, prompts, outputs, fams, ns, priorities = lists
    a = np.cumsum(arrivals)
    df = pd.DataFrame({"arrival_s": a - a[0], "prompt_tokens": prompts, "output_tokens": outputs, "n": ns,
                       "priority": priorities,
                       "prefix_hashes": [[f * 1000 + j for j in range(-(-p // 16))] for p, f in zip(prompts, fams)]})
    tr = traces.Trace(df, hash_block_tokens=16)
    preset, kw = options
    try:
        cfg = build_config(preset, **kw)
        engine = Engine(cfg, tr, check_invariants=True)
    except ConfigError:
        assume(False)
    res = engine.run()
    assert len(res.requests) == len(df) and set(res.requests.status) <= {"finished", "rejected"}
    runs = [Engine(cfg, tr, spans=False)]
    if cfg.tiers is not None:
        runs.append(Engine(cfg, tr))
        runs[-1].tiers.batched = False
    for other in runs:
        again = other.run()
        for name in ("steps", "requests", "tier_steps", "tier_requests"):
            x, y = getattr(res, name, None), getattr(again, name, None)
            if x is not None or y is not None:
                pd.testing.assert_frame_equal(x, y, check_exact=True)


def test_a_bundled_trace_replays_with_spans_identical_to_single_steps():
    import traces
    tr = traces.head(traces.read_trace(traces.bundled("azure-conv")), 300)
    cfg = build_config(model="llama-2-7b", gpu="a100-40gb")  # tight memory: preemptions happen
    a = Engine(cfg, tr).run()
    b = Engine(cfg, tr, spans=False).run()
    assert len(a.steps) == len(b.steps)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    assert a.summary["finished"] + a.summary["rejected"] == 300


@pytest.mark.parametrize("policy", ["vllm", "vllm-v1", "sglang", "orca-pow2"])
def test_a_run_pauses_the_cycle_collector_and_leaves_no_cycles(policy):
    """The step loop runs without the cyclic garbage collector because it leaves no garbage cycles
    behind (a run then collected finds none), and the collector's state is restored either way."""
    import gc

    import traces
    tr = traces.head(traces.read_trace(traces.bundled("azure-conv")), 200)
    cfg = build_config(policy, model="llama-2-7b", gpu="a100-40gb")
    gc.collect()
    was = gc.isenabled()
    try:
        gc.disable()
        engine = Engine(cfg, tr)
        result = engine.run()
        assert not gc.isenabled(), "a disabled collector stays disabled"
        assert gc.collect() == 0, "the run left garbage cycles (its requests' own cycles live as long as the engine)"
        gc.enable()
        Engine(cfg, tr).run()
        assert gc.isenabled(), "an enabled collector is enabled again after the run"
    finally:
        (gc.enable if was else gc.disable)()
    assert result.summary["finished"] + result.summary["rejected"] == 200


SMALL_TIERS = {"tier_host_gib": 1.0, "tier_disk_gib": 4.0}


@pytest.mark.parametrize("policy, options", [
    ("vllm", {}), ("vllm-prefix", {}), ("vllm-v1", {}), ("sglang", {}), ("orca-pow2", {}),
    ("vllm-v1", {**SMALL_TIERS, "tier_host_write": "write-back"}),
    ("vllm-prefix", {**SMALL_TIERS, "tier_host_write": "write-back"}),
    ("sglang", SMALL_TIERS)])
@pytest.mark.parametrize("plan", [False, True])
def test_a_dropped_engine_is_freed_without_the_cycle_collector(policy, options, plan, tmp_path):
    """Once the caller drops a finished engine and its result, reference counting frees the run
    (engine, scheduler, manager, tier store, radix tree): the cyclic garbage collector, off
    throughout, is not needed, and a collection afterwards finds none of blocksim's objects (the
    requests, sequences and radix nodes, whose slots take no weak references, among them)."""
    import gc
    import weakref

    import traces
    cfg = build_config(policy, model="llama-2-7b", gpu="a100-40gb", **options)
    tr, _ = traces.clip_to_max_len(traces.head(traces.read_trace(traces.bundled("mooncake")), 300),
                                   cfg.model.max_model_len)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        engine = Engine(cfg, tr, plan_dir=tmp_path / "plan" if plan else None)
        result = engine.run()
        assert result.summary["finished"] + result.summary["rejected"] == 300
        objects = {"engine": engine, "memory manager": engine.bm, "scheduler": engine.sched}
        if engine.tiers is not None:
            objects["tier store"] = engine.tiers
        if hasattr(engine.bm, "tree"):
            assert engine.bm.tree.root.children, "the run left prefixes in the radix tree"
            objects["radix tree"] = engine.bm.tree
        refs = {name: weakref.ref(o) for name, o in objects.items()}
        del engine, result, objects
        alive = [name for name, r in refs.items() if r() is not None]
        assert not alive, f"{alive} outlive the engine (held by reference cycles)"
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("blocksim")}
        assert not cyclic, f"the run left blocksim objects in reference cycles: {sorted(cyclic)}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        (gc.enable if was else gc.disable)()


def test_bad_trace_rows_are_named():
    cfg = build_config()
    bad = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [10, 0], "output_tokens": [5, 5]})
    with pytest.raises(EngineError, match=r"row 2 \(request_id 1\): prompt_tokens=0"):
        Engine(cfg, bad)
    with pytest.raises(EngineError, match="lacks column"):
        Engine(cfg, pd.DataFrame({"arrival_s": [0.0]}))


def test_run_directory_has_the_documented_files(tmp_path):
    from blocksim.records.steps import STEP_COLUMNS
    from blocksim.experiments.runner import replay
    trace = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [100, 200, 300],
                          "output_tokens": [5, 1, 20]})
    path = tmp_path / "t.csv"
    trace.to_csv(path, index=False)
    summary = replay(str(path), tmp_path / "run", overrides={"num_gpu_blocks": 100})
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    reqs = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert summary["finished"] == 3 and (reqs.status == "finished").all()
    assert np.isnan(reqs.tpot_s.iloc[1]), "TPOT is undefined for a one-token output"
    assert reqs.ttft_s.iloc[0] == pytest.approx(steps.start_s.iloc[0] + steps.duration_s.iloc[0])


def test_clip_to_model_clips_instead_of_rejecting(tmp_path, capsys):
    from blocksim.experiments.runner import replay
    trace = pd.DataFrame({"arrival_s": [0.0, 0.1], "prompt_tokens": [5000, 100], "output_tokens": [50, 10]})
    path = tmp_path / "long.csv"
    trace.to_csv(path, index=False)
    rejected = replay(str(path), tmp_path / "a", overrides={"num_gpu_blocks": 1000})
    assert rejected["rejected"] == 1 and "clip" in next(iter(rejected["reject_reasons"]))
    clipped = replay(str(path), tmp_path / "b", overrides={"num_gpu_blocks": 1000}, clip_to_model=True)
    assert clipped["rejected"] == 0 and clipped["finished"] == 2
    assert "clipped 1 of 2 requests" in capsys.readouterr().out


@pytest.mark.parametrize("policy", ["vllm-prefix", "vllm-v1"])
def test_a_block_size_that_does_not_fit_the_trace_hash_granularity_is_refused_naming_both(policy):
    from blocksim.config import ConfigError

    class Hashed:
        df = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [96], "output_tokens": [4],
                           "prefix_hashes": [[1, 2]]})
        hash_block_tokens = 48

    with pytest.raises(ConfigError) as e:
        Engine(build_config(policy, block_size=32, num_gpu_blocks=64), Hashed())
    message = str(e.value)
    assert "block_size (--block-size) 32" in message and "48 tokens" in message and "\n" not in message


@settings(max_examples=300, deadline=None)
@given(now=st.floats(0, 1e7), steps=st.lists(st.floats(1e-6, 0.5), min_size=1, max_size=50))
def test_a_span_delay_lands_exactly_where_its_steps_add_up(now, steps):
    """One timeout over a span, when `exact_delay` finds one, reaches the clock value that adding
    each step's duration reaches (else the span takes one timeout per step)."""
    from blocksim.engine.spans import exact_delay

    end = now
    for d in steps:
        end += d
    delay = exact_delay(now, end)
    assert delay is None or (delay >= 0 and now + delay == end)


def test_spans_of_a_replay_hour_need_one_timeout():
    """Clock values of an hour-long replay and steps of 10-30 ms: one delay always lands exactly."""
    from blocksim.engine.spans import exact_delay

    rng = np.random.default_rng(0)
    for _ in range(2000):
        now = end = float(rng.random() * 3600)
        for d in (0.01 + 0.02 * rng.random(int(rng.integers(1, 40)))).tolist():
            end += d
        delay = exact_delay(now, end)
        assert delay is not None and now + delay == end


def test_an_idle_engine_is_woken_by_an_arrival_its_clock_could_land_an_ulp_short_of():
    """cumsum arrivals rebased to the first one: the last arrival is a time that now + (t - now)
    misses by an ulp; the request must still arrive (hypothesis found this case)."""
    arrivals = np.cumsum([0.001984754281357171, 0.003661842864599153, 0.007880608166168514, 0.03125])
    df = pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": [1] * 4, "output_tokens": [1] * 4})
    cfg = build_config("vllm-v1", num_gpu_blocks=10, block_size=2, max_num_seqs=6, max_num_batched_tokens=8,
                       prefix_caching=False)
    res = Engine(cfg, df, check_invariants=True, spans=False).run()
    assert (res.requests.status == "finished").all() and len(res.requests) == 4
