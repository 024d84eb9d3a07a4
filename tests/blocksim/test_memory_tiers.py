"""KV tiers below the GPU (blocksim/memory/tiers.py, eviction.py) under vllm-v1: eviction policies,
write policies, onload modes, records, and hit counts equal to an independent recount."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces
from blocksim.config import ConfigError
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.memory.eviction import ARC, LFU, LRU
from blocksim.records.schema import TIER_REQUEST_COLUMNS, TIER_STEP_COLUMNS
from tests.blocksim.tier_recount import POLICIES, Recount
from tests.blocksim.workloads import family_trace

H = 16  # tokens per prefix hash = the block size
KV_BYTES = 2 * 32 * 32 * 128 * 2  # llama-2-7b, bytes of K/V per token
GIB = 1024**3


def workload(arrivals, prompts, outputs, families):
    """Prompts sharing hash blocks within a family (family f, block j -> hash f * 1000 + j)."""
    return family_trace(arrivals, prompts, outputs, families, hash_tokens=H, family_stride=1000)


def chunks_gib(n, chunk_tokens=H):
    return n * chunk_tokens * KV_BYTES / GIB


def run(tr, policy="vllm-v1", **tier_options):
    cfg = tier_config(policy, tier_options.pop("gpu_blocks", 40), **tier_options)
    e = Engine(cfg, tr, check_invariants=True, log_tier_events=True)
    return e, e.run()


def tier_config(policy, gpu_blocks, block_size=H, **tier_options):
    """The tier tests' engine: `gpu_blocks` blocks of `H` tokens' worth of GPU memory, four
    requests at a time, 256 tokens a step."""
    if policy == "sglang":  # a token-granular pool, SGLang's own knobs
        return build_config(policy, num_gpu_blocks=gpu_blocks * H, max_running_requests=4, chunked_prefill_size=256,
                            **tier_options)
    return build_config(policy, block_size=block_size, num_gpu_blocks=gpu_blocks * H // block_size, max_num_seqs=4,
                        max_num_batched_tokens=256, **tier_options)


def recount_of(engine) -> Recount:
    t = engine.tiers
    levels = [(lv.name, lv.capacity, getattr(t.config, f"{lv.name}_eviction"), lv.write) for lv in t.levels]
    return Recount(levels, t.write_hits).replay(engine.tiers.log)


def assert_recount_matches(engine, summary):
    rc = recount_of(engine)
    for i, name in enumerate(rc.names):
        assert summary[f"tier_{name}_hit_chunks"] == rc.hits[i], f"{name} hits: run vs recount"
        assert summary[f"tier_{name}_stored_chunks"] == rc.stores[i], f"{name} stores: run vs recount"
        assert summary[f"tier_{name}_evictions"] == rc.evictions[i], f"{name} evictions: run vs recount"
        assert sorted(engine.tiers.levels[i].cache.keys()) == sorted(rc.caches[i].held()), f"{name} contents"
    return rc


# --- eviction policies against the list implementations -------------------------------------
@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["lru", "lfu", "arc"]), capacity=st.integers(1, 6),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=120))
def test_each_eviction_policy_evicts_what_the_list_version_evicts(name, capacity, ops):
    fast = {"lru": LRU, "lfu": LFU, "arc": ARC}[name](capacity)
    slow = POLICIES[name](capacity)
    for hit, key in ops:
        if hit and key in fast:
            assert slow.has(key)
            fast.touch(key)
            slow.hit(key)
        elif not hit and key not in fast:
            victims = fast.insert(key, -key)
            assert [k for k, _ in victims] == slow.put(key), "same victims in the same order"
            assert all(v == -k for k, v in victims), "each victim with the value stored with it"
        assert all(fast.members[k] == -k for k in fast.keys())
        assert sorted(fast.keys()) == sorted(slow.held()) and len(fast) <= capacity


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 8), log_limit=st.integers(1, 12),
       ops=st.lists(st.tuples(st.sampled_from(["insert", "touch", "touch many", "order"]), st.integers(0, 12)),
                    max_size=150))
def test_an_lru_logging_its_order_keeps_the_order_of_moving_each_key(capacity, log_limit, ops):
    """An LRU below capacity logs its touches (one at a time or a batch) and replays them when it
    evicts, when its order is asked for or when the log outgrows its limit: its victims and its
    order are always those of the list version, which moves each key at each event."""
    fast, slow = LRU(capacity), POLICIES["lru"](capacity)
    fast._log_limit = log_limit
    for op, key in ops:
        if op == "insert" and key not in fast:
            assert [k for k, _ in fast.insert(key, -key)] == slow.put(key)
        elif op == "touch" and key in fast:
            fast.touch(key)
            slow.hit(key)
        elif op == "touch many":
            held = [k for k in (key, key + 1, key + 2) if k in fast]
            if fast.log is None:
                for k in held:
                    fast.touch(k)
            else:
                fast.logged(held)
            for k in held:
                slow.hit(k)
        elif op == "order":
            assert fast.keys() == slow.held()
    assert fast.keys() == slow.held(), "the same recency order"
    assert all(fast.members[k] == -k for k in fast.keys()) and len(fast) <= capacity


def test_lru_lfu_and_arc_differ_on_a_scan_after_a_hot_key():
    """A hot key hit often, then a scan of new keys: LRU drops it, LFU and ARC keep it."""
    for cls, keeps in ((LRU, False), (LFU, True), (ARC, True)):
        c = cls(3)
        c.insert(1)
        c.touch(1)
        c.touch(1)
        for k in range(10, 16):
            c.insert(k)
        assert (1 in c) is keeps, cls.__name__


# --- end to end ----------------------------------------------------------------------------
def repeated_prefixes(n=24, prompt=160, families=3, gap_s=0.05):
    return workload([gap_s] * n, [prompt] * n, [4] * n, [i % families for i in range(n)])


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-prefix", "sglang"])
def test_a_host_tier_serves_prefixes_the_gpu_evicted_and_cuts_prefill(policy):
    tr = repeated_prefixes(n=30, families=5)
    _, base = run(tr, policy, gpu_blocks=30)  # no tier
    chunk = 64 if policy == "sglang" else H
    e, res = run(tr, policy, gpu_blocks=30, tier_host_gib=chunks_gib(200, chunk))
    s = res.summary
    assert s["tier_host_hit_tokens"] > 0, "30 GPU blocks cannot keep five 10-block prefixes; the host can"
    assert res.steps.prefill_tokens.sum() < base.steps.prefill_tokens.sum(), "host hits are not prefilled"
    assert s["tier_bytes_host_to_gpu"] == s["tier_host_hit_tokens"] * KV_BYTES
    assert s["tier_bytes_gpu_to_host"] == s["tier_host_stored_chunks"] * chunk * KV_BYTES
    assert_recount_matches(e, s)


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-prefix"])
def test_records_hold_the_tier_columns_and_add_up(policy):
    tr = repeated_prefixes(n=30, families=5)
    e, res = run(tr, policy, gpu_blocks=30, tier_host_gib=chunks_gib(200))
    tr_req, tr_steps = res.tier_requests, res.tier_steps
    assert tuple(tr_req.columns) == TIER_REQUEST_COLUMNS and tuple(tr_steps.columns) == TIER_STEP_COLUMNS
    assert len(tr_steps) == len(res.steps) and len(tr_req) == len(res.requests)
    assert tr_steps.bytes_host_to_gpu.sum() == res.summary["tier_bytes_host_to_gpu"]
    assert tr_steps.bytes_gpu_to_host.sum() == res.summary["tier_bytes_gpu_to_host"]
    assert tr_req.host_hit_tokens.sum() == res.summary["tier_host_hit_tokens"]
    ttft = res.requests.ttft_s.to_numpy()
    parts = (tr_req.ttft_queue_s + tr_req.ttft_onload_s + tr_req.ttft_prefill_s).to_numpy()
    assert np.allclose(parts, ttft), "TTFT = queueing + onload wait + prefill"
    assert (tr_req.onload_wait_s >= 0).all() and (tr_req.ttft_onload_s >= 0).all()
    if policy == "vllm-v1":  # waits for its loads before it is scheduled; vllm-prefix loads inside the
        assert (tr_req.ttft_onload_s > 0).any()  # step, overlapped with its compute (no wait here)


def test_runs_without_tiers_write_no_tier_records():
    tr = repeated_prefixes()
    res = Engine(build_config("vllm-v1", num_gpu_blocks=30), tr).run()
    assert res.tier_requests is None and not any(k.startswith("tier_") for k in res.summary)


@pytest.mark.parametrize("policy", ["vllm-v1", "sglang"])
def test_write_back_stores_only_what_the_gpu_evicts(policy):
    tr = repeated_prefixes()
    chunk = 64 if policy == "sglang" else H
    e, res = run(tr, policy, gpu_blocks=30, tier_host_gib=chunks_gib(200, chunk), tier_host_write="write-back")
    s = res.summary
    evicted = s["prefix_cache_evictions"] if policy == "vllm-v1" else e.bm.tree.evicted_tokens // chunk
    assert 0 < s["tier_host_stored_chunks"] <= evicted, "no more chunks than left the GPU"
    assert s["tier_host_hit_tokens"] > 0
    assert_recount_matches(e, s)



def test_disk_under_host_by_write_back_catches_host_evictions():
    tr = repeated_prefixes(n=30, families=5)
    e, res = run(tr, gpu_blocks=30, tier_host_gib=chunks_gib(12), tier_disk_gib=chunks_gib(200))
    s = res.summary
    assert s["tier_host_evictions"] > 0 and s["tier_disk_stored_chunks"] == s["tier_host_evictions"]
    assert s["tier_disk_hit_tokens"] > 0 and s["tier_bytes_disk_to_gpu"] == s["tier_disk_hit_tokens"] * KV_BYTES
    assert_recount_matches(e, s)


def test_recompute_mode_never_loads_what_prefilling_beats():
    """A disk 1000x too slow: the recompute mode recomputes every chunk it finds; wait mode loads them."""
    tr = repeated_prefixes()
    slow = dict(gpu_blocks=30, tier_disk_gib=chunks_gib(200), tier_disk_read_gbps=0.005, tier_disk_write="write-through")
    _, waited = run(tr, **slow)
    e, rec = run(tr, **slow, tier_onload="recompute")
    assert waited.summary["tier_disk_hit_tokens"] > 0
    assert rec.summary["tier_disk_hit_tokens"] == 0 and rec.summary["tier_onload_skipped_tokens"] > 0
    assert rec.summary["ttft_mean_s"] < waited.summary["ttft_mean_s"]
    assert_recount_matches(e, rec.summary)


def test_deadline_mode_waits_at_most_the_deadline():
    tr = repeated_prefixes()
    e, res = run(tr, gpu_blocks=30, tier_disk_gib=chunks_gib(200), tier_disk_read_gbps=0.5,
                 tier_disk_write="write-through", tier_onload="deadline", tier_onload_deadline_ms=5.0)
    w = res.tier_requests.onload_wait_s
    assert w.max() <= 5e-3 + 1e-9 and res.summary["tier_onload_skipped_tokens"] > 0
    assert_recount_matches(e, res.summary)


def test_chunks_of_several_blocks_load_whole():
    tr = repeated_prefixes()
    e, res = run(tr, gpu_blocks=30, tier_host_gib=chunks_gib(50, 64), tier_chunk_tokens=64)
    s = res.summary
    assert s["tier_host_hit_tokens"] > 0 and s["tier_host_hit_tokens"] % 64 == 0
    assert_recount_matches(e, s)


def test_the_plan_records_tier_ops(tmp_path):
    from blocksim.records.plan import read_plan
    tr = repeated_prefixes()
    cfg = build_config("vllm-v1", num_gpu_blocks=30, max_num_seqs=4, max_num_batched_tokens=256,
                       tier_host_gib=chunks_gib(12), tier_disk_gib=chunks_gib(200))
    res = Engine(cfg, tr, plan_dir=tmp_path).run()
    ops = pd.read_parquet(tmp_path / "plan" / "tier_ops.parquet")
    meta = read_plan(tmp_path)[0]
    assert meta["tier_chunk_tokens"] == H
    assert list(ops.columns) == ["step", "op", "src", "dst", "key", "gpu_blocks", "evict"]
    loads = ops[ops.op == "load"]
    assert (loads.dst == "gpu").all() and loads.gpu_blocks.map(len).eq(1).all()
    assert len(loads) * H == res.summary["tier_host_hit_tokens"] + res.summary["tier_disk_hit_tokens"]
    stores = ops[(ops.op == "store") & ~ops.evict]
    assert (stores[stores.src == "host"].gpu_blocks.map(len) == 0).all()
    assert ops.evict.sum() == res.summary["tier_host_evictions"] + res.summary.get("tier_disk_evictions", 0)
    assert ops.step.is_monotonic_increasing or (ops.step.diff().fillna(0) >= -1).all()
    # every load reads a key its tier holds: replay the table's stores and drops
    held = {"host": set(), "disk": set()}
    for r in ops.itertuples():
        if r.evict:
            held[r.src].remove(r.key)
        elif r.op == "store":
            held[r.dst].add(r.key)
        else:
            assert r.key in held[r.src], f"load of {r.key} from {r.src} which does not hold it"


def assert_same_links(a, b):
    """Engines `a` and `b`: their tiers' links end equally free and busy, having moved the same bytes."""
    for link in ("h2d", "d2h", "disk_read", "disk_write"):
        x, y = getattr(a.tiers, link), getattr(b.tiers, link)
        assert (x.free_s, x.busy_s, x.bytes) == (y.free_s, y.busy_s, y.bytes), link


