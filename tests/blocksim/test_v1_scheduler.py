"""vLLM V1's scheduler: scenarios of vLLM v0.11's tests/v1/core/test_scheduler.py re-expressed, plus
end-to-end properties (invariants every step, spans equal to single steps) under vllm-v1."""

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocksim.config import PolicyConfig, SchedulerConfig
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.memory.kv_cache_manager import KVCacheManager
from blocksim.scheduling.v1_scheduler import V1PriorityScheduler, V1Scheduler
from blocksim.sequence import GroupStatus, SequenceGroup, SeqStatus

V1_POLICY = PolicyConfig(allocator="v1", scheduler="v1", prefix_caching=True, chunked_prefill=True)


def make_sched(num_blocks=10000, block_size=16, budget=8192, max_num_seqs=1024, threshold=0, caching=True,
               priority=False, max_model_len=8192):
    kv = KVCacheManager(block_size, num_blocks, max_model_len, caching)
    kv.hash_block_tokens = block_size
    cls = V1PriorityScheduler if priority else V1Scheduler
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          long_prefill_token_threshold=threshold)
    return cls(cfg, kv, max_model_len, V1_POLICY)


def group(index, prompt, output=20, priority=0, arrival_s=None, contents=None):
    return SequenceGroup(index, index, float(index if arrival_s is None else arrival_s), prompt, output, 1, priority,
                         index, prefix_hashes=contents)


def tokens(out):
    """{request_id: tokens scheduled} of one step."""
    d = {p.group.request_id: p.stop - p.start for p in out.prefills}
    d.update({g.request_id: 1 for g in out.decode_groups})
    return d


def step(sched, t=0.0):
    out = sched.schedule()
    sched.complete_step(out, t)
    return out


def test_every_request_that_fits_is_scheduled_whole():
    s = make_sched()
    for i in range(10):
        s.add_request(group(i, 10 + i))
    out = s.schedule()
    assert tokens(out) == {i: 10 + i for i in range(10)}
    assert len(s.running) == 10 and not s.waiting


def test_concurrent_partial_prefills_under_a_long_prefill_threshold():
    s = make_sched(budget=1024, threshold=400)
    for i in range(3):
        s.add_request(group(i, 800))
    assert tokens(step(s)) == {0: 400, 1: 400, 2: 224}
    assert tokens(step(s)) == {0: 400, 1: 400, 2: 224}, "running requests continue their prompts first"
    assert tokens(step(s)) == {0: 1, 1: 1, 2: 352}, "two decode, the third finishes its prompt"


def test_running_requests_spend_the_budget_before_waiting_ones():
    s = make_sched(budget=100)
    s.add_request(group(0, 30))
    s.add_request(group(1, 30))
    step(s)
    s.add_request(group(2, 500))
    out = step(s)
    assert tokens(out) == {0: 1, 1: 1, 2: 98}
    assert tokens(step(s)) == {0: 1, 1: 1, 2: 98}


def test_the_last_running_request_is_preempted_by_recompute_to_the_front():
    s = make_sched(num_blocks=9, block_size=4)  # 8 usable blocks
    a, b = group(0, 16, output=10), group(1, 16, output=10)
    s.add_request(a)
    s.add_request(b)
    step(s)  # 4 + 4 blocks; both sampled a token and now need a fifth block each
    b_blocks = list(b.seqs[0].block_table)
    late = group(2, 4)
    s.add_request(late)
    out = step(s)
    assert out.preempted == [b] and tokens(out) == {0: 1}
    assert list(s.waiting) == [b, late], "the victim goes to the front of waiting"
    assert b.status is GroupStatus.WAITING and b.seqs[0].block_table == [] and b.preemptions == 1
    assert late.status is GroupStatus.WAITING, "nothing is admitted in a step that preempted"
    assert a.seqs[0].block_table[-1] == b_blocks[-1], "b's blocks were freed tail first: a took its last"
    assert all(s.kv.pool.block_hash[x] is not None for x in b_blocks[:3]), "b's other blocks stay cached"
    out = step(s)  # b would hit 3 cached blocks but needs 5 free ones (3 leave the queue, 2 new); 3 are free
    assert tokens(out) == {0: 1} and list(s.waiting) == [b, late]


def test_the_last_running_request_that_cannot_grow_preempts_itself():
    s = make_sched(num_blocks=9, block_size=4)  # 8 usable blocks
    a, b = group(0, 15, output=10), group(1, 16, output=10)
    s.add_request(a)
    s.add_request(b)
    step(s)  # a's next token fits its fourth block, b's needs a fifth
    out = step(s)
    assert out.preempted == [b] and tokens(out) == {0: 1} and list(s.waiting) == [b]


