"""validation.tiers on a CUDA device: page-locked host tier, side-stream copies ordered against the
caller's stream, checksums on the GPU, and attention over restored blocks against the dense reference."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import kernels  # noqa: E402
from validation.tiers import TierExecutor, replay_tier_ops  # noqa: E402
from validation.tiers.check import restored_attention  # noqa: E402
from validation.tiers.synthetic import synthetic_tier_ops  # noqa: E402

BS, CB, NB, LAYERS = 16, 4, 256, 4


def caches():
    ks, vs = [], []
    for _ in range(LAYERS):
        k, v = kernels.allocate_fast_kv_cache(NB, BS, 8, 128, torch.float16, "cuda")
        k.normal_()
        v.normal_()
        ks.append(k)
        vs.append(v)
    return ks, vs


@pytest.mark.parametrize("layout,dtype", [("vllm", "float16"), ("vllm", "bfloat16"), ("fast", "float16"),
                                          ("fast", "bfloat16")])
def test_attention_over_restored_blocks_matches_the_dense_reference(tmp_path, layout, dtype):
    r = restored_attention(tmp_path, device="cuda", layout=layout, dtype=dtype)
    assert r["mismatches"] == 0 and r["checked_loads"] == 3 and r["content_equal"] and r["attention_matches"], r
    bad = restored_attention(tmp_path, device="cuda", layout=layout, dtype=dtype, corrupt=True)
    assert bad["mismatches"] == 1 and not bad["content_equal"], bad


def test_host_tier_is_page_locked_and_a_store_is_ordered_before_the_blocks_are_reused(tmp_path):
    ks, vs = caches()
    ex = TierExecutor(ks, vs, chunk_blocks=CB, host_chunks=8, disk_chunks=8, disk_path=tmp_path / "kv.bin")
    assert ex.host.is_pinned() and ex.bounce.is_pinned()
    src = torch.arange(CB, device="cuda")
    want = [t[src].clone() for t in ex.tensors]
    torch.cuda._sleep(200_000_000)  # the caller's stream is busy: the store must wait for it ...
    ex.apply("store", "gpu", "host", [1], [src.tolist()])
    for t in ex.tensors:  # ... and these writes must wait for the store's gather
        t[src] = 0
    ex.apply("store", "gpu", "disk", [2], [(src + CB).tolist()])
    ex.apply("load", "host", "gpu", [1], [list(range(100, 100 + CB))])
    got = [t[100:100 + CB] for t in ex.tensors]
    assert all(torch.equal(a, b) for a, b in zip(got, want)), "the store read blocks overwritten after it"
    assert ex.mismatches() == 0
    ex.close()


def test_a_synthetic_plan_replays_without_a_checksum_mismatch(tmp_path):
    ks, vs = caches()
    ex = TierExecutor(ks, vs, chunk_blocks=CB, host_chunks=6, disk_chunks=12, disk_path=tmp_path / "kv.bin",
                      staging_chunks=4)
    t = synthetic_tier_ops(60, chunk_blocks=CB, num_gpu_blocks=NB, host_chunks=6, disk_chunks=12, seed=3)
    res = replay_tier_ops(ex, t)
    loads = sum(1 for op, ev in zip(t["op"], t["evict"]) if op == "load" and not ev)
    assert res["mismatches"] == 0 and res["checked_loads"] == loads > 0
    assert (res["batches"]["seconds"] > 0).all()
    ex.close()