def assert_same_tier_runs(a, ra, b, rb):
    """Engines `a` and `b` and their results: the same summary (but wall time), the same request,
    step and tier records exactly, and the same contents of every tier in the same order."""
    pd.testing.assert_series_equal(pd.Series(ra.summary).drop("wall_s"), pd.Series(rb.summary).drop("wall_s"))
    for name in ("requests", "steps", "tier_requests", "tier_steps"):
        pd.testing.assert_frame_equal(getattr(ra, name), getattr(rb, name), check_exact=True)
    for la, lb in zip(a.tiers.levels, b.tiers.levels):
        order = la.cache.keys()
        assert order == lb.cache.keys(), f"{la.name}: contents and order"
        assert [la.cache.members[k] for k in order] == [lb.cache.members[k] for k in order], f"{la.name}: landing times"


# --- properties ------------------------------------------------------------------------------
def request_lists(count, prompt, output, prefix):
    """`workload`'s arguments: `count` requests (arrival gaps, prompt and output tokens, prefix
    family), each list drawn from its own strategy."""
    return count.flatmap(lambda k: st.tuples(*(st.lists(x, min_size=k, max_size=k) for x in (
        st.floats(0, 0.05), prompt, output, prefix))))


requests = request_lists(st.integers(2, 30), st.integers(1, 200), st.integers(1, 30), st.integers(0, 4))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "vllm-prefix", "vllm-prefix-chunked", "sglang"]), reqs=requests, gpu_blocks=st.integers(20, 60), host=st.integers(0, 30), disk=st.integers(0, 60),
       evictions=st.tuples(st.sampled_from(["lru", "lfu", "arc"]), st.sampled_from(["lru", "lfu", "arc"])),
       writes=st.tuples(st.sampled_from(["write-through", "write-through-selective", "write-back"]),
                        st.sampled_from(["write-through", "write-through-selective", "write-back"])),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), chunk=st.sampled_from([16, 32]),
       write_hits=st.integers(1, 3))
