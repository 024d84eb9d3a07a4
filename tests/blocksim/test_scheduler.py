"""Scheduler: vLLM v0 step order, preemption victims, recompute to the front, swap-in before admission."""

from blocksim.memory.paged import BlockSpaceManager
from blocksim.config import SchedulerConfig
from blocksim.scheduling.scheduler import Scheduler
from blocksim.sequence import SeqStatus
from tests.blocksim.conftest import make_group


def make_sched(gpu_blocks=10, cpu_blocks=10, mode="auto", max_num_seqs=256, block_size=4):
    bm = BlockSpaceManager(block_size, gpu_blocks, cpu_blocks, watermark_blocks=0)
    return Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=4096,
                                     preemption_mode=mode), bm, max_model_len=4096)


def run_step(sched, t=0.0):
    out = sched.schedule()
    finished = sched.complete_step(out, t)
    return out, finished


def test_admits_in_order_and_prefills():
    s = make_sched()
    groups = [make_group(8, index=i) for i in range(3)]
    for g in groups:
        s.add_request(g)
    out, _ = run_step(s)
    assert [p.group for p in out.prefills] == groups and out.prefill_tokens == 24
    assert s.running == groups and not s.waiting


def test_newest_running_group_is_preempted_and_recomputed_to_the_front():
    s = make_sched(gpu_blocks=6)
    old, new = make_group(12, output=50, index=0), make_group(12, output=50, index=1, arrival_s=1.0)
    s.add_request(old)
    s.add_request(new)
    late = make_group(4, index=2, arrival_s=2.0)
    run_step(s)  # both prefilled: 3 + 3 blocks, none free
    s.add_request(late)
    out, _ = run_step(s)
    assert out.preempted == [new], "the newest running group is the victim"
    assert new.seqs[0].status is SeqStatus.WAITING and new.seqs[0].block_table == []
    assert s.waiting[0] is new and s.waiting[1] is late, "a recomputed group goes to the front of waiting"
    assert out.decode_groups == [old]
    assert not out.prefills, "the group preempted in this step is not re-admitted in the same step"


def test_last_running_group_preempts_itself():
    s = make_sched(gpu_blocks=3)
    g = make_group(12, output=50)
    s.add_request(g)
    run_step(s)
    out, _ = run_step(s)
    assert out.preempted == [g] and s.waiting[0] is g


def test_multi_sequence_group_is_swapped_and_swapped_in_before_admission():
    s = make_sched(gpu_blocks=8, cpu_blocks=20)
    a = make_group(8, output=30, n=2, index=0)
    b = make_group(8, output=30, n=2, index=1, arrival_s=1.0)
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    for _ in range(10):
        out, _ = run_step(s)
        if out.preempted:
            break
    assert out.preempted == [b] and out.blocks_to_swap_out and s.swapped == [b]
    waiting = make_group(4, index=2, arrival_s=2.0)
    s.add_request(waiting)
    swapped_in = False
    while s.running or s.swapped:
        out = s.schedule()
        if s.swapped:
            assert not out.prefills, "no admission while a group is swapped"
        swapped_in |= bool(out.blocks_to_swap_in)
        if [p.group for p in out.prefills] == [waiting]:
            assert swapped_in, "the swapped group came back before the waiting one was admitted"
            break
        s.complete_step(out, 0.0)
    assert swapped_in and waiting.status == "running"


def test_never_rejects_and_records_the_reason():
    s = make_sched(gpu_blocks=4)
    g = make_group(17, output=2)
    s.add_request(g)
    out, _ = run_step(s)
    assert out.rejected == [g] and g.status == "rejected" and "blocks" in g.reject_reason
    assert not s.has_unfinished()


def test_request_longer_than_the_model_is_rejected():
    s = make_sched()
    g = make_group(4000, output=100)
    s.add_request(g)
    out, _ = run_step(s)
    assert out.rejected == [g] and "max_model_len" in g.reject_reason


def test_max_num_seqs_limits_admission():
    s = make_sched(max_num_seqs=2)
    for i in range(3):
        s.add_request(make_group(4, index=i))
    out, _ = run_step(s)
    assert len(out.prefills) == 2 and len(s.waiting) == 1


def test_finish_frees_blocks():
    s = make_sched()
    g = make_group(4, output=3)
    s.add_request(g)
    t = 0.0
    while s.has_unfinished():
        t += 1
        run_step(s, t)
    assert g.status == "finished" and g.finish_s == 3.0 and g.first_token_s == 1.0
    assert s.bm.gpu.num_free == 10 and s.bm.gpu_filled_slots == 0
