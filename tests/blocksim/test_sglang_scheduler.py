"""SGLang's scheduler (blocksim.scheduling.sglang_scheduler, schedule_policy), scenario by
scenario as SGLang's schedule-policy and scheduler tests exercise it: queue orders, admission by
the new-token-ratio estimate, chunked prefill, the prefill and running-request limits, retraction."""

import pandas as pd
import pytest

from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.memory.radix_manager import RadixCacheManager
from blocksim.policies import make_memory_manager, make_scheduler
from blocksim.scheduling.schedule_policy import SchedulePolicy
from blocksim.sequence import SequenceGroup

H = 16


def group(i, prompt, output=8, hashes=None):
    return SequenceGroup(i, i, float(i), prompt, output, 1, 0, i, hashes)


def scheduler(num_tokens=4096, **knobs):
    cfg = build_config("sglang", num_gpu_blocks=num_tokens, **knobs)
    bm = make_memory_manager(cfg)
    bm.hash_block_tokens = H
    return make_scheduler(cfg, bm), bm


def run_steps(sched, n=1):
    outs = []
    for _ in range(n):
        out = sched.schedule()
        sched.complete_step(out, 0.0)
        outs.append(out)
    return outs


# --- queue orders --------------------------------------------------------------------------------
def test_fcfs_keeps_the_queue_and_lof_puts_the_longest_output_first():
    bm = RadixCacheManager(1, 100)
    q = [group(0, 5, 3), group(1, 5, 9), group(2, 5, 1)]
    SchedulePolicy("fcfs").calc_priority(q, bm)
    assert [g.index for g in q] == [0, 1, 2]
    SchedulePolicy("lof").calc_priority(q, bm)
    assert [g.index for g in q] == [1, 0, 2]


def test_random_order_is_reproducible_per_seed():
    bm = RadixCacheManager(1, 100)
    orders = []
    for _ in range(2):
        q = [group(i, 5) for i in range(8)]
        SchedulePolicy("random", seed=3).calc_priority(q, bm)
        orders.append([g.index for g in q])
    assert orders[0] == orders[1] and orders[0] != list(range(8))


def cached_tree():
    bm = RadixCacheManager(1, 1000)
    bm.hash_block_tokens = H
    g = group(99, 64, hashes=[1, 2, 3, 4])
    bm.match(g)
    bm.allocate(g)
    bm.cache_unfinished(g)
    return bm


def test_lpm_puts_the_longest_tree_match_first():
    bm = cached_tree()
    q = [group(0, 64, hashes=[7, 8, 9, 10]), group(1, 64, hashes=[1, 2, 9, 10]), group(2, 64, hashes=[1, 2, 3, 10])]
    matched = SchedulePolicy("lpm").calc_priority(q, bm)
    assert [g.index for g in q] == [2, 1, 0]
    assert [matched[g.seqs[0].seq_id] for g in q] == [48, 32, 0]


def test_lpm_holds_back_a_request_sharing_a_long_prefix_with_one_ahead_of_it():
    bm = cached_tree()
    q = [group(0, 64, hashes=[5, 6, 7, 8]), group(1, 64, hashes=[5, 6, 7, 9]), group(2, 64, hashes=[30, 31, 32, 33])]
    SchedulePolicy("lpm").calc_priority(q, bm)
    assert [g.index for g in q] == [0, 2, 1], "request 1 shares 48 tokens with request 0: it waits to hit them"


def test_dfs_weight_visits_the_heavier_subtree_first():
    bm = RadixCacheManager(1, 1000)
    bm.hash_block_tokens = H
    for i, hashes in enumerate(([1, 2], [3, 4])):
        g = group(90 + i, 32, hashes=hashes)
        bm.match(g)
        bm.allocate(g)
        bm.cache_unfinished(g)
    q = [group(0, 33, hashes=[1, 2, 5]), group(1, 33, hashes=[3, 4, 6]), group(2, 33, hashes=[3, 4, 7])]
    SchedulePolicy("dfs-weight").calc_priority(q, bm)
    assert [g.index for g in q][0] in (1, 2) and [g.index for g in q][2] == 0, "two requests under [3, 4]"


# --- admission -----------------------------------------------------------------------------------
def test_admission_counts_the_running_requests_estimated_outputs():
    sched, bm = scheduler(num_tokens=1000)
    sched.add_request(group(0, 100, output=800))
    run_steps(sched)  # admitted: 100 + 800 < 1000
    assert len(sched.running) == 1
    sched.add_request(group(1, 100, output=200))
    out = sched.schedule()
    # free 900 - 799 x 0.7 (the running request's estimate) = 340.7 > 100 + 200: admitted
    assert [p.group.index for p in out.prefills] == [1]