def test_tiers_conserve_blocks_respect_capacity_lose_nothing_and_match_the_recount(
        policy, reqs, gpu_blocks, host, disk, evictions, writes, onload, chunk, write_hits):
    if host == 0 and disk == 0:
        host = 4
    tr = workload(*reqs)
    opts = dict(gpu_blocks=gpu_blocks, tier_host_eviction=evictions[0], tier_disk_eviction=evictions[1],
                tier_host_write=writes[0], tier_disk_write=writes[1], tier_onload=onload,
                tier_chunk_tokens=chunk, tier_write_hits=write_hits, tier_onload_deadline_ms=2.0)
    if host:
        opts["tier_host_gib"] = chunks_gib(host, chunk)
    if disk:
        opts["tier_disk_gib"] = chunks_gib(disk, chunk)
    if policy == "vllm-prefix-chunked":
        policy, opts["chunked_prefill"] = "vllm-prefix", True
    e, res = run(tr, policy, **opts)  # blocks and tiers checked after every step; a lost request raises
    assert set(res.requests.status) <= {"finished", "rejected"}
    s = res.summary
    for lv in e.tiers.levels:
        assert len(lv.cache) <= lv.capacity
    assert_recount_matches(e, s)
    assert s["tier_host_hit_tokens"] + s["tier_disk_hit_tokens"] == \
        res.tier_requests.host_hit_tokens.sum() + res.tier_requests.disk_hit_tokens.sum()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "vllm-prefix", "sglang"]), reqs=requests, gpu_blocks=st.integers(20, 60),
       host=st.integers(0, 30), disk=st.integers(0, 60),
       evictions=st.tuples(st.sampled_from(["lru", "lru", "lfu", "arc"]), st.sampled_from(["lru", "lru", "lfu", "arc"])),
       writes=st.tuples(st.sampled_from(["write-through", "write-through", "write-through-selective", "write-back"]),
                        st.sampled_from(["write-back", "write-back", "write-through", "write-through-selective"])),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), chunk=st.sampled_from([16, 32]),
       fresh=st.sampled_from([None, 3.0]))
def test_batched_tier_moves_give_the_records_of_moves_one_chunk_at_a_time(
        policy, reqs, gpu_blocks, host, disk, evictions, writes, onload, chunk, fresh):
    """Runs without recorded moves take the whole-list paths (`TierStore.batched`); the same run one
    chunk at a time gives the same records, counters and tier contents (landing times included),
    with the disk's writes into new slots priced apart (`fresh`: their price over any write's) or
    not."""
    if host == 0 and disk == 0:
        host = 4
    opts = dict(tier_host_eviction=evictions[0], tier_disk_eviction=evictions[1], tier_host_write=writes[0],
                tier_disk_write=writes[1], tier_onload=onload, tier_chunk_tokens=chunk, tier_onload_deadline_ms=2.0)
    if host:
        opts["tier_host_gib"] = chunks_gib(host, chunk)
    if disk:
        opts["tier_disk_gib"] = chunks_gib(disk, chunk)
    if policy == "sglang":
        opts["tier_host_write" if host else "tier_disk_write"] = "write-through"
    cfg = tier_config(policy, gpu_blocks, **opts)
    tr = workload(*reqs)
    runs = []
    for batched in (True, False):
        e = Engine(cfg, tr, check_invariants=True)
        assert not e.tiers.ops_on
        e.tiers.batched = batched
        if fresh:
            e.tiers.fresh_write_s = fresh * e.tiers.disk_write.seconds(e.tiers.chunk_bytes)
        runs.append((e, e.run()))
    (a, ra), (b, rb) = runs
    assert_same_tier_runs(a, ra, b, rb)
    assert_same_links(a, b)
    assert (a.tiers.disk_slots, a.tiers.fresh_writes) == (b.tiers.disk_slots, b.tiers.fresh_writes)


def test_a_landed_request_admitted_with_less_budget_gives_back_the_blocks_reserved_beyond_its_chunk():
    """Under vLLM V1 a request whose chunks load from a tier holds blocks for them and for its first
    prefill chunk; when they land and less of the step's budget is left than when it reserved, it
    runs a shorter chunk and gives the rest back, so that its table covers exactly the K/V it has
    computed or runs (checked after every step). A hypothesis example: request 25 (176 + 1 tokens,
    recomputed) reserved blocks for 177 tokens and ran 128 of them."""
    prompts = [1] * 8 + [48, 49, 49] + [1] * 3 + [113] + [1] * 10 + [176, 177]
    families = [0] * len(prompts)
    families[14] = 1
    tr = workload([0.0] * len(prompts), prompts, [1] * len(prompts), families)
    cfg = build_config("vllm-v1", num_gpu_blocks=24, max_num_seqs=4, max_num_batched_tokens=256,
                       tier_host_gib=chunks_gib(4), tier_host_write="write-through-selective",
                       tier_disk_write="write-back", tier_onload="wait")
    for batched in (True, False):
        e = Engine(cfg, tr, check_invariants=True)
        e.tiers.batched = batched
        res = e.run()
        assert set(res.requests.status) == {"finished"}
        assert res.summary["tier_host_hit_tokens"] > 0


def test_a_span_ends_before_a_new_block_evicts_the_cached_prefix_a_waiting_request_plans_on():
    """A span of decode steps runs while a preempted request waits for blocks. Its GPU hit plans a
    host load and reserves blocks for it and its first chunk; a decode's new block that evicts one
    block of that hit lowers what it needs (one block less hit, no load), so at the next step it
    fits. Stepping one by one admits it in that step; the span must end before it and record the
    same steps (a fuzzing example: the span had admitted it one step later)."""
    tr = family_trace([0.0] * 18, [1] * 17 + [140], [1] * 14 + [17, 25, 24, 6], [0] * 18, hash_tokens=H,
                      family_stride=1000)
    cfg = build_config("vllm-v1", block_size=8, num_gpu_blocks=25, max_num_seqs=4, long_prefill_token_threshold=24,
                       tier_host_gib=chunks_gib(2, 8), tier_chunk_tokens=8, tier_disk_write="write-through")
    spans, stepped = Engine(cfg, tr, check_invariants=True), Engine(cfg, tr, spans=False)
    assert_same_tier_runs(spans, spans.run(), stepped, stepped.run())


