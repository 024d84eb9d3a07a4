"""validation.tiers on the CPU: chunks moved between cache blocks, a host buffer and a disk file come
back byte for byte, checksums catch a corrupted copy, the disk tier falls back to buffered I/O
where O_DIRECT is refused, and bad tier_ops tables are refused in one line."""
from __future__ import annotations

import errno
import os

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import kernels  # noqa: E402
from blocksim.config import ConfigError  # noqa: E402
from validation.tiers import TierExecutor, TierOpError, TierReplay, read_tier_ops, replay_tier_ops  # noqa: E402
from validation.tiers.checksum import Checksum  # noqa: E402
from validation.tiers.disk import ALIGN, DiskTier, aligned_empty  # noqa: E402
from validation.tiers.synthetic import synthetic_tier_ops  # noqa: E402

BS, CB, NB, LAYERS = 16, 2, 24, 2


def caches(layout="vllm", seed=0):
    g = torch.Generator().manual_seed(seed)
    ks, vs = [], []
    for _ in range(LAYERS):
        if layout == "fast":
            k, v = kernels.allocate_fast_kv_cache(NB, BS, 2, 64, torch.float16, "cpu")
        else:
            k, v = kernels.allocate_kv_cache(NB, 2, 64, BS, torch.float16, "cpu")
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
        ks.append(k)
        vs.append(v)
    return ks, vs


def executor(tmp_path, ks, vs, **kw):
    kw = {"chunk_blocks": CB, "host_chunks": 4, "disk_chunks": 4, "disk_path": tmp_path / "kv.bin", **kw}
    return TierExecutor(ks, vs, **kw)


def blocks_of(ex, ids):
    return [t[torch.as_tensor(ids)].clone() for t in ex.tensors]


@pytest.mark.parametrize("layout", ["vllm", "fast"])
@pytest.mark.parametrize("path", ["host", "disk", "host+disk"])
def test_a_chunk_comes_back_byte_for_byte_into_other_blocks(tmp_path, layout, path):
    ks, vs = caches(layout)
    ex = executor(tmp_path, ks, vs)
    src, dst = [3, 4], [20, 7]
    want = blocks_of(ex, src)
    if path == "host":
        ex.apply("store", "gpu", "host", [9], [src])
    elif path == "disk":
        ex.apply("store", "gpu", "disk", [9], [src])
    else:
        ex.apply("store", "gpu", "host", [9], [src])
        ex.apply("store", "host", "disk", [9])
        ex.drop(9, "host")
    for t in ex.tensors:
        t.zero_()
    ex.apply("load", "host" if path == "host" else "disk", "gpu", [9], [dst])
    got = blocks_of(ex, dst)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{path}: restored blocks differ from the stored ones"
    assert ex.mismatches() == 0 and ex.checked_loads == 1
    assert len(ex.tensors) == (LAYERS if layout == "fast" else 2 * LAYERS), "the fast layout moves K and V as one storage"
    ex.close()


def test_a_corrupted_host_copy_is_counted_and_named(tmp_path):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    ex.step = 5
    ex.apply("store", "gpu", "host", [1, 2], [[0, 1], [2, 3]])
    ex.host[ex.slots["host"].find(2), 100] ^= 0x01  # one bit of the stored copy
    ex.apply("load", "host", "gpu", [1, 2], [[10, 11], [12, 13]])
    assert ex.mismatches() == 1
    assert [(m["key"], m["step"], m["src"]) for m in ex.mismatched] == [(2, 5, "host")]


def test_a_corrupted_disk_copy_is_counted(tmp_path):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    ex.apply("store", "gpu", "disk", [7], [[5, 6]])
    with open(tmp_path / "kv.bin", "r+b") as f:  # a bad sector: one byte of the chunk's slot
        f.seek(ex.slots["disk"].find(7) * ex.slot_bytes + 1234)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x80]))
    ex.apply("load", "disk", "gpu", [7], [[8, 9]])
    assert ex.mismatches() == 1 and ex.mismatched[0]["src"] == "disk"


def test_checksum_sees_one_changed_word_and_a_swapped_pair():
    row = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    c = Checksum(torch, 4096)
    base = int(c.of(row))
    for i in (0, 1, 2049, 4095):
        r = row.clone()
        r[i] ^= 0xFF
        assert int(c.of(r)) != base, f"byte {i} changed but the checksum did not"
    words = row.view(torch.int32).clone()
    words[[3, 4]] = words[[4, 3]]
    if int(words[3]) != int(words[4]):
        assert int(c.of(words.view(torch.uint8))) != base, "two words swapped but the checksum did not change"


