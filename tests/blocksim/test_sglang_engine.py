"""The sglang preset end to end on random workloads with shared prefixes: nothing lost, the pool
conserved after every step, spans equal to single steps, plans that validate."""

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from tests.blocksim.workloads import family_trace

H = 16  # tokens per prefix hash


def workload(arrivals, prompts, outputs, families):
    """Prompts sharing hash blocks within a family (family f, block j -> hash f * 100 + j)."""
    return family_trace(arrivals, prompts, outputs, families, hash_tokens=H, family_stride=100)


requests = st.integers(1, 25).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=k, max_size=k),
    st.lists(st.integers(1, 120), min_size=k, max_size=k),
    st.lists(st.integers(1, 80), min_size=k, max_size=k),
    st.lists(st.integers(0, 3), min_size=k, max_size=k),
))
knobs = st.fixed_dictionaries({
    "page_size": st.sampled_from([1, 2, 4, 16]),
    "schedule_policy": st.sampled_from(["fcfs", "lpm", "dfs-weight", "lof", "random"]),
    "chunked_prefill_size": st.sampled_from([-1, 16, 64, 8192]),
    "max_prefill_tokens": st.sampled_from([64, 16384]),
    "max_running_requests": st.sampled_from([None, 3]),
    "init_new_token_ratio": st.sampled_from([0.05, 0.7]),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, tokens=st.integers(150, 1200), knobs=knobs)
def test_every_request_finishes_or_is_rejected_and_the_pool_is_conserved(lists, tokens, knobs):
    trace = workload(*lists)
    ps = knobs["page_size"]
    cfg = build_config("sglang", num_gpu_blocks=tokens // ps, **knobs)
    res = Engine(cfg, trace, check_invariants=True).run()  # pages, locks and counters recounted every step
    r = res.requests
    assert set(r.status) <= {"finished", "rejected"} and len(r) == len(trace)
    assert (r.reject_reason[r.status == "rejected"] != "").all()
    mem = res.steps[["mem_token_states", "mem_reservation", "mem_internal_frag", "mem_external_frag", "mem_free"]]
    assert (mem.sum(axis=1) == (tokens // ps) * ps).all(), "the five memory categories sum to capacity"
    assert res.summary["radix_hit_tokens"] <= res.summary["radix_query_tokens"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, tokens=st.integers(150, 1200), knobs=knobs)
def test_spans_give_exactly_the_single_step_result(lists, tokens, knobs):
    trace = workload(*lists)
    cfg = build_config("sglang", num_gpu_blocks=tokens // knobs["page_size"], **knobs)
    a = Engine(cfg, trace, spans=True).run()
    b = Engine(cfg, trace, spans=False).run()
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert {k: v for k, v in a.summary.items() if k != "wall_s"} == {k: v for k, v in b.summary.items() if k != "wall_s"}


def test_shared_prefixes_are_hit_and_save_prompt_tokens():
    trace = workload([0.0] + [0.2] * 7, [100] * 8, [5] * 8, [1] * 8)
    res = Engine(build_config("sglang", num_gpu_blocks=2000), trace).run()
    # each later request matches all but its last prompt token (SGLang computes at least one token)
    assert res.summary["radix_hit_tokens"] == 7 * 99
    assert res.steps.prefill_tokens.sum() == 100 + 7 * 1


@pytest.mark.parametrize("page_size", [16])
def test_plans_of_the_sglang_preset_validate_on_the_reference_backend(tmp_path, page_size):
    pytest.importorskip("torch")
    from validation.validate import validate_run
    trace = workload([0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], [70, 90, 40, 120, 64, 100, 33], [60, 50, 60, 45, 50, 40, 30],
                     [1, 1, 2, 1, 2, 1, 3])
    cfg = build_config("sglang", num_gpu_blocks=296 // page_size, page_size=page_size, chunked_prefill_size=32,
                       init_new_token_ratio=0.05)
    res = Engine(cfg, trace, plan_dir=tmp_path).run()
    assert res.summary["radix_hit_tokens"] > 0, "the scenario must share prefixes"
    assert res.summary["retractions"] > 0, "the scenario must retract"
    s = validate_run(tmp_path, "reference", layers=1, kv_heads=1, heads=2, head_size=32)
    assert s["ok"], s["error"]
    assert s["steps_checked"] == s["steps_in_plan"] > 0
