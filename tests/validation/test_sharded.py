"""validation.sharded: the tensor-parallel forward pass on the CPU (gloo, two ranks: this process
and one worker): each rank's shard shapes, the sharded forward equal to the unsharded one built
from the same seed, the all-reduces counted per step equal to the cost model's, and a replay
executed at tensor_parallel 2."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from blocksim.catalog import Catalog  # noqa: E402
from blocksim.cli import main  # noqa: E402
from blocksim.cost import RooflineCostModel  # noqa: E402
from blocksim.experiments.runner import build_config  # noqa: E402
from validation import sharded  # noqa: E402
from validation.model import ModelDims, ModelRunner, PrefillSeq, StepBatch  # noqa: E402
from validation.sharded import ShardError, head_ranges, shard_dims  # noqa: E402

CATALOG = """models:
  tiny-gqa: {num_layers: 2, hidden_size: 256, num_heads: 4, num_kv_heads: 2, head_size: 64, num_params: 1.0e6,
             max_model_len: 256, intermediate_size: 256, vocab_size: 512}
  tiny-mqa: {num_layers: 3, hidden_size: 128, num_heads: 4, num_kv_heads: 1, head_size: 32, num_params: 1.0e6,
             max_model_len: 256, intermediate_size: 192, vocab_size: 300}