def test_slots_are_conserved_and_freed_by_drops(tmp_path):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs, host_chunks=2)
    ex.apply("store", "gpu", "host", [1, 2], [[0, 1], [2, 3]])
    with pytest.raises(TierOpError, match="full"):
        ex.apply("store", "gpu", "host", [3], [[4, 5]])
    ex.drop(1, "host")
    ex.apply("store", "gpu", "host", [3], [[4, 5]])
    s = ex.slots["host"]
    assert sorted(s.slot) == [2, 3] and len(s.free) + len(s.slot) == s.capacity


def test_host_rows_and_disk_slots_are_aligned_for_direct_io(tmp_path):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    assert ex.slot_bytes % ALIGN == 0 and ex.slot_bytes >= ex.chunk_bytes
    assert all(ex.host[i].data_ptr() % ALIGN == 0 for i in range(ex.host.shape[0]))
    assert all(ex.bounce[i].data_ptr() % ALIGN == 0 for i in range(ex.bounce.shape[0]))


def test_disk_falls_back_to_buffered_io_when_o_direct_is_refused(tmp_path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_open = os.open

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)
    monkeypatch.setattr(os, "open", no_direct)
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    assert ex.disk_mode == "buffered" and "O_DIRECT refused" in ex.disk_reason
    want = blocks_of(ex, [0, 1])
    ex.apply("store", "gpu", "disk", [1], [[0, 1]])
    ex.apply("load", "disk", "gpu", [1], [[2, 3]])
    assert all(torch.equal(a, b) for a, b in zip(blocks_of(ex, [2, 3]), want)) and ex.mismatches() == 0


def test_disk_falls_back_when_aligned_direct_io_fails(tmp_path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real = os.pwrite
    calls = []

    def first_fails(fd, data, off):
        if not calls:
            calls.append(1)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, off)
    monkeypatch.setattr(os, "pwrite", first_fails)
    buf = aligned_empty(torch, 1, ALIGN, pin=False)
    d = DiskTier(tmp_path / "kv.bin", 2, ALIGN, probe_buffer=buf[0])
    assert d.mode == "buffered" and "aligned I/O failed" in d.reason
    d.close()


def test_direct_io_is_used_where_the_file_system_allows(tmp_path):
    buf = aligned_empty(torch, 2, ALIGN, pin=False)
    d = DiskTier(tmp_path / "kv.bin", 2, ALIGN, probe_buffer=buf[0])
    assert d.mode in ("direct", "buffered") and d.reason, "the mode and its reason are always stated"
    buf[0].fill_(7)
    d.write([1], [buf[0]])
    d.read([1], [buf[1]])
    assert torch.equal(buf[0], buf[1])
    d.close()


def test_a_missing_disk_directory_is_one_line(tmp_path):
    ks, vs = caches()
    with pytest.raises(ConfigError) as e:
        executor(tmp_path, ks, vs, disk_path=tmp_path / "nope" / "kv.bin")
    assert "does not exist" in str(e.value) and "\n" not in str(e.value)


# --- tier_ops tables --------------------------------------------------------------------------------
def table(**over):
    t = {"step": [0, 0, 1, 2], "op": ["store", "store", "load", "store"], "src": ["gpu", "host", "host", "host"],
         "dst": ["host", "disk", "gpu", "host"], "key": [1, 1, 1, 1], "gpu_blocks": [[0, 1], [], [4, 5], []],
         "evict": [False, False, False, True]}
    for k, v in over.items():
        t[k] = v
    return t


def test_a_replay_applies_every_row_and_times_every_step(tmp_path):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    want = blocks_of(ex, [0, 1])
    res = replay_tier_ops(ex, table())
    assert res["mismatches"] == 0 and res["checked_loads"] == 1
    assert list(res["steps"]["step"]) == [0, 1]
    assert set(res["batches"]["move"]) == {"gpu->host", "host->disk", "host->gpu"}
    assert (res["batches"]["seconds"] > 0).all()
    assert all(torch.equal(a, b) for a, b in zip(blocks_of(ex, [4, 5]), want))
    assert ex.held("host") == set() and ex.held("disk") == {1}


def test_a_replay_reads_a_plan_directory(tmp_path):
    pd = pytest.importorskip("pandas")
    pd.DataFrame(table()).to_parquet(tmp_path / "tier_ops.parquet")
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    assert replay_tier_ops(ex, tmp_path)["mismatches"] == 0