def test_the_moves_a_spans_scheduling_issues_are_recorded_at_its_first_step():
    """A request looked up while the others decode plans a disk load in that step's scheduling,
    and the step starts a span: stepping one by one records the load's bytes at that step, so the
    span must too, not at its last step (a hypothesis example)."""
    prompts = [1] * 9 + [64, 121, 104, 65, 1]
    outputs = [1] * 11 + [3, 1, 1]
    families = [0] * 10 + [1, 2, 0, 0]
    tr = workload([0.0] * 12 + [0.03125] * 2, prompts, outputs, families)
    cfg = build_config("vllm-v1", block_size=8, num_gpu_blocks=32, max_num_seqs=4, max_num_batched_tokens=256,
                       tier_host_gib=chunks_gib(1), tier_disk_gib=chunks_gib(60), tier_disk_write="write-through",
                       tier_onload_deadline_ms=2.0)
    spans, stepped = Engine(cfg, tr, check_invariants=True), Engine(cfg, tr, spans=False)
    res = spans.run()
    assert res.tier_steps.bytes_disk_to_gpu.sum() > 0, "the example loads from the disk"
    assert_same_tier_runs(spans, res, stepped, stepped.run())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "vllm-v1", "vllm-prefix", "sglang"]), reqs=request_lists(
           st.integers(10, 30), st.integers(1, 160), st.integers(1, 40), st.integers(0, 2)),
       gpu_blocks=st.integers(16, 40), host=st.integers(1, 30), disk=st.sampled_from([0, 3, 60]),
       top_write=st.sampled_from(["write-through", "write-through-selective"]),
       disk_write=st.sampled_from(["write-through", "write-back"]),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), block_size=st.sampled_from([8, 16]),
       threshold=st.sampled_from([None, 24]))
def test_spans_with_tiers_give_exactly_the_records_of_stepping_one_by_one(
        policy, reqs, gpu_blocks, host, disk, top_write, disk_write, onload, block_size, threshold):
    """Spans of decode steps under tiers that take no GPU evictions (those turn spans off): the
    same request, step and tier records as stepping one by one, the moves a span's scheduling
    issued recorded at its first step, and the same tier contents."""
    tr = workload(*reqs)
    chunk = 16
    opts = dict(tier_host_gib=chunks_gib(host, chunk), tier_host_write=top_write, tier_disk_write=disk_write,
                tier_onload=onload, tier_chunk_tokens=chunk, tier_onload_deadline_ms=2.0)
    if disk:
        opts["tier_disk_gib"] = chunks_gib(disk, chunk)
    if policy == "vllm-v1" and threshold:
        opts["long_prefill_token_threshold"] = threshold
    cfg = tier_config(policy, gpu_blocks, block_size, **opts)
    spans, stepped = Engine(cfg, tr, check_invariants=True), Engine(cfg, tr, spans=False)
    assert_same_tier_runs(spans, spans.run(), stepped, stepped.run())


#: more and longer requests over fewer prefixes: preemptions and tier hits in most examples
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["vllm-v1", "vllm-v1", "vllm-prefix", "sglang"]), reqs=requests,
       gpu_blocks=st.integers(20, 60), host=st.integers(1, 30), disk=st.integers(0, 60),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), chunk=st.sampled_from([16, 16, 32]),
       late=st.sampled_from([None, "batched", "fresh"]))
def test_tier_position_runs_give_the_records_of_the_tiers_tables(policy, reqs, gpu_blocks, host, disk, onload,
                                                                 chunk, late):
    """An LRU host written through, alone or over an LRU disk written back, with one-block chunks
    holds its chunks by position runs (`TierStore.runs`) until the disk would evict; the same run
    in the tiers' own tables from the start gives the same records, counters, link states and tier
    contents in the same order (landing times included). `late`: the tables take over mid-run
    (the whole-list paths turned off, or a fresh-slot write price set, at the 40th lookup)."""
    opts = dict(tier_host_gib=chunks_gib(host, chunk), tier_onload=onload, tier_chunk_tokens=chunk,
                tier_onload_deadline_ms=2.0)
    if disk:
        opts["tier_disk_gib"] = chunks_gib(disk, chunk)
    cfg = tier_config(policy, gpu_blocks, **opts)
    tr = workload(*reqs)
    runs = []
    for on in (True, False):
        e = Engine(cfg, tr)
        t = e.tiers
        t.runs = on
        if not on:  # the tables from the start
            t._r_materialize()
        assert t._runs == on if policy == "vllm-v1" and chunk == H else not (t._runs and not on)
        if late:
            commit = t.commit

            def switching(*args, t=t, commit=commit):
                if t.lookups == 40:
                    if late == "batched":
                        t.batched = False
                    else:
                        t.fresh_write_s = 3 * t.disk_write.seconds(t.chunk_bytes)
                return commit(*args)
            t.commit = switching
        runs.append((e, e.run()))
    (a, ra), (b, rb) = runs
    assert_same_tier_runs(a, ra, b, rb)
    assert_same_links(a, b)
    assert (a.tiers.disk_slots, a.tiers.fresh_writes, a.tiers.bytes) == (b.tiers.disk_slots, b.tiers.fresh_writes,
                                                                         b.tiers.bytes)
    for lv_a, lv_b in zip(a.tiers.levels, b.tiers.levels):
        assert (lv_a.stored, lv_a.evictions, lv_a.hit_chunks) == (lv_b.stored, lv_b.evictions, lv_b.hit_chunks)
    a.tiers.check()


pressing = request_lists(st.integers(10, 30), st.integers(40, 200), st.integers(5, 40), st.integers(0, 2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=pressing, gpu_blocks=st.integers(16, 40), host=st.integers(1, 30), disk=st.integers(0, 60),
       top_write=st.sampled_from(["write-through", "write-through-selective"]),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), chunk=st.sampled_from([16, 32]),
       hashed=st.booleans())
def test_v1_tiers_give_the_same_records_with_unique_hashes_deferred(reqs, gpu_blocks, host, disk, top_write,
                                                                     onload, chunk, hashed):
    """Under tiers that take no GPU evictions, vLLM V1's manager defers unique content's hashes
    (the tiers compute those of the chunks they key); hashing every block as it fills gives the
    same records, tier events and tier contents."""
    opts = dict(tier_host_gib=chunks_gib(host, chunk), tier_host_write=top_write, tier_onload=onload,
                tier_chunk_tokens=chunk, tier_onload_deadline_ms=2.0, tier_write_hits=2)
    if disk:
        opts["tier_disk_gib"] = chunks_gib(disk, chunk)
    cfg = build_config("vllm-v1", num_gpu_blocks=gpu_blocks, max_num_seqs=4, max_num_batched_tokens=256, **opts)
    tr = workload(*reqs)
    if not hashed:  # every prompt block's content unique: the tiers compute each chunk's hash
        tr = traces.Trace(tr.df.drop(columns="prefix_hashes"))
    runs = []
    for defer in (True, False):
        e = Engine(cfg, tr, check_invariants=True, log_tier_events=True)
        assert e.bm.defer_unique_hashes
        e.bm.defer_unique_hashes = defer
        runs.append((e, e.run()))
    (a, ra), (b, rb) = runs
    assert_same_tier_runs(a, ra, b, rb)
    assert a.tiers.log == b.tiers.log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=pressing, gpu_blocks=st.integers(16, 40), host=st.integers(1, 30), disk=st.sampled_from([0, 0, 60, 400]),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), hashed=st.booleans())