"""
BS = 16
KW = dict(num_blocks=32, num_cpu_blocks=8, block_size=BS, prefill="sdpa")


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    path = tmp_path_factory.mktemp("catalog") / "tiny.yaml"
    path.write_text(CATALOG)
    return path


@pytest.fixture(scope="module")
def driver():
    d = sharded.launch(2, "cpu")
    yield d
    d.close()


def dims_of(catalog, name):
    return ModelDims.of(Catalog([catalog]).model(name))


def test_shards_divide_heads_and_mlp_and_replicate_a_kv_head_shared_by_ranks():
    d = ModelDims("m", 2, 512, 8, 2, 64, 1024, 1000, 256)
    assert shard_dims(d, 2) == ModelDims("m", 2, 512, 4, 1, 64, 512, 1000, 256)
    assert shard_dims(d, 4).num_kv_heads == 1, "fewer KV heads than ranks: one (replicated) per rank"
    assert [tuple(head_ranges(d, 4, r)[1]) for r in range(4)] == [(0,), (0,), (1,), (1,)], \
        "ranks 0-1 read KV head 0 (their query heads 0-3), ranks 2-3 KV head 1"
    assert [tuple(head_ranges(d, 2, r)[0]) for r in range(2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    with pytest.raises(ShardError, match="must divide"):
        shard_dims(d, 3)


@pytest.mark.parametrize("name", ["tiny-gqa", "tiny-mqa"])
def test_each_rank_holds_its_column_and_row_shards(driver, catalog, name):
    d = dims_of(catalog, name)
    r = driver.runner(d, dtype="float32", **KW)
    h, D, i = d.hidden_size, d.head_size, d.intermediate_size // 2
    hq, hk = d.num_heads // 2, max(1, d.num_kv_heads // 2)
    w = r.layers[0]
    assert tuple(w["qkv"].shape) == ((hq + 2 * hk) * D, h), "QKV column-parallel"
    assert tuple(w["o"].shape) == (h, hq * D), "O row-parallel"
    assert tuple(w["gate_up"].shape) == (2 * i, h) and tuple(w["down"].shape) == (h, i), "MLP column / row"
    assert tuple(r.embed.shape) == (d.vocab_size, h) and tuple(r.lm_head.shape) == (d.vocab_size, h), "replicated"
    assert tuple(r.k_caches[0].shape) == (KW["num_blocks"] + 1, BS, hk, D), "the rank's KV heads only"


def prompt_then_decode(n: int, vocab: int):
    ids = np.random.default_rng(7).integers(0, vocab, n + 1)
    table = np.arange(2, 2 + -(-(n + 1) // BS))
    p = np.arange(n)
    pre = StepBatch(ids[:n], p, table[p // BS] * BS + p % BS, [PrefillSeq(0, n, table)])
    dec = StepBatch(ids[n:], np.asarray([n]), np.asarray([table[n // BS] * BS + n % BS]), [], [table],
                    np.asarray([n + 1]))
    return [pre, dec]


def run_steps(runner, steps):
    hidden = []
    sample = runner.sample
    runner.sample = lambda x, idx: (hidden.append(x.clone()), sample(x, idx))[1]
    tokens = [runner.forward(runner.prepare(b)).tolist() for b in steps]
    runner.sample = sample
    return tokens, hidden


@pytest.mark.parametrize("name", ["tiny-gqa", "tiny-mqa"])
def test_the_sharded_forward_equals_the_unsharded_one(driver, catalog, name):
    d = dims_of(catalog, name)
    steps = prompt_then_decode(37, d.vocab_size)
    full = ModelRunner(d, dtype="float32", device="cpu", **KW)
    want_tokens, want_hidden = run_steps(full, steps)
    shard = driver.runner(d, dtype="float32", from_full=True, **KW)
    tokens, hidden = run_steps(shard, steps)
    for got, want in zip(hidden, want_hidden):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert tokens == want_tokens
    kv = head_ranges(d, 2, 0)[1]
    for j in range(d.num_layers):  # rank 0's cache holds its KV heads of the whole model's cache
        torch.testing.assert_close(shard.k_caches[j], full.k_caches[j][:, :, kv.start:kv.stop], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(shard.v_caches[j], full.v_caches[j][:, :, kv.start:kv.stop], atol=1e-4, rtol=1e-4)


def test_allreduces_per_step_are_those_the_cost_model_prices(driver, catalog):
    config = build_config(model="tiny-gqa", catalog=[str(catalog)], tensor_parallel=2, num_gpu_blocks=32)
    cost = RooflineCostModel(config)
    r = driver.runner(dims_of(catalog, "tiny-gqa"), dtype="float16", **KW)  # the catalog's 2-byte models
    for b in prompt_then_decode(37, 512) + prompt_then_decode(5, 512):
        r.comm_log.reset()
        r.forward(r.prepare(b))
        assert r.comm_log.count == cost.allreduces_per_step == 2 * 2, "two per layer"
        assert r.comm_log.bytes == cost.allreduces_per_step * b.num_tokens * cost.allreduce_bytes_per_token
    r.set_communicate(False)
    r.comm_log.reset()
    r.forward(r.prepare(prompt_then_decode(5, 512)[0]))
    assert r.comm_log.count == 0, "components timed without communication"
    r.set_communicate(True)
    sizes = [1024, 4096]
    secs = r.allreduce_seconds(sizes, iters=2, rounds=2)
    assert len(secs) == 2 and all(s > 0 for s in secs)


def test_a_replay_executes_at_tensor_parallel_2_with_the_priced_allreduces(driver, catalog, tmp_path):
    rng = np.random.default_rng(1)
    n = 8
    pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 0.05, n)), "prompt_tokens": rng.integers(5, 60, n),
                  "output_tokens": rng.integers(2, 12, n)}).to_parquet(tmp_path / "t.parquet", index=False)
    out = tmp_path / "run"
    assert main(["replay", str(tmp_path / "t.parquet"), "--out", str(out), "--catalog", str(catalog),
                 "--model", "tiny-gqa", "--tensor-parallel", "2", "--num-gpu-blocks", "24",
                 "--max-num-batched-tokens", "256",
                 "--executor", "cpu",
                 "--quiet", "--no-report"]) == 0
    steps = pd.read_parquet(out / "steps.parquet")
    ex = pd.read_parquet(out / "executor_steps.parquet")
    assert len(ex) == len(steps) and "t_comm_s" in steps
    tokens = (steps.prefill_tokens + steps.num_decode_seqs).to_numpy()
    assert (ex.allreduces.to_numpy() == np.where(tokens > 0, 2 * 2, 0)).all()
    assert (ex.allreduce_bytes.to_numpy() == 2 * 2 * tokens * 256 * 2).all(), "2 x layers x tokens x hidden x 2 B"
    np.testing.assert_allclose(steps.duration_s.to_numpy(), ex.measured_s.to_numpy())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == n and summary["executor"]["tensor_parallel"] == 2


def test_a_replayed_graph_counts_the_allreduces_captured_in_it(catalog, monkeypatch):
    """Graph replays run no Python: the count comes from what the capture held (CPU: capture mocked)."""
    monkeypatch.setattr(ModelRunner, "capture_decode_graphs", lambda self, max_batch, sizes=None, parts=None: [8, 4])
    monkeypatch.setattr(ModelRunner, "replay_decode", lambda self, padded, parts=None: None)
    d = dims_of(catalog, "tiny-gqa")
    r = sharded.ShardedModelRunner(d, tp=2, rank=0, dtype="float16", device="cpu", **KW)
    r.capture_decode_graphs(8)
    r.set_communicate(False)
    r.capture_decode_graphs(8, parts=("linear",))
    r.set_communicate(True)
    r.replay_decode(4)
    assert (r.comm_log.count, r.comm_log.bytes) == (2 * 2, 2 * 2 * 4 * 256 * 2), "2 x layers of padded x hidden x 2 B"
    r.comm_log.reset()
    r.replay_decode(4, ("linear",))
    assert r.comm_log.count == 0, "captured without communication"
