"""The memory manager protocol, the scheduling budget, the decode fast path and the group statuses."""

import inspect

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.interfaces import MemoryBreakdown, MemoryManager
from blocksim.memory.blocks import BlockError
from blocksim.policies import make_memory_manager
from blocksim.scheduling.outputs import SchedulingBudget
from blocksim.sequence import GroupStatus
from tests.blocksim.conftest import make_group
from tests.blocksim.plugin_examples import general_path_only

CAPABILITIES = ("supports_swap", "uses_clock", "has_extents", "hashes_prefixes", "reserves_prefill",
                "allocates_on_append")
BUILT_IN = {  # name -> (preset, knobs, expected capabilities)
    "paged": ("vllm", {}, dict(supports_swap=True, uses_clock=False, has_extents=False, hashes_prefixes=False,
                               reserves_prefill=False, allocates_on_append=True)),
    "prefix": ("vllm-prefix", {}, dict(supports_swap=True, uses_clock=True, has_extents=False,
                                       hashes_prefixes=True, reserves_prefill=False, allocates_on_append=True)),
    "buddy": ("orca-pow2", {"address_space": "buddy"},
              dict(supports_swap=False, uses_clock=False, has_extents=True, hashes_prefixes=False,
                   reserves_prefill=True, allocates_on_append=False)),
    "first-fit": ("orca-oracle", {"address_space": "first-fit"},
                  dict(supports_swap=False, uses_clock=False, has_extents=True, hashes_prefixes=False,
                       reserves_prefill=True, allocates_on_append=False)),
}


def manager(name, blocks=32, block_size=4):
    preset, knobs, _ = BUILT_IN[name]
    return make_memory_manager(build_config(preset, num_gpu_blocks=blocks, block_size=block_size, **knobs))


def protocol_methods():
    return {n: f for n, f in vars(MemoryManager).items()
            if callable(f) and not n.startswith("_") and n not in CAPABILITIES}


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_every_built_in_manager_implements_the_protocol(name):
    bm = manager(name)
    assert isinstance(bm, MemoryManager), f"{type(bm).__name__} lacks a member of MemoryManager"
    for method, proto in protocol_methods().items():
        want = list(inspect.signature(proto).parameters)
        got = ["self", *inspect.signature(getattr(bm, method)).parameters]
        assert got == want, f"{type(bm).__name__}.{method}{got[1:]} differs from the protocol's {want[1:]}"
    flags = {c: getattr(bm, c) for c in CAPABILITIES}
    assert flags == BUILT_IN[name][2], f"{type(bm).__name__} declares {flags}"


def test_vllm_v1_manager_implements_the_protocol():
    bm = make_memory_manager(build_config("vllm-v1", num_gpu_blocks=32, block_size=4))
    assert isinstance(bm, MemoryManager)
    for method, proto in protocol_methods().items():
        want = list(inspect.signature(proto).parameters)
        got = ["self", *inspect.signature(getattr(bm, method)).parameters]
        assert got == want or method in V1_NOT_CALLED, f"KVCacheManager.{method}{got[1:]} differs from {want[1:]}"
    assert {c: getattr(bm, c) for c in CAPABILITIES} == dict(
        supports_swap=False, uses_clock=False, has_extents=False, hashes_prefixes=True, reserves_prefill=True,
        allocates_on_append=True)