def test_v1_private_chunks_held_without_key_entries_give_the_records_of_the_tiers_tables(reqs, gpu_blocks, host, disk,
                                                                                        onload, hashed):
    """vLLM V1 hands the tiers the chunks no other request has (their prefix hash id is the
    request's alone, or no hash covers them) as private to their request: position runs hold them
    without a key-table entry, entered when the request is preempted (most of these examples
    preempt). The same run in the tiers' tables from the start gives the same records, counters,
    link states and tier contents."""
    opts = dict(tier_host_gib=chunks_gib(host), tier_onload=onload, tier_onload_deadline_ms=2.0)
    if disk:
        opts["tier_disk_gib"] = chunks_gib(disk)
    cfg = tier_config("vllm-v1", gpu_blocks, **opts)
    tr = workload(*reqs)
    if not hashed:  # every prompt block's content unique: every chunk private
        tr = traces.Trace(tr.df.drop(columns="prefix_hashes"))
    runs, private = [], []
    for on in (True, False):
        e = Engine(cfg, tr, check_invariants=True)
        t = e.tiers
        if on:
            assert t._runs
            on_computed = t.on_computed

            def counting(keys, table, first, n=0, owner=None, on_computed=on_computed):
                private.append(n)
                on_computed(keys, table, first, n, owner)
            t.on_computed = counting
        else:
            t.runs = False
            t._r_materialize()
        runs.append((e, e.run()))
    (a, ra), (b, rb) = runs
    if not hashed and not ra.summary["preemptions"]:  # (a preempted request's chunks are private no more)
        assert sum(private) == ra.summary["tier_host_stored_chunks"], "every chunk stored is private"
    assert_same_tier_runs(a, ra, b, rb)
    assert_same_links(a, b)
    for lv_a, lv_b in zip(a.tiers.levels, b.tiers.levels):
        assert (lv_a.stored, lv_a.evictions, lv_a.hit_chunks) == (lv_b.stored, lv_b.evictions, lv_b.hit_chunks)
    a.tiers.check()


@pytest.mark.parametrize("disk", [0, 40])
def test_a_private_chunk_is_found_only_after_its_request_is_preempted(disk):
    """Position runs hold a request's private chunks without key-table entries: a lookup does not
    find them until `on_preempted` enters them; the host's evictions drop them either way."""
    from blocksim.config import TierConfig
    from blocksim.memory.tiers import TierStore
    chunk = H * KV_BYTES
    t = TierStore(TierConfig(host_gib=6 * chunk / GIB, disk_gib=disk * chunk / GIB), H, H, chunk, 25.0, 1e-5)
    assert t._runs
    t.on_computed([1, 2, 3], [0, 1, 2], 0, 2, 7)  # chunk 1 shared, chunks 2 and 3 request 7's own
    t.on_computed([11, 12], [0, 1], 0, 2, 8)
    assert (t.match([1, 2, 3]), t.match([11, 12])) == (1, 0), "private chunks are not found"
    t.on_preempted(7)
    t.on_finished(8)
    assert (t.match([1, 2, 3]), t.match([11, 12])) == (3, 0), "found once their request is preempted"
    new = list(range(21, 27))
    t.on_computed(new, list(range(6)), 0)  # evicts every chunk above from the host
    assert t.match([1, 2, 3]) == (3 if disk else 0), "on the disk, or gone"
    assert t.match(new) == 6
    t.check()
    assert sorted(t.levels[0].cache.keys()) == new
    if disk:
        assert sorted(t.levels[1].cache.keys()) == [1, 2, 3, 11, 12], "the disk holds every victim, private ones too"


def test_v1_tiers_defer_unique_hashes_unless_a_write_back_tier_reads_evicted_blocks():
    tr = workload([0.0], [64], [4], [0])
    through = Engine(build_config("vllm-v1", tier_host_gib=1.0), tr)
    back = Engine(build_config("vllm-v1", tier_host_gib=1.0, tier_host_write="write-back"), tr)
    assert through.bm.defer_unique_hashes and through.bm.pool.on_evict is None
    assert not back.bm.defer_unique_hashes and back.bm.pool.on_evict is not None


def lookups_checked_against_a_scan(engine) -> list[tuple]:
    """Each match of the engine's tier store as it runs: (found, whether each key is held, whether
    the tiers keep every chunk computed)."""
    t = engine.tiers
    match, matched = t._match, []

    def scanned(keys):
        n = match(keys)
        matched.append((n, [any(k in lv.cache for lv in t.levels) for k in keys], t._keeps_every_store()))
        return n
    t._match = scanned
    return matched


def test_v1_matches_by_bisection_while_the_tiers_keep_every_chunk():
    """vLLM V1's chunk keys are chained block hashes, each naming its whole prefix: while every chunk
    computed stays in some tier (a host written through over a disk that never evicts), the keys the
    tiers hold are a leading run of a lookup's, and the bisected match finds that run."""
    n = 30  # five families, each prompt of a family longer or shorter than the one before
    tr = workload([0.05] * n, [96 + 32 * (i % 4) for i in range(n)], [4] * n, [i % 5 for i in range(n)])
    e = Engine(tier_config("vllm-v1", 30, tier_host_gib=chunks_gib(12), tier_disk_gib=chunks_gib(200)), tr,
               check_invariants=True)
    matched = lookups_checked_against_a_scan(e)
    s = e.run().summary
    assert s["tier_host_evictions"] > 0 and s["tier_disk_evictions"] == 0
    assert all(kept for *_, kept in matched)
    assert any(0 < n < len(held) for n, held, _ in matched), "lookups ending inside their keys"
    for n, held, _ in matched:
        assert held == [True] * n + [False] * (len(held) - n), "the held keys are the leading run found"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=pressing,
       gpu_blocks=st.integers(16, 40), host=st.integers(0, 30), disk=st.integers(0, 300),
       writes=st.tuples(st.sampled_from(["write-through", "write-through", "write-back"]),
                        st.sampled_from(["write-back", "write-through", "write-through-selective"])),
       evictions=st.tuples(st.sampled_from(["lru", "lfu", "arc"]), st.sampled_from(["lru", "lfu", "arc"])),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), chunk=st.sampled_from([16, 32]))
def test_v1_tiers_keeping_every_chunk_hold_a_leading_run_of_each_lookup(reqs, gpu_blocks, host, disk, writes,
                                                                         evictions, onload, chunk):
    """Whenever the tiers keep every chunk computed (`TierStore._keeps_every_store`), the keys they
    hold are a leading run of each vLLM V1 lookup's keys, found by the bisected match."""
    if host == 0 and disk == 0:
        host = 4
    opts = dict(tier_host_write=writes[0], tier_disk_write=writes[1], tier_host_eviction=evictions[0],
                tier_disk_eviction=evictions[1], tier_onload=onload, tier_chunk_tokens=chunk,
                tier_onload_deadline_ms=2.0)
    if host:
        opts["tier_host_gib"] = chunks_gib(host, chunk)
    if disk:
        opts["tier_disk_gib"] = chunks_gib(disk, chunk)
    e = Engine(tier_config("vllm-v1", gpu_blocks, **opts), workload(*reqs), check_invariants=True)
    matched = lookups_checked_against_a_scan(e)
    e.run()
    for n, held, kept in matched:
        lead = next((i for i, h in enumerate(held) if not h), len(held))
        assert n == lead, "the match is the leading run of held keys"
        if kept:
            assert not any(held[n:]), "while the tiers keep every chunk, no key after the run is held"


