"""Policies: presets, plug-ins, allocator invariants, prefix caching, chunked prefill, baselines' order."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocksim.config import ConfigError
from blocksim.engine import Engine
from blocksim.policies import PRESETS
from blocksim.memory.prefix_cache import CachingBlockAllocator
from blocksim.experiments.runner import build_config
from traces.lengths import Fixed, LogNormal, Uniform
from traces.synth import shared_prefix_trace, synth_trace

MEM = ["mem_token_states", "mem_reservation", "mem_internal_frag", "mem_external_frag", "mem_free"]

requests = st.integers(1, 20).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=k, max_size=k),
    st.lists(st.integers(1, 100), min_size=k, max_size=k),
    st.lists(st.integers(1, 60), min_size=k, max_size=k),
    st.lists(st.sampled_from([1, 1, 2]), min_size=k, max_size=k),
    st.lists(st.integers(0, 2), min_size=k, max_size=k),
))


def frame(lists):
    arrivals, prompts, outputs, ns, prios = lists
    return pd.DataFrame({"arrival_s": np.cumsum(arrivals), "prompt_tokens": prompts, "output_tokens": outputs,
                         "n": ns, "priority": prios})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, preset=st.sampled_from(sorted(PRESETS)), blocks=st.integers(12, 60),
       victim=st.sampled_from(["newest", "largest", "fewest-blocks"]),
       scheduler=st.sampled_from([None, "priority", "sjf"]), address=st.sampled_from(["buddy", "first-fit"]))
def test_every_policy_conserves_memory_and_loses_no_request(lists, preset, blocks, victim, scheduler, address):
    allocator = PRESETS[preset].get("allocator")
    contiguous = allocator == "contiguous"  # orca-* and static: never preempt
    if allocator == "v1":  # vLLM V1: no victim choice and no swap space; its own priority policy
        knobs = {"scheduler": "v1-priority"} if scheduler else {}
    elif allocator == "radix":  # SGLang: its own knobs (tests/blocksim/test_sglang_engine.py varies them)
        cfg = build_config(preset, num_gpu_blocks=blocks * 4, max_running_requests=6)
        res = Engine(cfg, frame(lists).assign(n=1), check_invariants=True).run()
        assert set(res.requests.status) <= {"finished", "rejected"}
        assert (res.steps[MEM].sum(axis=1) == blocks * 4).all(), "the five categories sum to capacity"
        assert (res.steps[MEM] >= 0).all().all()
        return
    else:
        knobs = {"address_space": address} if contiguous else {"victim": victim, "swap_space_gib": 1.0}
        if scheduler and not contiguous:
            knobs["scheduler"] = scheduler
    cfg = build_config(preset, num_gpu_blocks=blocks, block_size=4, max_num_seqs=6, **knobs)
    res = Engine(cfg, frame(lists), check_invariants=True).run()  # allocator invariants after every step
    assert set(res.requests.status) <= {"finished", "rejected"}
    assert (res.steps[MEM].sum(axis=1) == blocks * 4).all(), "the five categories sum to capacity"
    assert (res.steps[MEM] >= 0).all().all()


def test_chunked_prefill_never_exceeds_its_token_budget():
    tr = pd.DataFrame({"arrival_s": np.linspace(0, 1, 40), "prompt_tokens": np.full(40, 700),
                       "output_tokens": np.full(40, 30)})
    cfg = build_config("vllm-chunked", max_num_batched_tokens=256, num_gpu_blocks=2000)
    res = Engine(cfg, tr, check_invariants=True).run()
    per_step = res.steps.prefill_tokens + res.steps.num_decode_seqs
    assert per_step.max() <= 256
    assert (res.steps.prefill_tokens > 0).sum() >= 40 * 700 / 256, "prompts were split into chunks"
    assert (res.requests.status == "finished").all()


def test_prefix_cache_evicts_least_recent_then_deepest():
    a = CachingBlockAllocator(4)
    blocks = [a.allocate() for _ in range(4)]
    for depth, b in enumerate(blocks):
        a.register(b, key=100 + depth, depth=depth)
    a.clock = 1.0
    a.free(blocks[0])
    a.free(blocks[1])  # same time, deeper
    a.clock = 2.0
    a.free(blocks[2])
    assert a.num_free == 3
    assert a.allocate() == blocks[1], "ties in time go to the deepest block"
    assert a.allocate() == blocks[0]
    a.reuse(blocks[2])  # a hit takes it out of the evictor
    with pytest.raises(Exception, match="out of blocks"):
        a.allocate()
    assert a.evictions == 2 and 101 not in a.block_of


def test_prefix_caching_reuses_shared_prompts_and_skips_their_prefill():
    tr = shared_prefix_trace(30, rate_per_s=5.0, prefix_tokens=512, suffix=Fixed(64), output=Fixed(20),
                             hash_block_tokens=16, seed=3)
    plain = Engine(build_config("vllm", num_gpu_blocks=400), tr, check_invariants=True).run()
    cached = Engine(build_config("vllm-prefix", num_gpu_blocks=400), tr, check_invariants=True).run()
    s = cached.summary
    assert s["prefix_cache_hits"] >= 29 * 512 // 16, "every request after the first hits the shared prefix"
    assert cached.steps.t_attn_prefill_s.sum() < plain.steps.t_attn_prefill_s.sum()
    assert plain.steps.prefill_tokens.sum() == 30 * (512 + 64)
    assert cached.steps.prefill_tokens.sum() == (512 + 64) + 29 * 64, \
        "the first request computes its whole prompt, every later one only its 64-token suffix"
    assert (cached.requests.status == "finished").all() and len(cached.requests) == 30


def test_paged_beats_every_reservation_baseline_on_a_sharegpt_like_workload():
    tr = synth_trace(300, rate_per_s=2.0, prompt=LogNormal(161, 1.2, 1500), output=LogNormal(338, 1.0, 1500), seed=1)
    share = {}
    for preset in ("vllm", "orca-oracle", "orca-pow2", "orca-max"):
        st_ = Engine(build_config(preset, model="opt-13b", gpu="a100-40gb"), tr).run().steps
        used = st_[MEM[:4]].sum(axis=1)  # memory not free
        w = st_.duration_s
        share[preset] = float((st_.mem_token_states * w).sum() / (used * w).sum())
    assert share["vllm"] > share["orca-oracle"] > share["orca-pow2"] > share["orca-max"], share


def test_priority_preempts_lower_priority_running_groups():
    tr = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.2], "prompt_tokens": [64, 64, 64],
                       "output_tokens": [120, 120, 10], "priority": [0, 0, 5]})
    cfg = build_config("vllm", scheduler="priority", num_gpu_blocks=13, block_size=16, watermark=0.0)
    res = Engine(cfg, tr, check_invariants=True).run()
    r = res.requests.set_index("request_id")
    assert (r.status == "finished").all()
    assert r.loc[2, "queue_s"] < 0.05, "the urgent request is admitted at once"
    assert r.loc[1, "preemptions"] >= 1, "by preempting the lower-priority newest running group"
    assert r.loc[2, "finish_s"] < r.loc[1, "finish_s"]


def test_sjf_admits_the_shortest_output_first():
    tr = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.0], "prompt_tokens": [16, 16, 16], "output_tokens": [50, 5, 20]})
    res = Engine(build_config("vllm", scheduler="sjf", max_num_seqs=1, num_gpu_blocks=50), tr).run()
    order = res.requests.sort_values("first_token_s").output_tokens.tolist()
    assert order == [5, 20, 50]


def test_static_batching_waits_for_the_longest_request():
    tr = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.01], "prompt_tokens": [16, 16, 16], "output_tokens": [5, 50, 5]})
    res = Engine(build_config("static", num_gpu_blocks=2000), tr, check_invariants=True).run()
    r = res.requests
    assert r.finish_s.iloc[0] == r.finish_s.iloc[1], "a batch's responses return together"
    assert r.first_scheduled_s.iloc[2] >= r.finish_s.iloc[1], "the next batch starts after the last one ends"
    first_batch = res.steps[res.steps.start_s < r.finish_s.iloc[1]]
    decodes = first_batch.num_decode_seqs.iloc[1:]
    assert (decodes == 2).all(), "the finished request is computed as padding until the batch ends"


def test_unknown_names_and_incompatible_knobs_are_refused_with_reasons():
    with pytest.raises(ConfigError, match="known presets: vllm"):
        build_config("vllm-turbo")
    with pytest.raises(ConfigError, match="unknown scheduler 'lottery'; known: fcfs"):
        build_config("vllm", scheduler="lottery")
    with pytest.raises(ConfigError, match="contiguous allocator"):
        build_config("orca-max", prefix_caching=True)
    with pytest.raises(ConfigError, match="chunked prefill needs continuous batching"):
        build_config("static", chunked_prefill=True)
    with pytest.raises(ConfigError, match="never preempts"):
        build_config("vllm", scheduler="orca")


#: (preset, knobs the user sets, the flag named, why): a knob the chosen allocator or scheduler ignores.
IGNORED_KNOBS = [
    ("orca-max", {"watermark": 0.02}, "--watermark", "contiguous allocator"),
    ("orca-pow2", {"watermark_blocks": 5}, "--watermark-blocks", "contiguous allocator"),
    ("static", {"free_order": "fifo"}, "--free-order", "contiguous allocator"),
    ("orca-oracle", {"prefix_caching": False}, "--prefix-caching", "contiguous allocator"),
    ("orca-max", {"victim": "largest"}, "--victim", "scheduler 'orca' never preempts"),
    ("static", {"preemption": "swap"}, "--preemption", "scheduler 'static' never preempts"),
    ("vllm", {"reservation": "pow2"}, "--reservation", "paged allocator"),
    ("vllm-prefix", {"address_space": "first-fit"}, "--address-space", "paged allocator"),
    ("vllm", {"allocator": "contiguous", "scheduler": "orca", "watermark": 0.0}, "--watermark",
     "contiguous allocator"),
    ("vllm-v1", {"watermark": 0.02}, "--watermark", "follows vLLM V1, whose KV cache manager has no watermark"),
    ("vllm-v1", {"free_order": "fifo"}, "--free-order", "follows vLLM V1"),
    ("vllm-v1", {"swap_space_gib": 8.0}, "--swap-space-gib", "follows vLLM V1"),
    ("vllm-v1", {"preemption": "swap"}, "--preemption", "preempts only the last running request by recomputation"),
    ("vllm-v1", {"victim": "largest"}, "--victim", "follows vLLM V1"),
    ("vllm", {"long_prefill_token_threshold": 64}, "--long-prefill-token-threshold", "not vLLM V1's engine"),
    ("orca-max", {"long_prefill_token_threshold": 64}, "--long-prefill-token-threshold", "not vLLM V1's engine"),
]


@pytest.mark.parametrize("preset, knobs, flag, why", IGNORED_KNOBS)
def test_a_knob_the_chosen_allocator_or_scheduler_ignores_is_refused_with_the_reason(preset, knobs, flag, why):
    with pytest.raises(ConfigError) as e:
        build_config(preset, **knobs)
    message = str(e.value)
    assert why in message and f"drop {flag}, or choose a " in message and "\n" not in message, message


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_no_preset_and_no_knob_its_parts_read_is_refused(preset):
    build_config(preset)  # a preset's own values and the defaults are never refused
    if PRESETS[preset].get("allocator") == "contiguous":
        cfg = build_config(preset, reservation="oracle", address_space="first-fit", swap_space_gib=1.0)
        assert (cfg.policy_config.reservation, cfg.policy_config.address_space) == ("oracle", "first-fit")
    elif PRESETS[preset].get("allocator") == "v1":
        cfg = build_config(preset, long_prefill_token_threshold=64, prefix_caching=False, scheduler="v1-priority")
        assert cfg.scheduler.long_prefill_token_threshold == 64 and not cfg.policy_config.prefix_caching
    elif PRESETS[preset].get("allocator") == "radix":
        cfg = build_config(preset, schedule_policy="lpm", page_size=16, chunked_prefill_size=-1,
                           max_running_requests=8, init_new_token_ratio=0.5)
        assert (cfg.cache.block_size, cfg.policy_config.schedule_policy) == (16, "lpm")
    else:
        cfg = build_config(preset, watermark=0.0, watermark_blocks=2, free_order="fifo", victim="largest",
                           preemption="swap")
        assert cfg.watermark_blocks == 2 and cfg.policy_config.victim == "largest"


def test_plugin_schedulers_declare_nothing_so_no_knob_is_refused_for_them():
    cfg = build_config("vllm", scheduler="tests.blocksim.plugin_examples:LongestPromptFirst", victim="largest",
                       preemption="recompute")
    assert cfg.policy_config.victim == "largest" and cfg.scheduler.preemption_mode == "recompute"


def test_plugins_load_by_module_path_and_failures_say_which_part():
    tr = pd.DataFrame({"arrival_s": [0.0, 0.0], "prompt_tokens": [10, 90], "output_tokens": [3, 3]})
    cfg = build_config("vllm", scheduler="tests.blocksim.plugin_examples:LongestPromptFirst",
                       victim="tests.blocksim.plugin_examples:oldest_victim", max_num_seqs=1, num_gpu_blocks=50)
    res = Engine(cfg, tr).run()
    assert res.requests.sort_values("first_token_s").prompt_tokens.tolist() == [90, 10]
    with pytest.raises(ConfigError, match="cannot import module 'no_such_pkg.mod'"):
        Engine(build_config("vllm", scheduler="no_such_pkg.mod:X"), tr)
    with pytest.raises(ConfigError, match="has no attribute 'Nope'"):
        Engine(build_config("vllm", scheduler="tests.blocksim.plugin_examples:Nope"), tr)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(2, 25), prefix=st.sampled_from([0, 16, 40, 64, 128]), suffix=st.integers(0, 40),
       n_prefixes=st.integers(1, 3), chunked=st.booleans(), blocks=st.integers(16, 80), n=st.sampled_from([1, 2]),
       seed=st.integers(0, 5))
def test_prefix_caching_keeps_memory_exact_with_and_without_chunked_prefill(count, prefix, suffix, n_prefixes,
                                                                           chunked, blocks, n, seed):
    tr = shared_prefix_trace(count, rate_per_s=20.0, prefix_tokens=prefix, suffix=Uniform(1, suffix + 1),
                             output=Fixed(12), n_prefixes=n_prefixes, n=n, hash_block_tokens=16, seed=seed)
    cfg = build_config("vllm-prefix", chunked_prefill=chunked, max_num_batched_tokens=48 if chunked else None,
                       num_gpu_blocks=blocks, block_size=16, max_num_seqs=6, swap_space_gib=1.0)
    res = Engine(cfg, tr, check_invariants=True).run()  # recounts filled slots and references every step
    assert set(res.requests.status) <= {"finished", "rejected"}
    assert (res.steps[MEM].sum(axis=1) == blocks * 16).all()
    if chunked:
        assert (res.steps.prefill_tokens + res.steps.num_decode_seqs).max() <= 48
