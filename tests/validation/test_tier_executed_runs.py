"""Executed runs with KV tiers on one reused executor (`ModelStepExecutor.new_run`, as
benchmarks/tier_fidelity.py runs its configurations): every run performs its moves and checks every
restored chunk; another model shape is refused. CPU, tiny model."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

import traces  # noqa: E402
from blocksim.engine import Engine  # noqa: E402
from blocksim.experiments.runner import build_config  # noqa: E402
from validation.step_executor import ExecutorError, ModelStepExecutor  # noqa: E402

TINY = """models:
  tiny: {num_layers: 2, hidden_size: 256, num_heads: 4, num_kv_heads: 2, head_size: 64, num_params: 1.0e6,
         max_model_len: 256, intermediate_size: 256, vocab_size: 512}
"""
BS = 16
CHUNK_BYTES = BS * 2 * 2 * 2 * 64 * 2  # tokens x K,V x layers x KV heads x head size x 2 B


def workload(n=30):
    hashes = [[(i % 6) * 1000 + j for j in range(96 // BS)] for i in range(n)]
    df = pd.DataFrame({"arrival_s": np.arange(n) * 0.01, "prompt_tokens": [96] * n, "output_tokens": [3] * n,
                       "prefix_hashes": hashes})
    return traces.Trace(df, hash_block_tokens=BS)


def config(tmp_path, **tiers):
    return build_config("vllm-v1", catalog=[str(tmp_path / "tiny.yaml")], model="tiny", num_gpu_blocks=24,
                        max_num_seqs=4, max_num_batched_tokens=128, **tiers)


def test_runs_on_one_executor_each_perform_and_check_their_moves(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    runs = [dict(tier_host_gib=40 * CHUNK_BYTES / 2**30),
            dict(tier_host_gib=4 * CHUNK_BYTES / 2**30, tier_disk_gib=200 * CHUNK_BYTES / 2**30,
                 tier_disk_path=str(tmp_path)),
            dict()]
    ex = None
    for i, tiers in enumerate(runs):
        cfg = config(tmp_path, **tiers)
        if ex is None:
            ex = ModelStepExecutor(cfg, device="cpu")
        else:
            ex.new_run(cfg)
        res = Engine(cfg, workload(), executor=ex).run()
        ex.save(tmp_path / f"run{i}")
        summary = json.loads((tmp_path / f"run{i}" / "executor.json").read_text())
        steps = pd.read_parquet(tmp_path / f"run{i}" / "executor_steps.parquet")
        assert len(steps) == len(res.steps) and steps.step.tolist() == list(range(len(steps))), "this run's steps only"
        if tiers:
            hits = res.summary["tier_host_hit_tokens"] + res.summary.get("tier_disk_hit_tokens", 0)
            assert hits > 0 and summary["tier_checked_loads"] * BS == hits
            assert summary["tier_checksum_mismatches"] == 0
        else:
            assert "tier_moves" not in summary and "tier_disk_io" not in summary


def test_another_model_shape_is_refused(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    ex = ModelStepExecutor(config(tmp_path), device="cpu")
    other = build_config("vllm-v1", catalog=[str(tmp_path / "tiny.yaml")], model="tiny", num_gpu_blocks=32,
                         max_num_seqs=4, max_num_batched_tokens=128)
    with pytest.raises(ExecutorError, match="same model"):
        ex.new_run(other)


@pytest.mark.parametrize("preset", ["vllm-prefix", "sglang"])
def test_the_other_prefix_caching_engines_perform_and_check_their_tier_moves(tmp_path, preset):
    (tmp_path / "tiny.yaml").write_text(TINY)
    knobs = (dict(page_size=BS, max_running_requests=4, chunked_prefill_size=128) if preset == "sglang"
             else dict(block_size=BS, max_num_seqs=4, max_num_batched_tokens=128))
    for i, tiers in enumerate([dict(tier_host_gib=40 * CHUNK_BYTES / 2**30),
                               dict(tier_host_gib=4 * CHUNK_BYTES / 2**30, tier_disk_gib=200 * CHUNK_BYTES / 2**30,
                                    tier_disk_path=str(tmp_path)),
                               dict(tier_host_gib=40 * CHUNK_BYTES / 2**30, tier_host_write="write-back")]):
        cfg = build_config(preset, catalog=[str(tmp_path / "tiny.yaml")], model="tiny", num_gpu_blocks=24,
                           **knobs, **tiers)
        ex = ModelStepExecutor(cfg, device="cpu")
        res = Engine(cfg, workload(12), executor=ex).run()
        ex.save(tmp_path / f"run{i}")
        summary = json.loads((tmp_path / f"run{i}" / "executor.json").read_text())
        hits = res.summary["tier_host_hit_tokens"] + res.summary.get("tier_disk_hit_tokens", 0)
        chunk = cfg.tier_chunk_tokens  # sglang: 64-token chunks by default
        assert hits > 0 and summary["tier_checked_loads"] * chunk == hits, "every restored chunk checked"
        assert summary["tier_checksum_mismatches"] == 0 and summary["tier_moves"] > 0
        if "tier_disk_gib" in tiers:
            assert res.summary.get("tier_disk_hit_tokens", 0) > 0, "the disk tier served loads"


def test_tier_fidelity_merges_the_tables_into_the_runs_own_profile(tmp_path):
    from benchmarks import tier_fidelity as tf
    tf.use_gpu("h200-141gb")
    own = json.loads(tf.SHIPPED.read_text())
    own["created_utc"] = "2030-01-01T00:00:00Z"  # a profile measured beside the runs
    base = tmp_path / "own.json"
    base.write_text(json.dumps(own))
    merged = json.loads(tf.merged_profile(tmp_path, tf.TIER_TABLES, base=base).read_text())
    assert merged["created_utc"] == own["created_utc"]
    assert {"tier_gpu_host", "tier_disk_gpu"} <= set(merged["components"]), "the tier tables merged in"
    other = dict(own, model="llama-2-7b")
    base.write_text(json.dumps(other))
    with pytest.raises(tf.UsageError, match="--base-profile .*llama-2-7b"):
        tf.merged_profile(tmp_path, tf.TIER_TABLES, base=base)
    base.write_text("{")
    with pytest.raises(tf.UsageError, match="not a readable profile"):
        tf.merged_profile(tmp_path, tf.TIER_TABLES, base=base)