#: a tier store's events: (kind, prompt family, first chunk, last chunk, seconds the clock advances)
tier_store_events = st.lists(st.tuples(st.sampled_from(["computed", "computed", "lookup", "lookup", "rematch", "gpu_hit",
                                                        "gpu_evict"]),
                                       st.integers(0, 3), st.integers(0, 8), st.integers(1, 12),
                                       st.sampled_from([0.001, 0.01, 0.1, 1.0])), min_size=20, max_size=60)


@pytest.mark.parametrize("host_eviction,top_write,disk_write", [
    ("lru", "write-through", "write-back"), ("lru", "write-through", "write-through-selective"),
    ("lru", "write-through", "write-through"), ("lru", "write-back", "write-back"),
    ("lru", "write-through-selective", "write-back"), ("arc", "write-through", "write-back"),
    ("lfu", "write-through", "write-back")])
@settings(max_examples=40, deadline=None)
@given(host=st.integers(1, 6), disk=st.sampled_from([0, 3, 40]), disk_eviction=st.sampled_from(["lru", "lfu", "arc"]),
       onload=st.sampled_from(["wait", "deadline", "recompute"]), write_hits=st.integers(1, 2),
       events=tier_store_events, fresh=st.sampled_from([None, 2e-3]))
def test_a_tier_store_batched_and_one_chunk_at_a_time_end_in_the_same_state(
        host_eviction, top_write, disk_write, host, disk, disk_eviction, onload, write_hits, events, fresh):
    """The whole-list paths (a step's stores, load ends, touches, repeated matches) against the
    one-chunk-at-a-time paths, event by event on small tiers: prompts of four families computed
    and looked up in pieces, full host batches, chunks a batch evicts before their turn, a disk
    without room, idle links."""
    from blocksim.config import TierConfig
    from blocksim.memory.tiers import TierStore
    chunk = H * KV_BYTES
    cfg = TierConfig(host_gib=host * chunk / GIB, disk_gib=disk * chunk / GIB, host_eviction=host_eviction,
                     disk_eviction=disk_eviction, host_write=top_write, disk_write=disk_write, onload=onload,
                     write_hits=write_hits, onload_deadline_ms=20.0, disk_read_gbps=2.0, disk_write_gbps=1.0)
    stores = []
    for batched in (True, False):
        t = TierStore(cfg, H, H, chunk, 25.0, 1e-5)
        t.batched = batched
        t.fresh_write_s = fresh  # a write into a new disk slot: 2 ms against 0.26 ms into a used one
        t.prefill_s = lambda start, n: n * 3e-4  # a chunk's prefill about as long as its disk read
        answers, last = [], []
        for kind, family, first, last_chunk, dt in events:
            t.now_s += dt
            t.step += 1
            keys = [family * 100 + j for j in range(first, max(first + 1, last_chunk))]
            if kind == "computed":
                t.on_computed(keys, list(range(len(keys))), 0)
            elif kind == "gpu_hit":
                t.on_gpu_hit(keys[0], (0,))
            elif kind == "gpu_evict":
                t.on_gpu_evicted(keys[0], (0,))
            elif kind == "rematch":
                answers.append(t.match(list(last)))
            else:
                keys = [family * 100 + j for j in range(last_chunk)]  # a prompt's chunks from its start
                found = t.match(keys)
                n = t.plan_onload(keys, found, 0) if found else 0
                answers.append((found, n, t.match(keys), t.commit(keys, found, n, list(range(len(keys))))))
                last = keys
            answers.append(t.take_wait(0.001))
            t.check()
        stores.append((t, answers))
    (a, ans_a), (b, ans_b) = stores
    assert ans_a == ans_b
    assert a.stats() == b.stats()
    for la, lb in zip(a.levels, b.levels):
        assert policy_state(la.cache) == policy_state(lb.cache), f"{la.name}: contents, order, landing times"
        assert (la.hits, la.stored, la.evictions, la.hit_chunks) == (lb.hits, lb.stored, lb.evictions, lb.hit_chunks)
    for link in ("h2d", "d2h", "disk_read", "disk_write"):
        x, y = getattr(a, link), getattr(b, link)
        assert (x.free_s, x.busy_s, x.bytes) == (y.free_s, y.busy_s, y.bytes), link
    assert (a.disk_slots, a.fresh_writes) == (b.disk_slots, b.fresh_writes)


def load_ends_one_chunk_at_a_time(t, keys, n):
    """When each of the first `n` keys would land on the GPU, and its tier: a chunk held only in the
    disk read once it has landed there and the read channel is free, then each chunk copied over
    the host link once it is ready and the link is free, in order, none before now."""
    now, nbytes = t.now_s, t.chunk_bytes
    rd, h2d = max(t.disk_read.free_s, now), max(t.h2d.free_s, now)
    ends, where = [], []
    for k in keys[:n]:
        i = 0 if k in t.levels[0].cache else 1
        ready = t.levels[i].cache.members[k]
        if t.levels[i].name == "disk":
            ready = rd = max(ready, rd) + t.disk_read.seconds(nbytes)
        ready = h2d = max(ready, h2d) + t.h2d.seconds(nbytes)
        ends.append(ready)
        where.append(i)
    return ends, where


@settings(max_examples=60, deadline=None)
@given(host=st.integers(0, 6), disk=st.sampled_from([3, 40]), disk_write=st.sampled_from(["write-back", "write-through"]),
       events=tier_store_events)
def test_a_lookups_load_ends_are_its_chunks_transfers_in_order(host, disk, disk_write, events):
    """The whole-list load ends (`_load_ends`, and its last end alone) against each chunk's transfers
    one after another, lookup by lookup, with the disk's writes still running or all ended (a disk
    chunk's landing time is then not read)."""
    from blocksim.config import TierConfig
    from blocksim.memory.tiers import TierStore
    chunk = H * KV_BYTES
    cfg = TierConfig(host_gib=host * chunk / GIB, disk_gib=disk * chunk / GIB, host_write="write-through",
                     disk_write=disk_write, disk_read_gbps=2.0, disk_write_gbps=1.0)
    t = TierStore(cfg, H, H, chunk, 25.0, 1e-5)
    for kind, family, first, last_chunk, dt in events:
        t.now_s += dt
        t.step += 1
        if kind in ("computed", "gpu_hit", "gpu_evict"):
            t.on_computed([family * 100 + j for j in range(first, max(first + 1, last_chunk))], [], 0)
        else:
            keys = [family * 100 + j for j in range(last_chunk)]
            found = t.match(keys)
            if found:
                expected = load_ends_one_chunk_at_a_time(t, keys, found)
                assert t._load_ends(keys, found, commit=False) == expected
                ends, where = t._load_ends(keys, found, commit=False, last_only=True)
                assert (ends[-1], where) == (expected[0][-1], expected[1]), "the last end alone"
                t.commit(keys, found, found, list(range(len(keys))))  # on the plan's last end


@pytest.mark.parametrize("policy", ["vllm-v1", "sglang"])
@pytest.mark.parametrize("host_gib,writes", [(None, ("write-through", "write-through")),
                                             (2, ("write-through", "write-through")),
                                             (2, ("write-through", "write-back")),
                                             (2, ("write-back", "write-back"))])
