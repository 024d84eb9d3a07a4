"""The public API's argument checks and dispatch rules. CPU only: every check must fire before
anything could be launched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kernels  # noqa: E402
from kernels import _build  # noqa: E402

from kernel_cases import fill_  # noqa: E402


def case(dtype=torch.float16, num_heads=8, num_kv_heads=2, head_size=64, block_size=16, num_blocks=10, lens=(20, 5)):
    gen = torch.Generator().manual_seed(0)
    q = fill_(torch.empty(len(lens), num_heads, head_size, dtype=dtype), gen)
    kc, vc = kernels.allocate_kv_cache(num_blocks, num_kv_heads, head_size, block_size, dtype, "cpu")
    fill_(kc, gen)
    fill_(vc, gen)
    width = -(-max(lens) // block_size)
    bt = torch.randint(0, num_blocks, (len(lens), width), generator=gen, dtype=torch.int32)
    return dict(out=None, query=q, key_cache=kc, value_cache=vc, num_kv_heads=num_kv_heads, scale=0.125,
                block_tables=bt, context_lens=torch.tensor(lens, dtype=torch.int32), block_size=block_size,
                max_context_len=max(lens))


def attend(args, **kw):
    alibi = args.pop("alibi_slopes", None)
    return kernels.paged_attention(args["out"], args["query"], args["key_cache"], args["value_cache"],
                                   args["num_kv_heads"], args["scale"], args["block_tables"], args["context_lens"],
                                   args["block_size"], args["max_context_len"], alibi, **kw)


def test_valid_case_runs_on_cpu_and_returns_a_new_output():
    out = attend(case())
    assert out.shape == (2, 8, 64) and out.dtype == torch.float16 and torch.isfinite(out).all()


def test_block_id_out_of_range_is_rejected():
    args = case()
    args["block_tables"][1, 0] = 10
    with pytest.raises(ValueError, match=r"block_tables\[1, 0\] = 10 is outside the cache's 10 blocks"):
        attend(args)


def test_negative_block_id_is_rejected_but_unused_entries_are_not_read():
    args = case(lens=(20, 5))
    args["block_tables"][1, 1] = -1  # sequence 1 has 5 tokens: only column 0 is used
    attend(args)
    args["block_tables"][0, 1] = -1
    with pytest.raises(ValueError, match="outside the cache"):
        attend(args)


def test_context_longer_than_the_table_covers_is_rejected():
    args = case(lens=(20, 5))
    args["context_lens"][1] = 40
    args["max_context_len"] = 40
    with pytest.raises(ValueError, match="needs 3 blocks but block_tables has 2 columns"):
        attend(args)


@pytest.mark.parametrize("bad,match", [
    (dict(max_context_len=19), "less than the longest context 20"),
    (dict(lens=(0, 5)), "context_lens must be >= 1"),
])
def test_context_length_errors(bad, match):
    lens = bad.pop("lens", (20, 5))
    args = case(lens=lens)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        attend(args)


def test_unsupported_head_size_is_rejected():
    args = case()
    args["query"] = torch.zeros(2, 8, 72, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_size 72 not supported"):
        attend(args)


def test_wrong_key_cache_layout_is_rejected():
    args = case()
    kc = args["key_cache"]
    args["key_cache"] = kc.reshape(kc.shape[0], kc.shape[1], kc.shape[2] * 2, kc.shape[3], kc.shape[4] // 2)
    with pytest.raises(ValueError, match=r"head_size/x, block_size, x\] = \(10, 2, 8, 16, 8\)"):
        attend(args)


def test_non_contiguous_cache_is_rejected():
    args = case()
    args["value_cache"] = args["value_cache"].transpose(2, 3).contiguous().transpose(2, 3)
    with pytest.raises(ValueError, match="contiguous within a block"):
        attend(args)


@pytest.mark.parametrize("field,value,match", [
    ("query", lambda a: a["query"].float(), "key_cache dtype torch.float16 differs from query dtype torch.float32"),
    ("value_cache", lambda a: a["value_cache"].to(torch.bfloat16), "value_cache dtype"),
    ("block_size", lambda a: 32, "block_size 32 does not match"),
    ("num_kv_heads", lambda a: 4, "num_kv_heads 4 does not match"),
    ("block_tables", lambda a: a["block_tables"].float(), "block_tables must be int32 or int64"),
    ("context_lens", lambda a: a["context_lens"][:1], "one row per sequence"),
    ("out", lambda a: torch.empty(2, 8, 64, dtype=torch.float32), "out must be a contiguous torch.float16"),
    ("alibi_slopes", lambda a: torch.ones(4), r"alibi_slopes must be a float tensor of shape \(8,\)"),
    ("scale", lambda a: "0.1", "scale must be a float"),
])
def test_mismatched_arguments_are_rejected(field, value, match):
    args = case()
    args[field] = value(args)
    with pytest.raises(ValueError, match=match):
        attend(args)


def test_num_heads_must_be_a_multiple_of_kv_heads():
    args = case(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="num_heads 6 must be a multiple of num_kv_heads 4"):
        attend(args)


def test_unsupported_block_size_is_rejected():
    with pytest.raises(ValueError, match="block_size 64 not supported"):
        attend(case(block_size=64))


@pytest.mark.parametrize("kw,match", [(dict(version="v3"), "version must be"), (dict(impl="flash"), "impl must be")])
def test_unknown_version_or_impl_is_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        attend(case(), **kw)


def test_validate_false_still_checks_shapes():
    args = case()
    args["block_size"] = 8
    with pytest.raises(ValueError, match="block_size 8 does not match"):
        attend(args, validate=False)


@pytest.mark.parametrize("num_seqs,num_heads,ctx,want", [
    (7, 40, 512, "v1"),      # one partition
    (7, 40, 513, "v2"),      # two partitions, 280 (seq, head) pairs
    (13, 40, 4096, "v1"),    # 520 pairs > 512 fill the GPU already
    (64, 32, 8192, "v1"),
    (64, 32, 8193, "v2"),    # past v1's limit
    (1, 32, 32768, "v2"),
])
def test_choose_version_follows_vllms_rule(num_seqs, num_heads, ctx, want):
    assert kernels.choose_version(num_seqs, num_heads, ctx) == want


def test_reshape_and_cache_checks():
    kc, vc = kernels.allocate_kv_cache(4, 2, 64, 16, torch.float16, "cpu")
    key = torch.zeros(3, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="slot 64 is outside the cache"):
        kernels.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 64, -1]))
    with pytest.raises(ValueError, match="writes a slot twice"):
        kernels.reshape_and_cache(key, key, kc, vc, torch.tensor([5, 5, -1]))
    with pytest.raises(ValueError, match="key dtype torch.float32 differs"):
        kernels.reshape_and_cache(key.float(), key, kc, vc, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"key must be \[num_tokens, 2, 64\]"):
        kernels.reshape_and_cache(key[:, :1], key, kc, vc, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="slot_mapping has 2 entries for 3 tokens"):
        kernels.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 1]))


def test_copy_blocks_checks():
    layers = [kernels.allocate_kv_cache(4, 2, 64, 16, torch.float16, "cpu") for _ in range(2)]
    keys, values = [k for k, _ in layers], [v for _, v in layers]
    with pytest.raises(ValueError, match="destination block 4 is outside"):
        kernels.copy_blocks(keys, values, [(0, 4)])
    with pytest.raises(ValueError, match="destination block appears twice"):
        kernels.copy_blocks(keys, values, [(0, 2), (1, 2)])
    with pytest.raises(ValueError, match="both copied from and copied to"):
        kernels.copy_blocks(keys, values, [(0, 1), (1, 2)])
    with pytest.raises(ValueError, match="one key and one value cache per layer"):
        kernels.copy_blocks(keys, values[:1], [(0, 1)])
    with pytest.raises(ValueError, match=r"shape \[num_pairs, 2\]"):
        kernels.copy_blocks(keys, values, torch.tensor([0, 1, 2]))
    odd = kernels.allocate_kv_cache(5, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match="layer 1's caches differ"):
        kernels.copy_blocks([keys[0], odd[0]], [values[0], odd[1]], [(0, 1)])


def test_swap_blocks_checks():
    a, _ = kernels.allocate_kv_cache(4, 2, 64, 16, torch.float16, "cpu")
    b, _ = kernels.allocate_kv_cache(3, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match="source block 4 is outside the 4 blocks"):
        kernels.swap_blocks(a, b, [(4, 0)])
    with pytest.raises(ValueError, match="differ in shape"):
        kernels.swap_blocks(a, b[:, :1], [(0, 0)])
    with pytest.raises(ValueError, match="src dtype"):
        kernels.swap_blocks(a.float(), b, [(0, 0)])


def test_allocate_kv_cache_layout():
    kc, vc = kernels.allocate_kv_cache(3, 4, 128, 16, torch.float32, "cpu")
    assert kc.shape == (3, 4, 32, 16, 4) and vc.shape == (3, 4, 128, 16)
    kc, vc = kernels.allocate_kv_cache(3, 4, 128, 16, torch.bfloat16, "cpu")
    assert kc.shape == (3, 4, 16, 16, 8) and kernels.kv_x(torch.bfloat16) == 8
    with pytest.raises(ValueError, match="dtype torch.int8 not supported"):
        kernels.allocate_kv_cache(3, 4, 128, 16, torch.int8, "cpu")


def test_hopper_builds_for_sm90a():
    assert _build.arch_flags({(9, 0)}) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert _build.arch_flags({(8, 0)}) == ["-gencode=arch=compute_80,code=sm_80"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_sources_digest_follows_every_csrc_file(tmp_path, monkeypatch):
    for name in ("a.cu", "b.cuh"):
        (tmp_path / name).write_text("x")
    monkeypatch.setattr(_build, "CSRC", tmp_path)
    before = _build.sources_digest()
    assert before == _build.sources_digest()
    (tmp_path / "b.cuh").write_text("y")  # a header alone
    assert _build.sources_digest() != before


def test_building_without_cuda_fails_clearly():
    with pytest.raises(RuntimeError, match="kernels: .*(CPU-only|no CUDA device)"):
        _build.extension()
