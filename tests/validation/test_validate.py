"""Validation of recorded plans on the CPU reference backend: clean runs pass; deliberately broken
block managers fail on the first step where their fault reaches the cache."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("simpy")  # the simulator records the plans validated here

from blocksim.memory.paged import BlockSpaceManager
from blocksim.engine import Engine
from blocksim.records.plan import read_plan
from blocksim.experiments.runner import build_config
from blocksim.sequence import SeqStatus
from validation import calibrate
from validation.validate import ValidationSetupError, choose_subset, report, validate_run


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: torch's thread pool only adds overhead (and contends on shared CI cores)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


TINY = {"layers": 1, "kv_heads": 1, "heads": 2, "head_size": 32}

# Parallel sampling (n > 1: shared prompts, copy-on-write) on 14 GPU blocks: groups are swapped.
SWAP_TRACE = pd.DataFrame({"arrival_s": [0, 0, 0.01, 0.02, 0.03, 0.05],
                           "prompt_tokens": [20, 35, 18, 40, 27, 50],
                           "output_tokens": [24, 30, 20, 16, 28, 12], "n": [2, 1, 2, 3, 1, 2]})
# Single sequences on 10 GPU blocks: preempted by recompute.
RECOMPUTE_TRACE = pd.DataFrame({"arrival_s": [0, 0, 0.01, 0.02, 0.03], "prompt_tokens": [20, 35, 18, 40, 27],
                                "output_tokens": [40, 30, 40, 16, 28], "n": 1})
SWAP_OPTS = {"num_gpu_blocks": 14, "preemption": "swap"}
RECOMPUTE_OPTS = {"num_gpu_blocks": 10}


class Recording(BlockSpaceManager):
    """A block manager that knows the engine step it is called in (set after the engine exists)."""

    engine = None
    diverged: list

    def now(self) -> int:
        return self.engine.rec.num_steps


def record(tmp_path, trace, manager=None, **options):
    """Simulate with a plan; return (run_dir, block manager)."""
    config = build_config("vllm", **options)
    run_dir = tmp_path / "run"
    factory = None
    if manager is not None:
        def factory(cfg):
            c = cfg.cache
            bm = manager(c.block_size, cfg.num_gpu_blocks, cfg.num_cpu_blocks, c.watermark)
            bm.diverged = []
            return bm
    eng = Engine(config, trace, plan_dir=run_dir, block_manager=factory)
    eng.bm.engine = eng
    eng.run()
    return run_dir, eng.bm


def first_block_held_by_two_requests(run_dir):
    """First step where one physical block is in the tables of scheduled sequences of two
    different requests (never legitimate without prefix caching)."""
    _, _, seqs, _ = read_plan(run_dir)
    for step, g in seqs.groupby("step", sort=True):
        owner = {}
        for rid, table in zip(g.request_id, g.block_table):
            for b in table:
                if owner.setdefault(int(b), rid) != rid:
                    return int(step)
    return None


def plan_counts(run_dir):
    _, steps, seqs, _ = read_plan(run_dir)
    recomputed = int((seqs.is_prefill & (seqs.context_len > seqs.prompt_tokens)).sum())
    return {"swap_in": sum(map(len, steps.swap_in_src)), "swap_out": sum(map(len, steps.swap_out_src)),
            "copy": sum(map(len, steps.copy_src)), "recomputed": recomputed}


# --- the deliberately broken block managers ---------------------------------------------------------
class SkipCopyOnWrite(Recording):
    """append_slots never copies: siblings keep writing into their shared last block."""

    def append_slots(self, seq):
        table = seq.block_table
        if len(table) * self.block_size >= seq.num_tokens and self.gpu.ref_counts[table[-1]] > 1:
            self.diverged.append(self.now())
            self.gpu_filled_slots += 1
            return None
        return super().append_slots(seq)


class FreeWhileReferenced(Recording):
    """On copy-on-write the source block goes back to the free list while a sibling still holds it."""

    def append_slots(self, seq):
        last = seq.block_table[-1] if seq.block_table else None
        cow = super().append_slots(seq)
        if cow is not None and self.gpu.ref_counts[last] > 0:
            self.gpu._free.append(last)  # the bug: still referenced
            self.diverged.append(self.now())
        return cow

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        release = self.gpu.free
        self.gpu.free = lambda b: release(b) if self.gpu.ref_counts[b] > 0 else None

    # Tolerate the double frees the bug leads to, so that the simulation runs to its end.
    def free(self, seq):
        if seq.status is not SeqStatus.SWAPPED:
            seq.block_table = [b for b in seq.block_table if self.gpu.ref_counts[b] > 0]
        super().free(seq)

    def _free_gpu_block(self, block, kv_len, index):
        if self.gpu.ref_counts[block] > 0:
            super()._free_gpu_block(block, kv_len, index)


class ShuffledSwapIn(Recording):
    """swap_in gives the tables one mapping and returns another (destinations rotated)."""

    def swap_in(self, group):
        mapping = super().swap_in(group)
        if len(set(mapping.values())) >= 2:
            src, dst = list(mapping), list(mapping.values())
            self.diverged.append(self.now())
            return dict(zip(src, dst[1:] + dst[:1]))
        return mapping


class StaleTableAfterRecompute(Recording):
    """A sequence re-admitted after recompute preemption gets its old block table back, blocks
    that may have gone to other sequences meanwhile."""

    def free(self, seq):
        self.__dict__.setdefault("old", {})[seq.seq_id] = list(seq.block_table)
        super().free(seq)

    def allocate(self, group):
        seqs = group.seqs_with(SeqStatus.WAITING)
        old = getattr(self, "old", {}).get(seqs[0].seq_id)
        if not group.preemptions or len(seqs) != 1 or not old:
            return super().allocate(group)
        s = seqs[0]
        need = -(-s.num_tokens // self.block_size)
        table = old[:need]
        for b in table:
            if b in self.gpu._free:
                self.gpu._free.remove(b)
                self.gpu.ref_counts[b] = 1
            else:
                self.gpu.ref_counts[b] += 1  # the bug: someone else's block
                self.diverged.append(self.now())
        while len(table) < need:
            table.append(self.gpu.allocate())
        s.block_table = table
        self.gpu_filled_slots += s.num_tokens


# --- tests -------------------------------------------------------------------------------------------
def test_clean_run_with_swaps_and_copy_on_write_validates(tmp_path):
    run_dir, _ = record(tmp_path, SWAP_TRACE, **SWAP_OPTS)
    counts = plan_counts(run_dir)
    assert counts["swap_in"] and counts["swap_out"] and counts["copy"], f"the scenario must swap and copy: {counts}"
    s = validate_run(run_dir, "reference", **TINY)
    assert s["ok"], s["error"]
    assert s["steps_checked"] == s["steps_in_plan"] > 0
    assert first_block_held_by_two_requests(run_dir) is None
    assert json.loads((run_dir / "validation" / "summary.json").read_text())["ok"]


def test_clean_run_with_recompute_validates(tmp_path):
    run_dir, _ = record(tmp_path, RECOMPUTE_TRACE, **RECOMPUTE_OPTS)
    assert plan_counts(run_dir)["recomputed"] > 0, "the scenario must recompute"
    s = validate_run(run_dir, "reference", **TINY)
    assert s["ok"], s["error"]


def test_bfloat16_and_grouped_heads_validate(tmp_path):
    run_dir, _ = record(tmp_path, SWAP_TRACE, **SWAP_OPTS)
    s = validate_run(run_dir, "reference", layers=2, kv_heads=2, heads=4, head_size=64, dtype="bfloat16",
                     max_steps=20)
    assert s["ok"], s["error"]
    assert s["steps_checked"] == 20


def test_skipped_copy_on_write_fails_on_the_skipped_step(tmp_path):
    run_dir, bm = record(tmp_path, SWAP_TRACE, SkipCopyOnWrite, **SWAP_OPTS)
    assert bm.diverged, "the broken manager never skipped a copy"
    s = validate_run(run_dir, "reference", **TINY)
    assert not s["ok"]
    e = s["error"]
    assert e["step"] == bm.diverged[0], e["message"]
    assert e["physical_block"] is not None and e["logical_block"] is not None and e["seq_id"] is not None


def test_block_freed_while_referenced_fails_when_it_is_reused(tmp_path):
    run_dir, bm = record(tmp_path, SWAP_TRACE, FreeWhileReferenced, **SWAP_OPTS)
    assert bm.diverged, "the broken manager never freed a shared block"
    reused = first_block_held_by_two_requests(run_dir)
    assert reused is not None and reused >= bm.diverged[0]
    s = validate_run(run_dir, "reference", **TINY)
    assert not s["ok"]
    assert s["error"]["step"] == reused, s["error"]["message"]


def test_wrong_swap_mapping_fails_on_the_swap_in_step(tmp_path):
    run_dir, bm = record(tmp_path, SWAP_TRACE, ShuffledSwapIn, **SWAP_OPTS)
    assert bm.diverged, "no swap-in of two or more blocks happened"
    s = validate_run(run_dir, "reference", **TINY)
    assert not s["ok"]
    e = s["error"]
    assert e["step"] == bm.diverged[0], e["message"]
    assert e["check"] == "content"
    _, _, seqs, _ = read_plan(run_dir)
    row = seqs[(seqs.step == e["step"]) & (seqs.seq_id == e["seq_id"])].iloc[0]
    assert row.block_table[e["logical_block"]] == e["physical_block"], "the error names the table's block"


def test_stale_block_table_after_recompute_fails_on_readmission(tmp_path):
    run_dir, bm = record(tmp_path, RECOMPUTE_TRACE, StaleTableAfterRecompute, **RECOMPUTE_OPTS)
    assert bm.diverged, "no re-admission reused a block owned by another sequence"
    assert first_block_held_by_two_requests(run_dir) == bm.diverged[0]
    s = validate_run(run_dir, "reference", **TINY)
    assert not s["ok"]
    assert s["error"]["step"] == bm.diverged[0], s["error"]["message"]


# --- bad input, subsets, timing report ------------------------------------------------------------------
def test_run_without_plan_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValidationSetupError, match="--record-plan"):
        validate_run(tmp_path, "reference")


def test_plan_of_another_version_is_refused(tmp_path):
    run_dir, _ = record(tmp_path, RECOMPUTE_TRACE, **RECOMPUTE_OPTS)
    meta = run_dir / "plan" / "meta.json"
    meta.write_text(meta.read_text().replace('"plan_version": 1', '"plan_version": 99'))
    with pytest.raises(ValidationSetupError, match="version"):
        validate_run(run_dir, "reference")


META = {"num_layers": 32, "num_kv_heads": 8, "num_heads": 32, "head_size": 128, "block_size": 16,
        "num_gpu_blocks": 10000, "num_cpu_blocks": 100}


def test_subset_defaults_and_memory_limits():
    ref = choose_subset(META, "reference")
    assert (len(ref.layers), ref.kv_heads, ref.heads, ref.head_size, ref.dtype) == (1, 1, 2, 32, "float32")
    assert ref.notes, "a subset is stated"
    per_layer = 2 * 10000 * 16 * 8 * 128 * 2
    gpu = choose_subset(META, "cuda", free_bytes=(6 << 30) + 5 * per_layer)
    assert len(gpu.layers) == 5 and gpu.check_layers == [0, 4] and "first 5" in gpu.notes[0]
    with pytest.raises(ValidationSetupError, match="--layers 5"):
        choose_subset(META, "cuda", layers=32, free_bytes=(6 << 30) + 5 * per_layer)
    with pytest.raises(ValidationSetupError, match="head size"):
        choose_subset(META, "reference", head_size=48)


def test_timing_report_and_calibration_profile(tmp_path):
    from blocksim.cost import CostParams
    run_dir, _ = record(tmp_path, SWAP_TRACE, **SWAP_OPTS)
    fit_dir = tmp_path / "fit"
    for d in (fit_dir, tmp_path / "eval"):
        s = validate_run(run_dir, "reference", out_dir=d, timing=True, **TINY)
        assert s["ok"]
    t = pd.read_parquet(fit_dir / "validation" / "timings.parquet")
    assert (t["m_attn_decode_s"] > 0).any() and (t["m_copy_s"] > 0).any() and (t["m_swap_s"] > 0).any()
    s = report(run_dir, out_dir=tmp_path / "eval", calibrate_with=fit_dir)
    params = CostParams.from_json(s["cost_profile"])
    assert params.scale_attn_decode == pytest.approx(s["scales"]["attn_decode"])
    md = (tmp_path / "eval" / "validation.md").read_text()
    assert "calibrated MAPE" in md and "all 56 steps passed" in md


def test_fit_recovers_a_known_scale():
    rng = np.random.default_rng(0)
    meas = rng.uniform(1e-4, 1e-3, 50)
    t = pd.DataFrame({"t_attn_decode_s": meas / 3, "m_attn_decode_s": meas, "t_swap_s": 0.0, "m_swap_s": 0.0,
                      "t_copy_s": meas * 2, "m_copy_s": meas})
    scales = calibrate.fit_scales(t)
    assert scales == {"attn_decode": pytest.approx(3.0), "copy": pytest.approx(0.5)}
    assert calibrate.errors(t, scales)["attn_decode"]["mape_pct"] == pytest.approx(0.0, abs=1e-9)


# Shared prefixes (16-token hash blocks) on a small cache: prefix hits, shared blocks and preemption.
SHARED_TRACE = pd.DataFrame({"arrival_s": [0, 0, 0.01, 0.02, 0.03, 0.04, 0.05],
                             "prompt_tokens": [40, 40, 36, 50, 20, 44, 33],
                             "output_tokens": [30, 20, 25, 16, 28, 12, 20],
                             "prefix_hashes": [[1, 2, 10], [1, 2, 11], [1, 3, 12], [4, 5, 6, 13], [7, 14],
                                               [1, 2, 9], [4, 5, 15]]})


@pytest.mark.parametrize("policy, options", [
    ("vllm-v1", {"num_gpu_blocks": 14}),
    ("vllm-v1", {"num_gpu_blocks": 40, "max_num_batched_tokens": 24, "long_prefill_token_threshold": 16}),
    ("vllm-0.6", {"num_gpu_blocks": 14, "prefix_caching": True, "preemption": "swap"}),
    ("vllm-prefix", {"num_gpu_blocks": 12, "chunked_prefill": True, "max_num_batched_tokens": 24}),
])
def test_plans_of_the_engines_presets_validate(tmp_path, policy, options):
    import traces
    config = build_config(policy, block_size=16, **options)
    run_dir = tmp_path / "run"
    res = Engine(config, traces.Trace(SHARED_TRACE, 16, "shared"), plan_dir=run_dir).run()
    assert res.summary["prefix_cache_hits"] > 0, "the scenario must share cached blocks"
    s = validate_run(run_dir, "reference", **TINY)
    assert s["ok"], s["error"]
    assert s["steps_checked"] == s["steps_in_plan"] > 0