def test_disk_writes_priced_fresh_are_the_executors_first_writes_of_a_slot(policy, host_gib, writes, tmp_path):
    """A disk write is priced `fresh_write_s` exactly when the GPU tier executor's file would write a
    slot for the first time: the plan's moves replayed on the executor's own slot allocator
    (`validation.tiers.executor._Slots`, freed slots taken first), with the disk filling and
    evicting."""
    from validation.tiers.executor import _Slots
    from validation.tiers.ops import read_tier_ops
    chunk = 64 if policy == "sglang" else H
    per_prefix = 300 // chunk
    opts = dict(tier_disk_gib=chunks_gib(per_prefix, chunk), tier_host_write=writes[0], tier_disk_write=writes[1],
                tier_write_hits=1, tier_chunk_tokens=chunk)
    if host_gib:
        opts["tier_host_gib"] = chunks_gib(host_gib, chunk)
    tr = repeated_prefixes(n=40, prompt=300, families=6)
    if policy == "sglang":
        cfg = build_config(policy, num_gpu_blocks=30 * H, max_running_requests=4, chunked_prefill_size=256, **opts)
    else:
        cfg = build_config(policy, num_gpu_blocks=30, max_num_seqs=4, max_num_batched_tokens=512, **opts)
    e = Engine(cfg, tr, plan_dir=tmp_path)
    t = e.tiers
    price = t.disk_write.seconds(t.chunk_bytes)
    t.fresh_write_s = 2.5 * price
    s = e.run().summary
    ops = read_tier_ops(tmp_path / "plan" / "tier_ops.parquet")
    slots, used, first, writes_n = _Slots("disk", s["tier_disk_capacity_chunks"]), set(), 0, 0
    for i in range(len(ops)):
        key = int(ops.key[i])
        if ops.evict[i] and ops.src[i] == "disk":
            slots.drop(key)
        elif not ops.evict[i] and ops.op[i] == "store" and ops.dst[i] == "disk":
            slot = slots.take(key)
            first += slot not in used
            used.add(slot)
            writes_n += 1
    assert s["tier_disk_evictions"] > 0 and writes_n > first > 0, "the disk fills, evicts and writes used slots"
    assert t.fresh_writes == first == t.disk_slots == len(used)
    assert t.disk_write.busy_s == pytest.approx((writes_n - first) * price + first * t.fresh_write_s, rel=1e-9)


def policy_state(cache):
    """An eviction policy's whole state, dicts as lists of items in their order (what decides its
    next evictions)."""
    def plain(v):
        return [(k, plain(x)) for k, x in v.items()] if isinstance(v, dict) else v
    return {name: plain(v) for name, v in vars(cache).items()}


# --- refused configurations ------------------------------------------------------------------
@pytest.mark.parametrize("policy,options,where", [
    ("vllm-v1", dict(tier_host_gib=0.001), "tier-host-gib"),
    ("vllm-v1", dict(tier_host_gib=1.0, tier_chunk_tokens=24), "tier-chunk-tokens"),
    ("vllm-v1", dict(tier_disk_gib=1.0, tier_disk_path="/nonexistent/dir"), "tier-disk-path"),
    ("vllm", dict(tier_host_gib=1.0), "prefix caching"),
    ("vllm-v1", dict(tier_onload="deadline"), "tier-onload"),
])
def test_unusable_tiers_are_refused_naming_the_option(policy, options, where):
    with pytest.raises(ConfigError, match=where):
        build_config(policy, **options)


def test_replay_writes_the_tier_tables_and_the_report_shows_them(tmp_path):
    from blocksim.experiments.runner import replay
    from blocksim.records.schema import TIER_REQUESTS_FILE, TIER_STEPS_FILE
    tr = repeated_prefixes(n=30, families=5)
    out = tmp_path / "run"
    s = replay(tr, out, policy="vllm-v1", write_report=True,
               overrides=dict(num_gpu_blocks=30, max_num_seqs=4, max_num_batched_tokens=256,
                              tier_host_gib=chunks_gib(200)))
    assert s["tier_host_hit_tokens"] > 0
    assert len(pd.read_parquet(out / TIER_REQUESTS_FILE)) == 30
    assert len(pd.read_parquet(out / TIER_STEPS_FILE)) == s["steps"]
    report = (out / "report.md").read_text()
    assert "## KV tiers" in report and "| host |" in report


def test_the_cli_takes_tier_flags_and_prints_tier_lines(tmp_path, capsys):
    from blocksim.cli import main
    trace = tmp_path / "t.jsonl"
    lines = [f'{{"timestamp": {i * 50}, "input_length": 1000, "output_length": 4, '
             f'"hash_ids": [{i % 5 * 10}, {i % 5 * 10 + 1}]}}' for i in range(30)]  # Mooncake: 512 tokens a hash
    trace.write_text("\n".join(lines) + "\n")
    code = main(["replay", str(trace), "--out", str(tmp_path / "run"), "--quiet", "--no-report", "--policy",
                 "vllm-v1", "--num-gpu-blocks", "200", "--tier-host-gib", "1", "--tier-host-eviction", "arc",
                 "--tier-onload", "recompute"])
    out = capsys.readouterr().out
    assert code == 0 and "tier hits gpu/host/disk" in out
    cfg = __import__("json").loads((tmp_path / "run" / "summary.json").read_text())["config"]["tiers"]
    assert cfg["host_gib"] == 1.0 and cfg["host_eviction"] == "arc" and cfg["onload"] == "recompute"


def test_a_profiles_measured_tier_tables_price_the_moves(tmp_path):
    import json
    from pathlib import Path
    from blocksim.cost.tier_transfer import tier_chunk_seconds
    from blocksim.policies import make_cost_model
    root = Path(__file__).resolve().parents[2]
    prof = json.loads((root / "blocksim/profiles/llama-3-8b__h200-141gb__float16__tp1.json").read_text())
    measured = json.loads((root / "benchmarks/results/tier-h200.json").read_text())["components"]
    prof["components"].update(measured)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    cfg = build_config("vllm-v1", model="llama-3-8b", gpu="h200-141gb", cost_profile=str(path), num_gpu_blocks=200,
                       max_num_seqs=4, max_num_batched_tokens=512, tier_host_gib=1.0, tier_disk_gib=4.0,
                       tier_chunk_tokens=256)
    e = Engine(cfg, repeated_prefixes(n=12, prompt=1040, families=4), make_cost_model(cfg, str(path)))
    per_chunk = tier_chunk_seconds(e.cost.profile, e.tiers.chunk_bytes)
    assert e.tiers.chunk_bytes == 256 * 131072 == measured["tier_host_gpu"]["grid"]["chunk_bytes"][2]
    assert per_chunk["host_gpu"] == measured["tier_host_gpu"]["seconds"][2][-1] / 16, "a load: the 16-chunk batch"
    assert per_chunk["gpu_host"] == measured["tier_gpu_host"]["seconds"][2][0], "a store: one chunk per batch"
    assert e.tiers.h2d.seconds(e.tiers.chunk_bytes) == per_chunk["host_gpu"]
    assert e.tiers.disk_read.seconds(1) == per_chunk["disk_gpu"] - per_chunk["host_gpu"]
    half = tier_chunk_seconds(e.cost.profile, 3 * 2**23)  # between the 8 and 32 MiB points: linear
    lo, hi = (measured["tier_host_gpu"]["seconds"][i][-1] / 16 for i in (1, 2))
    assert abs(half["host_gpu"] - (lo + (hi - lo) * (3 * 2**23 - 2**23) / (2**25 - 2**23))) < 1e-12
    assert e.tiers.fresh_write_s is None, "no table of writes into new slots: priced as any write"
    res = e.run()
    assert res.summary["tier_transfer_source"] == f"profile {e.cost.profile.path}"
    fresh = dict(measured["tier_host_disk"], seconds=[[1.4 * x for x in row] for row in
                                                      measured["tier_host_disk"]["seconds"]])
    prof["components"]["tier_host_disk_fresh"] = fresh
    path.write_text(json.dumps(prof))
    cfg = build_config("vllm-v1", model="llama-3-8b", gpu="h200-141gb", cost_profile=str(path), num_gpu_blocks=200,
                       max_num_seqs=4, max_num_batched_tokens=512, tier_host_gib=1.0, tier_disk_gib=4.0,
                       tier_chunk_tokens=256, tier_disk_write="write-through")
    e = Engine(cfg, repeated_prefixes(n=12, prompt=1040, families=4), make_cost_model(cfg, str(path)))
    assert e.tiers.fresh_write_s == pytest.approx(1.4 * per_chunk["host_disk"], rel=1e-12)
    assert e.tiers.disk_write.seconds(e.tiers.chunk_bytes) == per_chunk["host_disk"]
    e.run()
    assert 0 < e.tiers.fresh_writes == e.tiers.disk_slots


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-prefix", "sglang"])
@pytest.mark.parametrize("writes", [("write-through", "write-back"), ("write-through-selective", "write-through"),
                                    ("write-back", "write-through-selective")])