def test_priority_policy_preempts_the_lowest_priority_and_returns_its_tokens():
    s = make_sched(num_blocks=9, block_size=4, priority=True)
    low, high = group(0, 15, output=10, priority=5), group(1, 16, output=10, priority=0)
    s.add_request(low)
    s.add_request(high)
    assert [g.request_id for g in s.waiting] == [1, 0], "waiting in (priority, arrival) order"
    step(s)
    assert s.running == [high, low]
    out = step(s)  # high needs a fifth block, low none: low goes
    assert out.preempted == [low] and tokens(out) == {1: 1}


def test_priority_victim_scheduled_earlier_in_the_step_gives_back_its_tokens():
    s = make_sched(num_blocks=9, block_size=4, priority=True)
    low, high = group(0, 14, output=10, priority=5), group(1, 16, output=10, priority=0)
    s.add_request(low)
    step(s)
    s.add_request(high)
    step(s)
    assert s.running == [low, high]
    out = step(s)  # low's token fits its 4th block; high needs a 5th: low is preempted after being scheduled
    assert out.preempted == [low] and tokens(out) == {1: 1} and out.num_decode_seqs == 1


def test_max_num_seqs_caps_the_running_queue():
    s = make_sched(max_num_seqs=2)
    for i in range(4):
        s.add_request(group(i, 8))
    assert set(tokens(step(s))) == {0, 1}


def test_identical_prompts_in_one_step_share_blocks_cached_at_scheduling():
    """V1 records a block's hash when it is scheduled, so a request scheduled later in the same step
    hits it: two identical 64-token prompts prefill 64 + 16 tokens (the hit stops before the last token)."""
    s = make_sched()
    s.add_request(group(0, 64, contents=[1, 2, 3, 4]))
    s.add_request(group(1, 64, contents=[1, 2, 3, 4]))
    out = step(s)
    assert out.prefill_tokens == 80 and tokens(out) == {0: 64, 1: 16}


def test_parallel_sampling_and_too_long_requests_are_rejected_with_a_reason():
    s = make_sched(num_blocks=5, block_size=4, max_model_len=64)
    n2 = SequenceGroup(0, 0, 0.0, 8, 4, 2, 0, 0)
    big = group(1, 16, output=8)  # 23 tokens of K/V need 6 blocks, 4 exist
    too_long = group(2, 60, output=10)
    for g in (n2, big, too_long):
        s.add_request(g)
    out = step(s)
    reasons = {g.request_id: g.reject_reason for g in out.rejected}
    assert "fans them out" in reasons[0] and "more than the cache's 4" in reasons[1] and "max_model_len" in reasons[2]


# --- end to end --------------------------------------------------------------------------------
requests = st.integers(1, 25).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=k, max_size=k),
    st.lists(st.integers(1, 150), min_size=k, max_size=k),
    st.lists(st.integers(1, 60), min_size=k, max_size=k),
    st.lists(st.integers(0, 3), min_size=k, max_size=k),
    st.lists(st.integers(0, 2), min_size=k, max_size=k),
))


def workload(lists, hash_tokens):
    arrivals, prompts, outputs, prefixes, prios = lists
    # prefix hashes: request i shares its first blocks with others of the same prefix id
    hashes = [[p * 1000 + j for j in range(-(-n // hash_tokens))] for p, n in zip(prefixes, prompts)]
    return pd.DataFrame({"arrival_s": np.cumsum(arrivals), "prompt_tokens": prompts, "output_tokens": outputs,
                         "priority": prios, "prefix_hashes": hashes})


class _Trace:
    def __init__(self, df, h):
        self.df, self.hash_block_tokens = df, h


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, blocks=st.integers(10, 60), block_size=st.sampled_from([2, 4, 16]),
       budget=st.sampled_from([8, 64, 2048]), threshold=st.sampled_from([0, 0, 24]),
       scheduler=st.sampled_from(["v1", "v1-priority"]), caching=st.booleans())
def test_vllm_v1_keeps_its_invariants_and_spans_equal_single_steps(lists, blocks, block_size, budget, threshold,
                                                                    scheduler, caching):
    trace = _Trace(workload(lists, 16), 16)
    cfg = build_config("vllm-v1", num_gpu_blocks=blocks, block_size=block_size, max_num_seqs=6,
                       max_num_batched_tokens=budget, long_prefill_token_threshold=threshold, scheduler=scheduler,
                       prefix_caching=caching)
    a = Engine(cfg, trace, check_invariants=True, spans=False).run()
    b = Engine(cfg, trace, spans=True).run()
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    r = a.requests
    assert set(r.status) <= {"finished", "rejected"}
    steps = a.steps
    mem = steps[["mem_token_states", "mem_reservation", "mem_internal_frag", "mem_external_frag", "mem_free"]]
    assert (mem.sum(axis=1) == blocks * block_size).all(), "the five memory categories sum to capacity"
    assert (steps.prefill_tokens + steps.num_decode_seqs <= budget).all(), "one token budget per step"
    assert (steps.running <= 6).all()