def test_a_request_that_does_not_fit_the_estimate_marks_the_batch_full_until_one_finishes():
    sched, bm = scheduler(num_tokens=1000)
    sched.add_request(group(0, 100, output=800))
    run_steps(sched)
    sched.add_request(group(1, 100, output=400))
    out = sched.schedule()
    assert not out.prefills and out.num_decode_seqs == 1 and sched.batch_is_full
    r0 = sched.init_new_token_ratio
    assert sched.new_token_ratio == pytest.approx(r0 - sched.new_token_ratio_decay), "one decode step's decay"
    assert sched.allows_span(), "nothing can be admitted before a request finishes: decode steps repeat"


def test_max_prefill_tokens_limits_a_batch_but_not_its_first_request():
    sched, _ = scheduler(max_prefill_tokens=150)
    for i in range(3):
        sched.add_request(group(i, 100 + 100 * (i == 0)))
    out = sched.schedule()
    assert [p.group.index for p in out.prefills] == [0], "the first (200 tokens) exceeds 150 alone"


def test_max_running_requests_caps_the_running_batch():
    sched, _ = scheduler(max_running_requests=2)
    for i in range(3):
        sched.add_request(group(i, 10))
    out = sched.schedule()
    assert len(out.prefills) == 2 and len(sched.waiting) == 1


def test_chunked_prefill_splits_a_long_prompt_into_chunks_of_the_budget():
    sched, _ = scheduler(chunked_prefill_size=128)
    sched.add_request(group(0, 300))
    spans = [(p.start, p.stop) for out in run_steps(sched, 3) for p in out.prefills]
    assert spans == [(0, 128), (128, 256), (256, 300)]
    assert sched.chunked_group is None and len(sched.running) == 1


def test_prefill_and_decode_never_share_a_step():
    sched, _ = scheduler()
    sched.add_request(group(0, 10))
    run_steps(sched)
    sched.add_request(group(1, 10))
    out = sched.schedule()
    assert out.prefills and not out.decode_groups


# --- retraction ----------------------------------------------------------------------------------
def test_retraction_takes_the_request_with_fewest_outputs_which_is_prefilled_again():
    trace = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [20, 20, 20],
                          "output_tokens": [60, 60, 60]})
    # an optimistic estimate admits each on arrival; 3 x 80 tokens exceed the 170-token pool
    cfg = build_config("sglang", num_gpu_blocks=170, init_new_token_ratio=0.01, chunked_prefill_size=-1)
    eng = Engine(cfg, trace, check_invariants=True)
    res = eng.run()
    r = res.requests
    assert res.summary["retractions"] >= 1 and (r.status == "finished").all()
    assert r.preemptions.iloc[2] >= 1, "the last admitted has the fewest outputs: retracted first"
    assert (r.recomputed_tokens[r.preemptions > 0] > 0).all(), "a retracted request is prefilled again"


# --- knobs and bad input -------------------------------------------------------------------------
@pytest.mark.parametrize("knob, value", [("schedule_policy", "lpm"), ("page_size", 16),
                                         ("chunked_prefill_size", 512), ("max_running_requests", 8)])
def test_an_sglang_knob_given_to_a_vllm_preset_is_refused_with_the_reason(knob, value):
    from blocksim.config import ConfigError
    with pytest.raises(ConfigError, match=r"SGLang server argument.*--policy sglang"):
        build_config("vllm", **{knob: value})


@pytest.mark.parametrize("knob, value, fix", [("block_size", 16, "--page-size"),
                                              ("max_num_seqs", 8, "--max-running-requests"),
                                              ("preemption", "swap", "retracts"), ("prefix_caching", True, "radix")])
def test_a_vllm_knob_given_to_the_sglang_preset_is_refused_naming_the_sglang_equivalent(knob, value, fix):
    from blocksim.config import ConfigError
    with pytest.raises(ConfigError, match=fix):
        build_config("sglang", **{knob: value})


def test_cli_refuses_a_page_size_that_does_not_divide_the_trace_hashes(tmp_path, capsys):
    from blocksim.cli import main
    path = tmp_path / "mooncake.jsonl"  # Mooncake's format: hash ids of 512-token blocks
    path.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": [1, 2]}\n')
    rc = main(["replay", str(path), "--out", str(tmp_path / "run"), "--policy", "sglang", "--page-size", "1024",
               "--quiet", "--no-report"])
    err = capsys.readouterr().err
    assert rc == 2 and "page_size (--page-size) 1024" in err and "512-token" in err and "Traceback" not in err
