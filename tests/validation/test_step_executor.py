"""validation.step_executor: `blocksim replay --executor` runs every step with the model (here the
CPU path with a tiny model): one measured row per engine step, the step's duration is the
measured time, swaps and copy-on-write copies execute, and bad runs are refused before starting."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from blocksim.cli import main  # noqa: E402
from validation.model import ModelDims  # noqa: E402
from validation.sleeps import Lead  # noqa: E402
from validation.step_executor import ExecutorError, memory_check  # noqa: E402

TINY = """models:
  tiny: {num_layers: 2, hidden_size: 256, num_heads: 4, num_kv_heads: 2, head_size: 64, num_params: 1.0e6,
         max_model_len: 256, intermediate_size: 256, vocab_size: 512}
"""


def trace(path, n=1, requests=12, seed=1):
    rng = np.random.default_rng(seed)
    pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 0.05, requests)),
                  "prompt_tokens": rng.integers(5, 60, requests), "output_tokens": rng.integers(2, 20, requests),
                  "n": n}).to_parquet(path, index=False)
    return path


@pytest.mark.parametrize("extra, n", [((), 1), (("--preemption", "swap", "--num-gpu-blocks", "16"), 2),
                                      (("--policy", "vllm-chunked", "--max-num-batched-tokens", "32"), 1)])
def test_every_step_is_executed_and_lasts_its_measured_time(tmp_path, extra, n):
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "run"
    args = ["replay", str(trace(tmp_path / "t.parquet", n)), "--out", str(out), "--catalog", str(tmp_path / "tiny.yaml"),
            "--model", "tiny", "--executor", "cpu", "--quiet", "--no-report"]
    if "--num-gpu-blocks" not in extra:
        args += ["--num-gpu-blocks", "12"]
    assert main(args + list(extra)) == 0
    steps = pd.read_parquet(out / "steps.parquet")
    ex = pd.read_parquet(out / "executor_steps.parquet")
    assert len(ex) == len(steps) and (ex["step"].to_numpy() == np.arange(len(steps))).all()
    np.testing.assert_allclose(steps["duration_s"].to_numpy(), ex["measured_s"].to_numpy())
    assert (ex["num_tokens"] == steps["prefill_tokens"] + steps["num_decode_seqs"]).all() or n > 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 12 and summary["executor"]["model"] == "tiny"
    if n == 2:
        assert steps["blocks_swapped_out"].sum() > 0


def test_a_run_that_does_not_fit_is_refused_naming_the_sizes():
    dims = ModelDims("m", 32, 4096, 32, 32, 128, 11008, 32000, 4096)
    with pytest.raises(ExecutorError, match=r"needs .* GiB \(weights .* KV cache 10000 blocks .* GiB free"):
        memory_check(dims, 10000, 16, 2, 40 << 30)
    memory_check(dims, 1000, 16, 2, 40 << 30)
    with pytest.raises(ExecutorError, match=r"--executor cpu: .* 2 ranks x \(weights .* this machine has 20.0 GiB free"):
        memory_check(dims, 1000, 16, 2, 20 << 30, device="cpu", ranks=2)  # the host holds every rank


def test_a_block_size_without_an_attention_kernel_is_refused_naming_the_option(tmp_path, capsys):
    """SGLang's default page of one token has no paged attention kernel: the run is refused before
    it starts, in one line naming --page-size and the sizes that run."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    rc = main(["replay", str(trace(tmp_path / "t.parquet")), "--out", str(tmp_path / "run"), "--catalog",
               str(tmp_path / "tiny.yaml"), "--model", "tiny", "--policy", "sglang", "--num-gpu-blocks", "512",
               "--executor", "cpu", "--quiet", "--no-report"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "--page-size" in err[0] and "8, 16, 32" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "run").exists()


