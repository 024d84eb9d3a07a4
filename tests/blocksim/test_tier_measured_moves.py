"""KV tier moves priced by an executor's measurements (`TierStore.attach_mover`): the engine's
executed-run path, with a stand-in executor (no torch) whose step times are the cost model's and
whose moves "measure" durations the test chooses."""

import numpy as np
import pandas as pd
import pytest

from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from tests.blocksim.test_memory_tiers import H, chunks_gib, repeated_prefixes


class StandIn:
    """An executor: each step lasts its prediction; each tier move lasts `measure(row)`."""

    def __init__(self, measure):
        self.measure = measure
        self.rows = []   # every row performed, in order
        self.parts = []  # what was returned for it

    def execute(self, step, out, predicted):
        return sum(predicted.values())

    def save(self, out_dir):
        pass

    def attach_tiers(self, store):
        self.store = store
        store.attach_mover(self.move)

    def move(self, rows):
        parts = [(0.0, 0.0) if r.evict else self.measure(r) for r in rows]
        self.rows += rows
        self.parts += parts
        return parts


def link_prices(store):
    """The measurement equal to the store's own link prices."""
    nbytes = store.chunk_bytes

    def measure(r):
        if r.src == "gpu":
            return store.d2h.seconds(nbytes), store.disk_write.seconds(nbytes) if r.dst == "disk" else 0.0
        if r.dst == "disk":
            return 0.0, store.disk_write.seconds(nbytes)
        return store.h2d.seconds(nbytes), store.disk_read.seconds(nbytes) if r.src == "disk" else 0.0
    return measure


def config(policy, **opts):
    if policy == "sglang":
        return build_config(policy, num_gpu_blocks=30 * H, max_running_requests=4, chunked_prefill_size=256, **opts)
    return build_config(policy, num_gpu_blocks=30, max_num_seqs=4, max_num_batched_tokens=512, **opts)


def tier_options(policy, writes, onload="wait"):
    chunk = 64 if policy == "sglang" else H
    per_prefix = 300 // chunk
    return dict(tier_host_gib=chunks_gib(2 * per_prefix, chunk), tier_disk_gib=chunks_gib(5 * per_prefix, chunk),
                tier_host_write=writes[0], tier_disk_write=writes[1], tier_write_hits=1, tier_onload=onload,
                tier_disk_read_gbps=20.0)


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-prefix", "sglang"])
@pytest.mark.parametrize("writes", [("write-through", "write-back"), ("write-through-selective", "write-through"),
                                    ("write-back", "write-through-selective")])
def test_moves_measured_at_the_links_prices_give_the_priced_run(policy, writes):
    """Performing each move as it is issued and timing it by what the executor returns changes
    nothing when the executor measures the links' own prices: same requests, steps and tier records."""
    cfg = config(policy, **tier_options(policy, writes))
    # six families: the GPU keeps none for long (hits in the tiers); two: GPU hits (selective stores)
    tr = repeated_prefixes(n=40, prompt=300, families=2 if writes[0] == "write-through-selective" else 6, gap_s=0.02)
    priced = Engine(cfg, tr).run()
    ex = StandIn(None)
    e = Engine(cfg, tr, executor=ex, check_invariants=True)
    ex.measure = link_prices(e.tiers)
    executed = e.run()
    s = executed.summary
    p = priced.summary
    assert len(ex.rows) == sum(p.get(f"tier_{t}_{c}", 0) for t in ("host", "disk")
                               for c in ("stored_chunks", "evictions", "hit_chunks")), "every move performed"
    if writes == ("write-through", "write-back"):
        assert s["tier_host_hit_tokens"] + s["tier_disk_hit_tokens"] > 0
    for name in ("requests", "steps", "tier_requests", "tier_steps"):
        pd.testing.assert_frame_equal(getattr(executed, name), getattr(priced, name), check_exact=False,
                                      rtol=1e-9, obj=name)
    for k in ("tier_h2d_busy_s", "tier_d2h_busy_s", "tier_disk_read_busy_s", "tier_disk_write_busy_s"):
        assert s[k] == pytest.approx(priced.summary[k], rel=1e-9)


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-prefix"])
def test_the_links_are_busy_for_exactly_the_measured_seconds(policy):
    """Every transfer lasts its measured parts: each channel's busy time is the sum of what the
    executor returned for the moves on it, whatever the links' prices."""
    rng = np.random.default_rng(7)
    cfg = config(policy, **tier_options(policy, ("write-through", "write-back")))
    ex = StandIn(lambda r: tuple(rng.uniform(1e-4, 5e-3, 2)))
    res = Engine(cfg, repeated_prefixes(n=40, prompt=300, families=6, gap_s=0.02), executor=ex).run()
    s = res.summary
    sums = dict.fromkeys(("h2d", "d2h", "read", "write"), 0.0)
    for r, (link_s, disk_s) in zip(ex.rows, ex.parts):
        if r.evict:
            continue
        if r.src == "gpu":
            sums["d2h"] += link_s
            sums["write"] += disk_s if r.dst == "disk" else 0.0
        elif r.dst == "disk":
            sums["write"] += disk_s
        else:
            sums["h2d"] += link_s
            sums["read"] += disk_s if r.src == "disk" else 0.0
    assert s["tier_host_hit_tokens"] > 0 and s["tier_disk_hit_tokens"] > 0
    assert s["tier_h2d_busy_s"] == pytest.approx(sums["h2d"])
    assert s["tier_d2h_busy_s"] == pytest.approx(sums["d2h"])
    assert s["tier_disk_read_busy_s"] == pytest.approx(sums["read"])
    assert s["tier_disk_write_busy_s"] == pytest.approx(sums["write"])


def test_a_request_waits_for_its_loads_measured_times_not_the_links_prices():
    """vllm-v1: a request whose prefix lies in the host, loaded on idle links, waits exactly the sum
    of its chunks' measured host->GPU times (here 50 ms each, against the link's microseconds)."""
    cfg = config("vllm-v1", tier_host_gib=chunks_gib(200))
    # two prompts of one family far apart, four unrelated ones between them evict it from the GPU
    from tests.blocksim.test_memory_tiers import workload
    tr = workload([1.0] * 6, [160] * 6, [2] * 6, [0, 1, 2, 3, 4, 0])
    ex = StandIn(lambda r: (0.05, 0.0) if r.dst == "gpu" else (1e-4, 0.0))
    res = Engine(cfg, tr, executor=ex).run()
    loads = [r for r in ex.rows if r.dst == "gpu"]
    tr_req = res.tier_requests.set_index("request_id")
    assert loads and tr_req.loc[5, "host_hit_tokens"] == len(loads) * H
    assert tr_req.loc[5, "onload_wait_s"] == pytest.approx(0.05 * len(loads))
    assert tr_req.loc[5, "ttft_onload_s"] == pytest.approx(0.05 * len(loads))