def test_the_plans_tier_ops_pass_the_tier_executors_checks(policy, writes, tmp_path):
    """validation.tiers.ops.check_tier_ops replays the table as the GPU tier executor would: every
    load finds its key, no store writes a key its tier holds, no tier exceeds its capacity."""
    from validation.tiers.ops import check_tier_ops, read_tier_ops
    chunk = 64 if policy == "sglang" else H
    per_prefix = 300 // chunk  # host: two prefixes' chunks, disk: five, of six prefixes
    opts = dict(tier_host_gib=chunks_gib(2 * per_prefix, chunk), tier_disk_gib=chunks_gib(5 * per_prefix, chunk),
                tier_host_write=writes[0],
                tier_disk_write=writes[1], tier_write_hits=1)
    tr = repeated_prefixes(n=40, prompt=300, families=6)
    if policy == "sglang":
        cfg = build_config(policy, num_gpu_blocks=30 * H, max_running_requests=4, chunked_prefill_size=256, **opts)
    else:
        cfg = build_config(policy, num_gpu_blocks=30, max_num_seqs=4, max_num_batched_tokens=512, **opts)
    res = Engine(cfg, tr, plan_dir=tmp_path).run()
    s = res.summary
    if writes == ("write-through", "write-back"):  # the disk keeps what the small host drops
        assert s["tier_host_hit_tokens"] + s["tier_disk_hit_tokens"] > 0 and s["tier_host_evictions"] > 0
    ops = read_tier_ops(tmp_path / "plan" / "tier_ops.parquet")
    assert len(ops) == s["tier_host_stored_chunks"] + s["tier_disk_stored_chunks"] + s["tier_host_evictions"] + \
        s["tier_disk_evictions"] + (s["tier_host_hit_chunks"] + s["tier_disk_hit_chunks"]), "one row per move"
    check_tier_ops(ops, chunk_blocks=chunk // cfg.cache.block_size, num_gpu_blocks=cfg.num_gpu_blocks,
                   host_chunks=s["tier_host_capacity_chunks"], disk_chunks=s["tier_disk_capacity_chunks"])


def test_recompute_mode_loads_a_host_head_and_recomputes_a_slow_disk_tail():
    from blocksim.config import TierConfig
    from blocksim.memory.tiers import TierStore
    chunk = H * KV_BYTES
    t = TierStore(TierConfig(host_gib=3 * chunk / GIB, disk_gib=10 * chunk / GIB, disk_write="write-through",
                             disk_read_gbps=0.001, onload="recompute"), H, H, chunk, 25.0, 1e-5)
    t.on_computed([0, 1, 2, 3, 4, 5], list(range(6)), 0)  # host keeps 3, 4, 5; the disk all six
    t.now_s = 100.0  # every store has landed
    t.prefill_s = lambda start, n: n * 1e-4  # 1.6 ms a chunk: the host link is faster, the disk far slower
    keys = [3, 4, 5, 0, 1, 2]
    assert t.match(keys) == 6
    assert t.plan_onload(keys, 6, 0) == 3, "load the host's three, recompute the disk's"
    t.prefill_s = lambda start, n: n * 1e-8  # recomputing is nearly free: load nothing
    assert t.plan_onload(keys, 6, 0) == 0


def test_a_landed_request_runs_when_the_head_of_the_queue_cannot_get_blocks():
    """A preempted 177-token request goes back to the front of the queue, ahead of a request whose
    chunks have landed and which holds 9 of the 20 blocks: nothing runs, so the landed request runs
    first on its own blocks instead of the two waiting for each other (a stall before)."""
    prompts = [1] * 8 + [64, 65, 174] + [1] * 5 + [129] + [1] * 13
    outputs = [1] * 6 + [2, 3, 1, 1, 4] + [1] * 19
    families = [0] * 10 + [1] + [0] * 19
    tr = workload([0.0] * 30, prompts, outputs, families)
    e, res = run(tr, "vllm-v1", gpu_blocks=21, tier_host_gib=chunks_gib(4), tier_host_write="write-through-selective",
                 tier_disk_write="write-through", tier_write_hits=1, tier_chunk_tokens=16)
    assert res.summary["finished"] == 30 and res.summary["preemptions"] >= 1
    assert res.summary["tier_host_hit_tokens"] > 0


def test_a_radix_eviction_hands_the_tiers_each_chunk_ending_in_the_leaf_with_its_pages(monkeypatch):
    """SGLang's tree evicts a leaf under a write-back host tier: every whole prompt chunk that ends
    in the leaf goes to the tiers with the pages holding it, the pages of its path from the root
    (its first pages may be its ancestors'), as a plain concatenation of that path recounts them."""
    from blocksim.memory.prefix_cache import block_keys
    from blocksim.memory.radix_manager import RadixCacheManager
    seen, expected = [], []
    write_back = RadixCacheManager._write_back

    def spy(self, node):
        path, n = [], node
        while n.parent is not None:
            path.append(n)
            n = n.parent
        pages = [p for n in reversed(path) for p in n.pages]  # the tokens [0, node.end) page by page
        c, ct, ps = node.content, self.tiers.chunk_tokens, self.block_size
        keys = block_keys(c.hashes, c.shared_len, ct, self._hash_tokens) if c.hashes is not None else []
        for j in range(len(keys)):
            if node.start < (j + 1) * ct <= min(node.end, c.shared_len):
                expected.append((keys[j], pages[j * ct // ps:(j + 1) * ct // ps]))
        evicted = self.tiers.on_gpu_evicted
        self.tiers.on_gpu_evicted = lambda key, blocks: (seen.append((key, list(blocks))), evicted(key, blocks))
        try:
            write_back(self, node)
        finally:
            self.tiers.on_gpu_evicted = evicted
    monkeypatch.setattr(RadixCacheManager, "_write_back", spy)
    tr = repeated_prefixes(n=30, families=5)
    e, res = run(tr, "sglang", gpu_blocks=30, tier_host_gib=chunks_gib(200, 64), tier_host_write="write-back")
    assert seen and seen == expected
    assert any(len({p for p in pages}) == len(pages) for _, pages in seen)
    assert res.summary["tier_host_hit_tokens"] > 0