def test_cuda_executor_without_a_gpu_is_a_configuration_error(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    (tmp_path / "tiny.yaml").write_text(TINY)
    rc = main(["replay", str(trace(tmp_path / "t.parquet")), "--out", str(tmp_path / "r"), "--catalog",
               str(tmp_path / "tiny.yaml"), "--model", "tiny", "--executor", "cuda", "--quiet", "--no-report"])
    assert rc == 2 and "no CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_executor_replays_decodes_as_graphs(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "run"
    assert main(["replay", str(trace(tmp_path / "t.parquet", 2)), "--out", str(out), "--catalog",
                 str(tmp_path / "tiny.yaml"), "--model", "tiny", "--gpu", "h200-141gb", "--num-gpu-blocks", "16",
                 "--preemption", "swap", "--max-num-seqs", "8", "--swap-space-gib", "0.0625", "--executor", "cuda",
                 "--quiet", "--no-report"]) == 0
    ex = pd.read_parquet(out / "executor_steps.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    assert len(ex) == len(steps) and ex["graph"].any() and (~ex["graph"]).any()
    assert (ex.loc[ex.graph, "padded_batch"] >= ex.loc[ex.graph, "num_decodes"]).all()
    assert (ex["measured_s"] > 0).all()
    np.testing.assert_allclose(steps["duration_s"].to_numpy(), ex["measured_s"].to_numpy())


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-prefix"])
def test_tier_moves_execute_in_the_loop_and_every_restored_chunk_checks(tmp_path, policy):
    """With KV tiers, the executor performs each step's tier moves on the model's caches (host and
    disk tiers of the tier executor) and checksums every chunk it restores: none differs, and the
    moves are the plan's."""
    import traces
    from blocksim.engine import Engine
    from blocksim.experiments.runner import build_config
    from validation.step_executor import ModelStepExecutor

    (tmp_path / "tiny.yaml").write_text(TINY)
    n, bs = 40, 16
    prompts = [96] * n
    hashes = [[(i % 6) * 1000 + j for j in range(p // bs)] for i, p in enumerate(prompts)]
    df = pd.DataFrame({"arrival_s": np.arange(n) * 0.01, "prompt_tokens": prompts, "output_tokens": [3] * n,
                       "prefix_hashes": hashes})
    chunk_bytes = bs * 2 * 2 * 2 * 64 * 2  # tokens x K,V x layers x KV heads x head size x 2 B
    cfg = build_config(policy, catalog=[str(tmp_path / "tiny.yaml")], model="tiny", num_gpu_blocks=24,
                       max_num_seqs=4, max_num_batched_tokens=128, tier_host_gib=12 * chunk_bytes / 2**30,
                       tier_disk_gib=400 * chunk_bytes / 2**30, tier_disk_path=str(tmp_path))
    ex = ModelStepExecutor(cfg, device="cpu")
    e = Engine(cfg, traces.Trace(df, hash_block_tokens=bs), executor=ex, plan_dir=tmp_path,
               check_invariants=True)
    res = e.run()
    ex.save(tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "executor.json").read_text())
    plan_ops = pd.read_parquet(tmp_path / "plan" / "tier_ops.parquet")
    assert res.summary["tier_host_hit_tokens"] + res.summary.get("tier_disk_hit_tokens", 0) > 0
    assert summary["tier_checked_loads"] > 0 and summary["tier_checksum_mismatches"] == 0
    moves = pd.read_parquet(tmp_path / "run" / "executor_tier_moves.parquet")
    assert moves["chunks"].sum() == (~plan_ops["evict"]).sum(), "every copy of the plan was performed"


def _replay_tiny_on_cpu(tmp_path):
    """`blocksim replay` of the tiny model's trace with the CPU executor (12 GPU blocks); its run directory."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "run"
    assert main(["replay", str(trace(tmp_path / "t.parquet")), "--out", str(out), "--catalog", str(tmp_path / "tiny.yaml"),
                 "--model", "tiny", "--executor", "cpu", "--num-gpu-blocks", "12", "--quiet", "--no-report"]) == 0
    return out


@pytest.mark.parametrize("fraction", [0.005, 1e9])
def test_an_eager_forward_with_late_segments_is_timed_again(tmp_path, monkeypatch, host_clock_cuda, fraction):
    """The CUDA path's timing on the CPU runner, events on the host clock: with sleeps of no length
    every segment is late by all of its host time, so every eager forward runs again with the
    longer sleeps, and that second time is the step's; the run keeps its requests and the rows say
    what happened. Overruns below `RETIME_FRACTION` of the time are recorded and left."""
    import validation.step_executor as se

    monkeypatch.setattr(se, "LEAD_S", 0.0)           # no launch is queued within a sleep of nothing
    monkeypatch.setattr(se, "RETIME_LEAD_S", 60.0)   # and every one within a minute
    monkeypatch.setattr(se, "RETIME_FRACTION", fraction)
    init = se.ModelStepExecutor.__init__

    def timed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.cuda = True  # the timed path, on the CPU runner
        self.eager_lead = Lead(0.0, 0.0)  # kept at nothing: not raised to keep ahead of the host

    monkeypatch.setattr(se.ModelStepExecutor, "__init__", timed_init)
    out = _replay_tiny_on_cpu(tmp_path)
    ex = pd.read_parquet(out / "executor_steps.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    eager = ex[ex.num_tokens > 0]
    retimed = fraction < 1
    assert len(eager) == len(ex) and (eager.retimed == retimed).all()  # no graphs on the CPU: every step eager
    assert (eager.late_segments >= 3).all()                        # the embedding, each layer, the sampling
    assert (eager.late_after_retime == 0).all() and (eager.late_s > 0).all()
    np.testing.assert_allclose(steps["duration_s"].to_numpy(), ex["measured_s"].to_numpy())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 12
    totals = json.loads((out / "executor.json").read_text())
    assert totals["late_steps"] == len(ex) and totals["retimed_steps"] == (len(ex) if retimed else 0)


def test_a_late_graph_replay_is_replayed_again(tmp_path, monkeypatch, host_clock_cuda):
    """The graph path on the CPU runner (a stand-in graph: loading keeps the step's inputs, a replay
    runs them eagerly, untimed inside), events on the host clock: with a sleep of nothing before
    each replay, every replay is late, and it is replayed again with the longer sleep, that time
    counting; the run keeps its requests."""
    import validation.step_executor as se

    monkeypatch.setattr(se, "RETIME_LEAD_S", 60.0)
    init = se.ModelStepExecutor.__init__
    replays = []

    def timed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.cuda = True
        self.graph_lead = Lead(0.0, 0.0)  # kept at nothing: not raised to keep ahead of the host
        self.graph_sizes, self.max_graph_batch = [1, 2, 4], 4
        r = self.runner
        loaded = {}

        def load_decode(batch, padded):
            loaded["inp"] = r.prepare(batch)

        def replay_decode(padded, parts=None):
            replays.append(padded)
            return r.forward(loaded["inp"])
        r.load_decode, r.replay_decode = load_decode, replay_decode

    monkeypatch.setattr(se.ModelStepExecutor, "__init__", timed_init)
    out = _replay_tiny_on_cpu(tmp_path)
    ex = pd.read_parquet(out / "executor_steps.parquet")
    graph = ex[ex.graph]
    assert len(graph) > 0 and graph.retimed.all() and (graph.late_segments == 1).all()
    assert (graph.lead_s == 60.0).all(), "the kept timing's sleep: the retime's"
    assert json.loads((out / "executor.json").read_text())["graph_lead_s"] == 0.0
    assert (graph.late_after_retime == 0).all() and len(replays) == 2 * len(graph)
    assert json.loads((out / "summary.json").read_text())["finished"] == 12


def test_the_sleeps_rise_to_keep_ahead_of_a_slow_host(tmp_path, monkeypatch, host_clock_cuda):
    """The CUDA path's timing on the CPU runner, events on the host clock, where a segment's host
    time is its work: from a lead of nothing every segment of the first eager step is late and the
    step timed again; the lead then rises to a margin over the host's segment times (`lead_s`), and
    most later segments fall within it."""
    import validation.step_executor as se
    init = se.ModelStepExecutor.__init__

    def timed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.cuda = True
        self.eager_lead = Lead(0.0, 60.0, window=64)

    monkeypatch.setattr(se.ModelStepExecutor, "__init__", timed_init)
    out = _replay_tiny_on_cpu(tmp_path)
    ex = pd.read_parquet(out / "executor_steps.parquet")
    eager = ex[ex.num_tokens > 0].reset_index(drop=True)
    segments = eager.late_segments.iloc[0]  # a lead of nothing: every segment of the first step late
    assert segments >= 3 and eager.retimed.iloc[0]
    assert eager.lead_s.iloc[0] == se.RETIME_LEAD_S  # the kept timing's: the retime's (4 x 0, at least this)
    assert (eager.lead_s.iloc[1:] > 0).all()
    later = eager.iloc[len(eager) // 2:]
    assert later.late_segments.sum() < segments * len(later) / 4
    assert json.loads((out / "summary.json").read_text())["finished"] == 12


def test_a_replay_on_the_executor_logs_how_its_steps_were_timed(tmp_path, caplog):
    """After an executed replay, one log line (`-v`) from its executor.json: the executed steps,
    those with a late segment, those timed again and where the sleeps settled."""
    import logging

    from blocksim.experiments.runner import _log_executor_totals
    out = _replay_tiny_on_cpu(tmp_path)
    totals = json.loads((out / "executor.json").read_text())
    logging.getLogger().addHandler(caplog.handler)  # the CLI's logging set-up took it off the root
    with caplog.at_level(logging.INFO, logger="blocksim.experiments.runner"):
        _log_executor_totals(out / "executor.json")
        _log_executor_totals(tmp_path / "none.json")  # no file: nothing said
    assert [r.getMessage() for r in caplog.records] == [
        f"executor: {totals['steps']} steps (0 graph replays), {totals['late_steps']} with a late segment, "
        f"{totals['retimed_steps']} timed again; sleeps settled at 50 us before a graph replay, 1.20 ms before "
        f"an eager segment"]