#: vLLM v0 calls V1's scheduler never makes on its manager (they raise, whatever the arguments).
V1_NOT_CALLED = {"can_allocate", "allocate", "add_filled", "can_append_slots", "append_slots", "can_swap_out",
                 "swap_out", "can_swap_in", "swap_in"}


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_memory_breakdown_adds_up_to_capacity_with_a_group_resident(name):
    bm = manager(name, blocks=32, block_size=4)
    empty = bm.memory_breakdown(None, 0)
    assert isinstance(empty, MemoryBreakdown) and empty.free == 32 * 4 and sum(empty) == 32 * 4
    g = make_group(10, output=5)
    bm.allocate(g)
    for s in g.seqs:
        s.status = s.status.RUNNING
    mem = bm.memory_breakdown(make_group(100, index=1), 0)
    assert mem.token_states == 10 and sum(mem) == 32 * 4, f"{mem} does not add up to 128 slots"
    assert bm.num_gpu_blocks_used > 0 and bm.num_free_gpu_blocks < 32


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_capability_flags_match_what_the_manager_does(name):
    bm = manager(name)
    g = make_group(8, output=5)
    bm.allocate(g)
    for s in g.seqs:
        s.status = s.status.RUNNING
    assert bm.can_swap_out(g) is (bm.supports_swap and bm.num_total_cpu_blocks > 0)
    if bm.has_extents:
        assert bm.free_extents().sum() <= 32 * 4
    else:
        with pytest.raises(BlockError):
            bm.free_extents()
    before = bm.num_gpu_blocks_used
    seq = g.seqs[0]
    seq.num_tokens += 4  # four more decoded tokens: one block boundary crossed
    bm.append_span_slots(g.seqs, 4, [0] if bm.allocates_on_append else [])
    grew = bm.num_gpu_blocks_used - before
    assert grew == (1 if bm.allocates_on_append else 0)
    assert bm.stats() == ({"prefix_cache_hits": 0, "prefix_cache_queries": 0, "prefix_cache_evictions": 0,
                           "prefix_saved_tokens": 0, "swap_in_cache_reuses": 0} if bm.hashes_prefixes else {})


def test_budget_counts_tokens_and_sequences_and_refuses_past_either_limit():
    b = SchedulingBudget(token_budget=10, max_num_seqs=3)
    assert b.can_schedule(num_new_tokens=10, num_new_seqs=3)
    assert not b.can_schedule(num_new_tokens=11, num_new_seqs=1), "one token over the budget"
    assert not b.can_schedule(num_new_tokens=1, num_new_seqs=4), "one sequence over max_num_seqs"
    b.add_num_batched_tokens(8)
    b.add_num_seqs(2)
    assert b.remaining_token_budget() == 2
    assert b.can_schedule(num_new_tokens=2, num_new_seqs=1) and not b.can_schedule(num_new_tokens=3, num_new_seqs=0)
    assert b.can_schedule_seqs(1) and not b.can_schedule_seqs(2)
    b.add_num_batched_tokens(5)  # decodes are never refused for tokens: the budget goes negative
    assert b.remaining_token_budget() == -3 and b.can_schedule_seqs(1)
    assert not b.can_schedule(num_new_tokens=0, num_new_seqs=0)
    b.subtract_num_batched_tokens(5)
    b.subtract_num_seqs(2)
    assert (b.num_batched_tokens, b.num_curr_seqs) == (8, 0)


requests = st.integers(1, 20).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=k, max_size=k),
    st.lists(st.integers(1, 100), min_size=k, max_size=k),
    st.lists(st.integers(1, 60), min_size=k, max_size=k),
    st.lists(st.sampled_from([1, 1, 2]), min_size=k, max_size=k),
))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, blocks=st.integers(8, 60), mode=st.sampled_from(["auto", "recompute", "swap"]),
       victim=st.sampled_from(["newest", "largest", "fewest-blocks"]), chunked=st.booleans())
def test_the_decode_fast_path_matches_the_general_path(lists, blocks, mode, victim, chunked):
    arrivals, prompts, outputs, ns = lists
    trace = pd.DataFrame({"arrival_s": np.cumsum(arrivals), "prompt_tokens": prompts, "output_tokens": outputs,
                          "n": ns})
    cfg = build_config("vllm-chunked" if chunked else "vllm", num_gpu_blocks=blocks, block_size=4, max_num_seqs=6,
                       swap_space_gib=1.0, preemption=mode, victim=victim,
                       max_num_batched_tokens=48 if chunked else None)
    fast = Engine(cfg, trace, spans=False, check_invariants=True).run()
    slow = Engine(cfg, trace, spans=False, block_manager=general_path_only).run()
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)


def test_requests_parquet_status_holds_plain_strings(tmp_path):
    trace = pd.DataFrame({"arrival_s": [0.0, 0.1], "prompt_tokens": [8, 5000], "output_tokens": [4, 4]})
    res = Engine(build_config("vllm", num_gpu_blocks=40, block_size=4), trace).run()
    res.save(tmp_path)
    status = pd.read_parquet(tmp_path / "requests.parquet").status.tolist()
    assert status == ["finished", "rejected"] and all(type(s) is str for s in status)
    assert {s.value for s in GroupStatus} == {"pending", "waiting", "running", "swapped", "finished", "rejected",
                                              "held"}
