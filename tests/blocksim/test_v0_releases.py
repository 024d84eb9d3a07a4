"""vLLM v0 releases (`v0_release`): prompt-only steps (0.2), swap-ins charged to the budget (0.4),
admission on uncached tokens (0.6.4); and prefix caching as vLLM v0 marks blocks computed (after
the step is scheduled) and reuses cached copies at swap-in."""

import dataclasses

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocksim.config import PolicyConfig, SchedulerConfig
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.memory.paged import BlockSpaceManager
from blocksim.memory.prefix_cache import PrefixCachingBlockManager
from blocksim.scheduling.scheduler import Scheduler
from blocksim.sequence import GroupStatus, SequenceGroup, SeqStatus

BS = 4


def make_sched(release="0.1", budget=4096, gpu_blocks=64, cpu_blocks=64, prefix=False, chunked=False):
    cls = PrefixCachingBlockManager if prefix else BlockSpaceManager
    bm = cls(BS, gpu_blocks, cpu_blocks, watermark_blocks=0)
    bm.hash_block_tokens = BS
    cfg = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=budget)
    policy = PolicyConfig(v0_release=release, prefix_caching=prefix, chunked_prefill=chunked)
    return Scheduler(cfg, bm, max_model_len=4096, policy=policy)


def group(index, prompt, output=20, n=1, keys=None):
    return SequenceGroup(index, index, float(index), prompt, output, n, 0, 10 * index, prefix_hashes=keys)


def step(s, t=0.0):
    out = s.schedule()
    s.complete_step(out, t)
    return out


def test_release_0_1_mixes_prefills_and_decodes_in_one_step():
    s = make_sched("0.1")
    s.add_request(group(0, 8))
    step(s)
    s.add_request(group(1, 8))
    out = step(s)
    assert out.prefills and out.decode_groups


def test_release_0_2_runs_prompt_only_steps():
    s = make_sched("0.2")
    a = group(0, 8)
    s.add_request(a)
    step(s)
    b = group(1, 8)
    s.add_request(b)
    out = step(s)
    assert [p.group for p in out.prefills] == [b] and not out.decode_groups, "a prompt step decodes nothing"
    out = step(s)
    assert not out.prefills and out.decode_groups == [a, b]


def test_a_budget_at_max_model_len_holds_a_prompt_back_only_with_mixed_steps():
    """With the budget equal to a prompt's length, 0.1 must wait for the running batch to drain;
    0.2's prompt-only step admits it at once (the difference the release knob exists for)."""
    for release, admitted in (("0.1", False), ("0.2", True)):
        s = make_sched(release, budget=64)
        s.add_request(group(0, 8, output=30))
        step(s)
        s.add_request(group(1, 64))
        out = step(s)
        assert bool(out.prefills) is admitted, release


def test_release_0_4_charges_swap_ins_to_the_token_budget():
    """A 2-token budget with a's decode already in it: 0.1 swaps b's two sequences in anyway,
    0.4 waits for a budget with room for their two tokens."""
    for release, swapped_in in (("0.1", True), ("0.4", False)):
        s = make_sched(release)
        a, b = group(0, 8), group(1, 8, n=2)
        s.add_request(a)
        s.add_request(b)
        step(s)
        s.running.remove(b)  # b goes to CPU, as a swap preemption sends it
        s.bm.swap_out(b)
        b.status = GroupStatus.SWAPPED
        s.swapped.append(b)
        s.config = dataclasses.replace(s.config, max_num_batched_tokens=2)
        out = s.schedule()
        assert out.decode_groups[0] is a and bool(out.blocks_to_swap_in) is swapped_in, release


def test_release_0_6_4_admits_on_uncached_tokens():
    """B shares 8 of its 10 blocks with A (computed a step earlier): 0.6.4 charges 40 - 32 = 8
    tokens and admits C beside it; 0.4 charges all 40 (vLLM 0.4-0.6.3 skip the cached prefix in
    the model runner, not in the budget) and C waits."""
    for release, both in (("0.4", False), ("0.6.4", True)):
        s = make_sched(release, budget=50, prefix=True)
        shared = list(range(8))
        s.add_request(group(0, 40, keys=shared + [100, 101]))
        step(s)
        b, c = group(1, 40, keys=shared + [200, 201]), group(2, 12, keys=[300, 301, 302])
        s.add_request(b)
        s.add_request(c)
        out = step(s)
        assert [p.group for p in out.prefills] == ([b, c] if both else [b]), release
        assert out.prefills[0].start == 32, "b's first 32 tokens are cached"


def test_a_hit_on_a_block_of_the_same_step_does_not_skip_its_prefill():
    """vLLM v0 marks blocks computed only once the step is scheduled: two identical 64-token
    prompts arriving together prefill 128 tokens; the same prompt a step later prefills 16."""
    s = make_sched(prefix=True, budget=4096)
    keys = list(range(16))
    a, b = group(0, 64, keys=keys), group(1, 64, keys=keys)
    s.add_request(a)
    s.add_request(b)
    out = step(s)
    assert out.prefill_tokens == 128
    assert b.seqs[0].block_table != a.seqs[0].block_table, "a's blocks are being computed: b takes its own"
    c = group(2, 64, keys=keys)
    s.add_request(c)
    out = step(s)
    assert [(p.start, p.stop) for p in out.prefills] == [(60, 64)], "all but the last block's tokens hit"
    s.bm.check_invariants(s.live_seqs())