BAD = [
    ({"op": ["store", "store", "load", "move"]}, "row 3 (step 2): op is 'move'"),
    ({"dst": ["host", "disk", "host", "host"]}, "row 2 (step 1): load host->host is not a tier move"),
    ({"gpu_blocks": [[0], [], [4, 5], []]}, "row 0 (step 0): store gpu->host of key 1 names 1 GPU blocks"),
    ({"gpu_blocks": [[0, 99], [], [4, 5], []]}, "row 0 (step 0): GPU block 99 is outside"),
    ({"gpu_blocks": [[3, 3], [], [4, 5], []]}, "row 0 (step 0): the chunk's GPU blocks repeat"),
    ({"gpu_blocks": [[0, 1], [2, 3], [4, 5], []]}, "row 1 (step 0): store host->disk names GPU blocks"),
    ({"key": [1, 2, 1, 1]}, "row 1 (step 0): store host->disk of key 2, which host does not hold"),
    ({"key": [1, 1, 3, 1]}, "row 2 (step 1): load host->gpu of key 3, which host does not hold"),
    ({"key": [1, 1, 1, 4]}, "row 3 (step 2): drop of key 4 from host, which holds no copy"),
    ({"step": [0, 0, 2, 1]}, "row 3 (step 1): steps go backwards"),
    ({"step": [0, 0, 0, 0], "op": ["store", "store", "load", "load"], "src": ["gpu", "host", "host", "disk"],
      "dst": ["host", "disk", "gpu", "gpu"], "gpu_blocks": [[0, 1], [], [4, 5], [5, 6]], "evict": [False] * 4},
     "row 3 (step 0): GPU block 5 is loaded into twice in one step (also by row 2)"),
    ({"src": ["gpu", "host", "host", "nvme"]}, "row 3 (step 2): src is 'nvme'"),
]


@pytest.mark.parametrize("over,msg", BAD, ids=[m.split(":")[1].strip()[:30] for _, m in BAD])
def test_a_bad_row_is_refused_in_one_line_before_anything_runs(tmp_path, over, msg):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    with pytest.raises(TierOpError) as e:
        TierReplay(ex, table(**over))
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert ex.records() == [] and ex.held("host") == set(), "nothing ran"


def test_a_missing_column_and_a_full_tier_are_refused(tmp_path):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs, host_chunks=1)
    t = table()
    del t["key"]
    with pytest.raises(TierOpError, match="missing column.*key"):
        read_tier_ops(t)
    full = table(key=[1, 1, 1, 1])
    full = {k: v[:1] * 2 for k, v in full.items()}
    full["key"] = [1, 2]
    with pytest.raises(TierOpError, match=r"row 1 \(step 0\): store gpu->host of key 2 into a full host tier"):
        TierReplay(ex, full)
    dup = {k: v[:1] * 2 for k, v in table().items()}
    with pytest.raises(TierOpError, match="which host already holds"):
        TierReplay(executor(tmp_path, ks, vs), dup)


def test_a_missing_plan_table_is_one_line(tmp_path):
    with pytest.raises(TierOpError, match="no tier_ops table here"):
        read_tier_ops(tmp_path)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), host=st.integers(1, 4), disk=st.integers(0, 5), steps=st.integers(1, 12))
def test_random_tables_replay_without_mismatch_and_conserve_slots(tmp_path, seed, host, disk, steps):
    ks, vs = caches(seed=seed)
    t = synthetic_tier_ops(steps, chunk_blocks=CB, num_gpu_blocks=NB, host_chunks=host, disk_chunks=disk, seed=seed)
    ex = executor(tmp_path, ks, vs, host_chunks=host, disk_chunks=disk, staging_chunks=2,
                  disk_path=tmp_path / f"kv{seed}.bin")
    res = replay_tier_ops(ex, t)
    loads = sum(1 for op, ev in zip(t["op"], t["evict"]) if op == "load" and not ev)
    assert res["mismatches"] == 0 and res["checked_loads"] == loads
    for tier in ("host", "disk"):
        s = ex.slots[tier]
        assert len(s.free) + len(s.slot) == s.capacity and len(set(s.slot.values())) == len(s.slot)
    ex.close()


@pytest.mark.parametrize("layout", ["vllm", "fast"])
def test_attention_over_restored_blocks_matches_the_dense_reference(tmp_path, layout):
    from validation.tiers.check import restored_attention
    r = restored_attention(tmp_path, device="cpu", layout=layout, head_size=64)
    assert r["mismatches"] == 0 and r["checked_loads"] == 3 and r["content_equal"] and r["attention_matches"], r
    bad = restored_attention(tmp_path, device="cpu", layout=layout, head_size=64, corrupt=True)
    assert bad["mismatches"] == 1 and not bad["content_equal"], bad


