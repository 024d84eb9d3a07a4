"""validation.model: the forward pass over a paged cache, on the CPU with a tiny model (and on a GPU
with the gpu marker): a token decoded after a prefill, a prompt split in chunks and a prompt run
whole give the same cache contents and the same sampled token; CUDA-graph replays match eager."""
from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from validation.model import (GRAPH_BATCH_SIZES, EventTimer, ModelDims, ModelRunner, PrefillSeq,  # noqa: E402
                              SegmentTimer, StepBatch, padded_batch_size)

TINY = ModelDims("tiny", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_size=64,
                 intermediate_size=256, vocab_size=512, max_model_len=256)
BS = 16


def runner(prefill="sdpa", device="cpu", dtype="float32", **kw):
    return ModelRunner(TINY, num_blocks=32, num_cpu_blocks=8, block_size=BS, dtype=dtype, device=device,
                       prefill=prefill, **kw)


def prefill(r, ids, table, lo, hi, sample=True):
    p = np.arange(lo, hi)
    b = StepBatch(ids[lo:hi], p, table[p // BS] * BS + p % BS, [PrefillSeq(lo, hi, table, sample)])
    return r.forward(r.prepare(b))


def decode(r, ids, tables, positions):
    ids_ = np.asarray([ids[i][p] for i, p in enumerate(positions)])
    pos = np.asarray(positions)
    slots = np.asarray([t[p // BS] * BS + p % BS for t, p in zip(tables, positions)])
    b = StepBatch(ids_, pos, slots, [], [t[: -(-(p + 1) // BS)] for t, p in zip(tables, positions)], pos + 1)
    return b


@pytest.mark.parametrize("impl", ["sdpa", "kernel", "wgmma"])
def test_decode_after_prefill_and_chunks_match_a_whole_prompt(impl):
    ids = np.random.default_rng(0).integers(0, TINY.vocab_size, 40)
    table = np.arange(3, 11)
    n = 37
    whole = runner(impl)
    t_whole = prefill(whole, ids, table, 0, n + 1)
    stepped = runner(impl)
    prefill(stepped, ids, table, 0, n)
    t_dec = stepped.forward(stepped.prepare(decode(stepped, [ids], [table], [n])))
    chunked = runner(impl)
    prefill(chunked, ids, table, 0, 20, sample=False)
    t_chunk = prefill(chunked, ids, table, 20, n + 1)
    assert t_whole.tolist() == t_dec.tolist() == t_chunk.tolist()
    for j in range(TINY.num_layers):
        for other in (stepped, chunked):
            torch.testing.assert_close(other.k_caches[j], whole.k_caches[j], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(other.v_caches[j], whole.v_caches[j], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_priming_or_repeating_a_step_changes_neither_its_tokens_nor_the_caches(device):
    """`prime` (the first layer of a new shape, untimed) rewrites what the step itself writes: the
    step after it samples the same tokens and leaves the same caches as the step alone. So does
    the step run a second time (the executor times a step again when a segment was late)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU")
    ids = np.random.default_rng(5).integers(0, TINY.vocab_size, 60)
    table = np.arange(2, 10)
    dtype = "float32" if device == "cpu" else "float16"
    runs = []
    for mode in ("alone", "primed", "twice"):
        r = runner("kernel", device=device, dtype=dtype)
        prefill(r, ids, table, 0, 30, sample=False)  # an earlier chunk in the cache
        p = np.arange(30, 55)
        inp = r.prepare(StepBatch(ids[30:55], p, table[p // BS] * BS + p % BS, [PrefillSeq(30, 55, table)]))
        if mode == "primed":
            r.prime(inp)
        first = r.forward(inp).tolist()
        if mode == "twice":
            assert r.forward(inp).tolist() == first
        runs.append((first, r))
    assert runs[0][0] == runs[1][0] == runs[2][0]
    for j in range(TINY.num_layers):
        for other in runs[1:]:
            assert torch.equal(runs[0][1].k_caches[j], other[1].k_caches[j])
            assert torch.equal(runs[0][1].v_caches[j], other[1].v_caches[j])
    alone = runner("kernel", device=device, dtype=dtype)  # priming alone writes the first layer only
    prefill(alone, ids, table, 0, 30, sample=False)
    alone.prime(inp)
    blk, off = torch.as_tensor(table[p // BS]), torch.as_tensor(p % BS)
    assert torch.equal(alone.k_caches[0][blk, off].cpu(), runs[0][1].k_caches[0][blk, off].cpu())
    assert not alone.k_caches[1][blk, off].any() and runs[0][1].k_caches[1][blk, off].any()


def test_sample_indices_are_last_prompt_tokens_then_every_decode():
    b = StepBatch(np.zeros(9, np.int64), np.zeros(9, np.int64), np.zeros(9, np.int64),
                  [PrefillSeq(0, 4, np.zeros(1)), PrefillSeq(8, 11, np.zeros(1), sample=False)],
                  [np.zeros(1), np.zeros(1)], np.asarray([3, 5]))
    assert b.sample_indices().tolist() == [3, 7, 8]


def test_padded_batch_sizes_are_vllms():
    assert GRAPH_BATCH_SIZES[:5] == (1, 2, 4, 8, 16) and GRAPH_BATCH_SIZES[-1] == 256
    assert padded_batch_size(3) == 4 and padded_batch_size(9) == 16 and padded_batch_size(257) is None


def test_swap_out_and_in_round_trips_blocks():
    r = runner()
    ids = np.arange(40) % TINY.vocab_size
    table = np.arange(0, 3)
    prefill(r, ids, table, 0, 40)
    before = [c.clone() for c in r.k_caches]
    r.swap(np.asarray([[0, 5], [1, 6]]), to_gpu=False)
    r.swap(np.asarray([[5, 20], [6, 21]]), to_gpu=True)
    r.copy(np.asarray([[2, 22]]))
    for j in range(TINY.num_layers):
        torch.testing.assert_close(r.k_caches[j][20:23], before[j][0:3])


def test_weight_and_block_sizes_follow_the_dimensions():
    h, i = TINY.hidden_size, TINY.intermediate_size
    per_layer = h * (4 + 4) * 64 + 4 * 64 * h + 3 * h * i + 2 * h
    assert TINY.weight_bytes(2) == 2 * (2 * per_layer + 2 * 512 * h + h)
    assert TINY.kv_block_bytes(16, 2) == 2 * 2 * 16 * 2 * 64 * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("attention", ["fast", "vllm"])
def test_graph_replay_matches_eager_decode(dtype, attention):
    r = ModelRunner(TINY, num_blocks=64, block_size=BS, dtype=dtype, device="cuda", attention=attention)
    rng = np.random.default_rng(1)
    lens = [5, 17, 40, 100, 3]
    tables = [np.arange(8 * i, 8 * i + 8) for i in range(len(lens))]
    ids = [rng.integers(0, TINY.vocab_size, 128) for _ in lens]
    for t, n, x in zip(tables, lens, ids):
        prefill(r, x, t, 0, n)
    r.capture_decode_graphs(8, sizes=(1, 2, 4, 8))
    b = decode(r, ids, tables, lens)
    inp = r.prepare(b)
    # eager logits before the graph writes the same slots (writes are idempotent: same K/V)
    eager = r.forward(inp)
    r.load_decode(b, 8)
    graph = r.replay_decode(8)[: len(lens)]
    assert eager.tolist() == graph.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("impl", ["sdpa", "kernel", "wgmma"])
def test_gpu_prefill_paths_match_the_cpu_forward(impl):
    ids = np.random.default_rng(2).integers(0, TINY.vocab_size, 80)
    table = np.arange(3, 11)
    cpu = runner("sdpa")
    want = prefill(cpu, ids, table, 0, 30, sample=False)
    want = prefill(cpu, ids, table, 30, 77)
    try:
        gpu = runner(impl, device="cuda", dtype="float32" if impl == "sdpa" else "float16")
    except ValueError as e:
        pytest.skip(str(e))
    gpu.embed.copy_(cpu.embed.to(gpu.embed))
    for a, b in zip(gpu.layers, cpu.layers):
        for k in a:
            a[k].copy_(b[k].to(a[k]))
    gpu.lm_head.copy_(cpu.lm_head.to(gpu.lm_head))
    prefill(gpu, ids, table, 0, 30, sample=False)
    got = prefill(gpu, ids, table, 30, 77)
    torch.testing.assert_close(gpu.k_caches[1].float().cpu()[3:8], cpu.k_caches[1][3:8], atol=2e-2, rtol=2e-2)
    if impl == "sdpa":
        assert got.tolist() == want.tolist()


def test_a_segment_whose_launches_outlast_its_sleep_is_counted_late(host_clock_cuda):
    """A segment is late when the host took longer to queue it than its sleep lasts (the GPU may
    have waited inside the timed span); `seconds` leaves the count of its segments in `late`."""
    t = SegmentTimer(lead_s=0.5)
    t.begin()
    t.end()                    # queued well within its half second
    t.begin(lead_s=0.005)
    time.sleep(0.02)           # a host stall beyond this segment's 5 ms sleep
    t.end()
    total = t.seconds()
    assert t.late == 1 and total >= 0.02 and 0.015 <= t.overrun_s <= total
    assert t.seconds() == 0.0 and t.late == 0 and t.overrun_s == 0.0  # counted once, for the segments it summed
    inner = EventTimer()       # spans inside a segment: no sleep of their own, never late
    inner.begin()
    time.sleep(0.002)
    inner.end()
    inner.seconds()
    assert inner.late == 0


def test_an_unknown_prefill_choice_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="'kernel', 'wgmma'"):
        runner("flash")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_warpgroup_prefill_kernels_give_the_mma_sync_configurations_results():
    """prefill="wgmma" (the kernel's own choice: its warpgroup kernels on Hopper at head 128) and
    prefill="kernel" (the mma.sync configurations) give the same caches and close outputs over a
    chunked prompt, with the same weights."""
    dims = ModelDims("tiny128", num_layers=2, hidden_size=1024, num_heads=8, num_kv_heads=2, head_size=128,
                     intermediate_size=512, vocab_size=512, max_model_len=512)
    ids = np.random.default_rng(3).integers(0, dims.vocab_size, 300)
    table = np.arange(2, 22)
    out = {}
    for impl in ("kernel", "wgmma"):
        try:
            r = ModelRunner(dims, num_blocks=32, num_cpu_blocks=8, block_size=BS, dtype="float16", device="cuda",
                            prefill=impl, seed=5)
        except ValueError as e:
            pytest.skip(str(e))
        prefill(r, ids, table, 0, 160, sample=False)
        out[impl] = (prefill(r, ids, table, 160, 299), r.k_caches[1].float().cpu(), r.v_caches[1].float().cpu())
    torch.testing.assert_close(out["wgmma"][1], out["kernel"][1], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out["wgmma"][2], out["kernel"][2], atol=2e-2, rtol=2e-2)