def test_chunked_prefill_marks_only_the_chunks_written():
    """a's 40-token prompt in 16-token chunks: when b arrives, a's third chunk (blocks 8-9) is in
    the same step, so b skips the 32 tokens of blocks 0-7 and takes fresh blocks 8-9."""
    s = make_sched(prefix=True, budget=16, chunked=True)
    keys = list(range(10))
    a = group(0, 40, keys=keys)
    s.add_request(a)
    step(s)
    step(s)
    b = group(1, 40, keys=keys)
    s.add_request(b)
    out = step(s)
    assert [(p.group, p.start, p.stop) for p in out.prefills] == [(a, 32, 40), (b, 32, 40)]
    assert b.seqs[0].block_table[:8] == a.seqs[0].block_table[:8]
    assert not set(b.seqs[0].block_table[8:]) & set(a.seqs[0].block_table)
    s.bm.check_invariants(s.live_seqs())


def test_swap_in_reuses_the_cached_copies_of_its_blocks():
    bm = PrefixCachingBlockManager(BS, 16, 16, watermark_blocks=0)
    bm.hash_block_tokens = BS
    g = group(0, 16, n=2, keys=[1, 2, 3, 4])
    bm.allocate(g)
    bm.mark_blocks_as_computed()
    for s in g.seqs:  # the prompt step ran: each sequence sampled its first token
        s.status = SeqStatus.RUNNING
        s.num_tokens += 1
    before = list(g.seqs[0].block_table)
    out_map = bm.swap_out(g)
    assert set(out_map) == set(before)
    in_map = bm.swap_in(g)
    assert g.seqs[0].block_table == before, "the cached GPU copies waiting in the evictor come back"
    assert set(in_map.values()) == set(before) and bm.swap_in_reuses == 4 and bm.gpu.evictions == 0
    bm.check_invariants(g.seqs)


def test_release_knob_changes_nothing_for_0_1_and_runs_end_to_end():
    tr = pd.DataFrame({"arrival_s": [0.0, 0.01, 0.02, 0.5], "prompt_tokens": [100, 50, 300, 20],
                       "output_tokens": [40, 60, 10, 5]})
    base = Engine(build_config("vllm", num_gpu_blocks=40), tr).run()
    same = Engine(build_config("vllm", num_gpu_blocks=40, v0_release="0.1"), tr).run()
    pd.testing.assert_frame_equal(base.steps, same.steps)
    for release in ("0.2", "0.4", "0.6.4"):
        r = Engine(build_config("vllm-0.6", v0_release=release, num_gpu_blocks=40), tr, check_invariants=True).run()
        assert (r.requests.status == "finished").all()
        mixed = (r.steps.num_prefill_seqs > 0) & (r.steps.num_decode_seqs > 0)
        assert not mixed.any(), f"{release}: prompt-only steps"


requests = st.integers(1, 25).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=k, max_size=k),
    st.lists(st.integers(1, 120), min_size=k, max_size=k),
    st.lists(st.integers(1, 60), min_size=k, max_size=k),
    st.lists(st.sampled_from([1, 1, 2]), min_size=k, max_size=k),
    st.lists(st.integers(0, 3), min_size=k, max_size=k),
))


class _Trace:
    def __init__(self, df, h):
        self.df, self.hash_block_tokens = df, h


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, release=st.sampled_from(["0.1", "0.2", "0.4", "0.6.4"]), blocks=st.integers(10, 60),
       chunked=st.booleans(), mode=st.sampled_from(["auto", "swap"]), budget=st.sampled_from([None, 130]))
def test_releases_with_prefix_caching_keep_invariants_and_spans_equal_single_steps(lists, release, blocks, chunked,
                                                                                   mode, budget):
    arrivals, prompts, outputs, ns, prefixes = lists
    df = pd.DataFrame({"arrival_s": np.cumsum(arrivals), "prompt_tokens": prompts, "output_tokens": outputs, "n": ns,
                       "prefix_hashes": [[p * 100 + j for j in range(-(-n // 8))] for p, n in zip(prefixes, prompts)]})
    cfg = build_config("vllm-prefix", v0_release=release, num_gpu_blocks=blocks, block_size=4, max_num_seqs=6,
                       chunked_prefill=chunked, preemption=mode, swap_space_gib=1.0, watermark=0.0,
                       max_num_batched_tokens=budget)
    a = Engine(cfg, _Trace(df, 8), check_invariants=True, spans=False).run()
    b = Engine(cfg, _Trace(df, 8), spans=True).run()
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert set(a.requests.status) <= {"finished", "rejected"}