def test_profile_with_tier_dir_writes_tier_tables_the_loader_reads(tmp_path, capsys):
    pytest.importorskip("simpy")  # the CLI imports the engine
    from blocksim.cli import main
    from blocksim.cost.profile_file import TIER_COMPONENTS, TIER_FRESH, load_profile
    (tmp_path / "tiny.yaml").write_text(
        "models:\n  tiny: {num_layers: 2, hidden_size: 256, num_heads: 4, num_kv_heads: 2, head_size: 64, "
        "num_params: 1.0e6,\n         max_model_len: 256, intermediate_size: 256, vocab_size: 512}\n")
    out = tmp_path / "p.json"
    args = ["profile", "--model", "tiny", "--catalog", str(tmp_path / "tiny.yaml"), "--device", "cpu", "--quick",
            "--gpu-name", "h200-141gb", "--out", str(out), "--quiet"]
    assert main([*args, "--tier-dir", str(tmp_path / "missing")]) == 2
    assert "--tier-dir" in capsys.readouterr().err
    assert main([*args, "--tier-dir", str(tmp_path)]) == 0
    prof = load_profile(out)
    for name in (*TIER_COMPONENTS, TIER_FRESH):
        g = prof.tables[name]
        assert g.axes == ("chunk_bytes", "chunks") and (g.seconds > 0).all(), name
    assert g.grids[0][0] == 16 * 2 * 2 * 2 * 64 * 2, "chunk bytes = tokens x KV bytes per token"


def test_fresh_writes_time_every_batch_on_slots_never_written_and_remove_the_file(tmp_path, monkeypatch):
    from validation.tiers import bench
    from validation.tiers.disk import DiskTier
    written, real = [], DiskTier.write

    def write(self, slots, rows):
        written.append(list(slots))
        return real(self, slots, rows)
    monkeypatch.setattr(DiskTier, "write", write)
    secs = bench.fresh_writes(torch, tmp_path / "f.kv", 8192, (1, 4), reps=3, pin=False)
    assert len(secs) == 2 and all(s > 0 for s in secs)
    assert [len(w) for w in written] == [1, 4] * 4, "a warm-up round and three timed rounds"
    flat = [x for w in written for x in w]
    assert len(set(flat)) == len(flat) and 0 not in flat, "each batch on new slots, past the probe's slot 0"
    assert not (tmp_path / "f.kv").exists()


def test_merge_adds_the_tier_tables_to_a_matching_profile_only(tmp_path):
    import importlib.util
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("tier_merge", root / "benchmarks" / "tier_bandwidth_merge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    result = json.loads((root / "benchmarks" / "results" / "tier-h200.json").read_text())
    prof = tmp_path / "p.json"
    prof.write_text((root / "blocksim" / "profiles" / "llama-3-8b__h200-141gb__float16__tp1.json").read_text())
    assert mod.main([str(root / "benchmarks" / "results" / "tier-h200.json"), str(prof)]) == 0
    merged = json.loads(prof.read_text())
    assert merged["components"]["tier_host_gpu"] == result["components"]["tier_host_gpu"]
    assert merged["tier_disk_io"].startswith(result["disk_mode"])
    other = tmp_path / "o.json"
    other.write_text((root / "blocksim" / "profiles" / "llama-3-8b__h100-80gb__float16__tp1.json").read_text())
    assert mod.main([str(root / "benchmarks" / "results" / "tier-h200.json"), str(other)]) == 2


def test_a_step_executor_applies_one_step_at_a_time(tmp_path):
    ks, vs = caches()
    ex = executor(tmp_path, ks, vs)
    want = blocks_of(ex, [0, 1])
    replay = TierReplay(ex, table())
    assert replay.steps == [0, 1, 2]
    assert replay.step(7) == 0, "a step without rows runs nothing"
    assert replay.step(0) == 2 and ex.held("host") == {1} and ex.held("disk") == {1}
    for t in ex.tensors:
        t.zero_()
    assert replay.step(1) == 1
    assert all(torch.equal(a, b) for a, b in zip(blocks_of(ex, [4, 5]), want)), "loaded before step 1's attention"
    assert replay.step(2) == 1 and ex.held("host") == set()
    res = replay.finish()
    assert res["mismatches"] == 0 and list(res["steps"]["step"]) == [0, 1]
