"""Fidelity of a simulated run against an executed one, on run directories with known answers."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.fidelity import ROW_KEYS, FidelityError, append_rows, compare, compare_runs, reprice_plan
from analysis.fidelity_replay import measured_replay, rebuild_cost_model
from blocksim.cli import main
from blocksim.experiments.runner import replay

TRACE = pd.DataFrame({"arrival_s": np.arange(12) * 0.05, "prompt_tokens": [40, 300, 90, 17, 250, 60] * 2,
                      "output_tokens": [12, 30, 7, 40, 3, 22] * 2})


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs") / "sim"
    replay(TRACE, d, overrides={"cost_model": "roofline"}, record_plan=True)
    return d


def scaled_copy(src, dst, latency: float, time: float):
    """EXEC: SIM's requests with latencies x `latency`, and every step (and so the run) x `time` longer."""
    shutil.copytree(src, dst)
    r = pd.read_parquet(dst / "requests.parquet")
    for c in ("ttft_s", "tpot_s", "e2e_s"):
        r[c] = r[c] * latency
    r.to_parquet(dst / "requests.parquet", index=False)
    s = pd.read_parquet(dst / "steps.parquet")
    s["start_s"] = s.start_s * time
    s["duration_s"] = s.duration_s * time
    s.to_parquet(dst / "steps.parquet", index=False)
    return dst


def test_known_errors(sim, tmp_path):
    exe = scaled_copy(sim, tmp_path / "exec", latency=1.25, time=2.0)
    f = compare(sim, exe)
    assert f.matched == len(TRACE)
    for r in f.latency.itertuples():
        assert r.err == pytest.approx(1 / 1.25 - 1, abs=1e-12), f"{r.metric} p{r.percentile}"
    assert f.throughput["err"] == pytest.approx(1.0, rel=1e-9), "EXEC's serving interval is twice as long"
    assert f.step_mape == pytest.approx(0.5, rel=1e-12), "each step measured twice its predicted time"
    assert "one for one" in f.step_source
    row = f.row()
    assert list(row)[: len(ROW_KEYS)] == list(ROW_KEYS)
    assert row["cost_model"] == "roofline" and row["model"] == "llama-2-7b" and row["tensor_parallel"] == 1
    assert row["ttft_p99_err"] == pytest.approx(-0.2)


def test_an_executed_plan_is_repriced_by_the_simulated_cost_model(sim, tmp_path):
    summary = json.loads((sim / "summary.json").read_text())
    steps, pred = reprice_plan(sim, rebuild_cost_model(summary))
    want = pd.read_parquet(sim / "steps.parquet").duration_s.to_numpy()
    np.testing.assert_array_equal(pred, want, err_msg="re-pricing a plan gives the engine's own step times")
    exe = scaled_copy(sim, tmp_path / "exec", latency=1.0, time=1.0)
    s = pd.read_parquet(exe / "steps.parquet")
    s.loc[0, "prefill_tokens"] += 1  # no longer SIM's steps: predictions come from the plan
    s["duration_s"] = s.duration_s * 1.1
    s.to_parquet(exe / "steps.parquet", index=False)
    f = compare(sim, exe)
    assert "re-priced" in f.step_source
    assert f.step_mape == pytest.approx(1 - 1 / 1.1, rel=1e-9)


@pytest.mark.parametrize("policy, n", [("vllm-chunked", 1), ("vllm", 2)])
def test_a_plan_of_uneven_eager_steps_is_repriced_as_the_engine_priced_it(tmp_path, monkeypatch, policy, n):
    """A profile with the longest-row table prices an eager step's decodes by their longest row too
    (with samples sharing their prompt's blocks, which graph steps are priced by): the engine and the
    plan's re-pricing give the same seconds, and some eager steps pay for uneven rows."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "blocksim"))
    from cost_profiles import write_profile  # the synthetic profile of tests/blocksim
    prof = write_profile(tmp_path / "p.json", decode_step="longest", shared=0.9)
    trace = TRACE.assign(prompt_tokens=TRACE.prompt_tokens * 6, n=n)
    run = tmp_path / "run"
    replay(trace, run, policy=policy, overrides={"cost_model": "profiled", "cost_profile": str(prof),
                                                 "num_gpu_blocks": 300}, record_plan=True)
    summary = json.loads((run / "summary.json").read_text())
    cost = rebuild_cost_model(summary)
    steps, pred = reprice_plan(run, cost)
    got = pd.read_parquet(run / "steps.parquet").set_index("step")
    np.testing.assert_array_equal(pred, got.loc[steps, "duration_s"].to_numpy())
    eager = got[(got.num_prefill_seqs > 0) & (got.num_decode_seqs > 0)]
    assert len(eager)
    at_mean = np.array([cost.attn_decode(int(c), int(d))
                        for c, d in zip(eager.decode_ctx_tokens, eager.num_decode_seqs)])
    assert (eager.t_attn_decode_s.to_numpy() > at_mean * (1 + 1e-9)).any(), "an uneven batch costs more"


def test_no_step_comparison_without_matching_steps_plan_or_model(sim, tmp_path):
    exe = scaled_copy(sim, tmp_path / "exec", 1.0, 1.0)
    shutil.rmtree(exe / "plan")
    s = pd.read_parquet(exe / "steps.parquet")
    s.loc[0, "prefill_tokens"] += 1
    s.to_parquet(exe / "steps.parquet", index=False)
    summary = json.loads((exe / "summary.json").read_text())
    summary["cost_model"] = {"name": "profiled", "profile": "elsewhere.json"}
    (exe / "summary.json").write_text(json.dumps(summary))
    f = compare(sim, exe)
    assert f.step_mape is None and f.row()["step_mape"] is None and "no per-step" in f.step_source


def test_runs_of_different_traces_are_refused(sim, tmp_path):
    other = tmp_path / "other"
    replay(TRACE.iloc[:8], other, overrides={"cost_model": "roofline"})
    with pytest.raises(FidelityError, match="different traces"):
        compare(sim, other)
    longer = scaled_copy(sim, tmp_path / "x", 1.0, 1.0)
    r = pd.read_parquet(longer / "requests.parquet")
    r.loc[3, "prompt_tokens"] += 1
    r.to_parquet(longer / "requests.parquet", index=False)
    with pytest.raises(FidelityError, match="prompt_tokens"):
        compare(sim, longer)


@pytest.mark.parametrize("which", ["missing", "not_a_run"])
def test_bad_directories_get_one_line_and_exit_2(sim, tmp_path, capsys, which):
    bad = tmp_path / "nothing"
    if which == "not_a_run":
        bad.mkdir()
        (bad / "summary.json").write_text("{}")
    code = main(["fidelity", str(sim), str(bad), "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_command_writes_the_report_and_adds_the_row(sim, tmp_path, capsys):
    exe = scaled_copy(sim, tmp_path / "exec", latency=1.1, time=1.0)
    results = tmp_path / "results" / "fidelity.json"
    for _ in range(2):  # the same row twice: replaced, not duplicated
        assert main(["fidelity", str(sim), str(exe), "--out", str(tmp_path / "f"), "--results", str(results),
                     "--trace", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "ttft" in out and "per-step MAPE: 0.00%" in out
    rows = json.loads(results.read_text())
    assert len(rows) == 1 and rows[0]["trace"] == "tiny"
    assert rows[0]["ttft_p50_err"] == pytest.approx(1 / 1.1 - 1)
    assert (tmp_path / "f" / "fidelity.html").is_file() and (tmp_path / "f" / "fidelity.md").is_file()
    append_rows(results, [{**rows[0], "cost_model": "profiled"}])
    assert len(json.loads(results.read_text())) == 2


def test_rows_named_by_other_settings_replace_their_own(tmp_path):
    """`identity` names a row by other keys, dict values included (compare_prefix.py's runs)."""
    path = tmp_path / "runs.json"
    run = {"preset": "sglang", "options": {"schedule_policy": "lpm", "chunk": 64}, "ttft_p50_s": 1.0}
    append_rows(path, [run, {**run, "options": {}}], identity=("preset", "options"))
    append_rows(path, [{**run, "options": {"chunk": 64, "schedule_policy": "lpm"}, "ttft_p50_s": 2.0}],
                identity=("preset", "options"))
    rows = json.loads(path.read_text())
    assert [(r["options"], r["ttft_p50_s"]) for r in rows] == [({}, 1.0), (run["options"], 2.0)]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("policy, trace_file", [("vllm", "azure_conv_2023_sample.csv"),
                                                ("vllm-prefix", "mooncake_sample.jsonl")])
def test_executed_steps_are_priced_by_another_model_at_their_measured_times(tmp_path, policy, trace_file):
    """EXEC stands in for an executed run: another cost model's step times play the measured ones."""
    import sys

    import traces
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "blocksim"))
    from cost_profiles import write_profile  # the synthetic profile of tests/blocksim
    src = traces.bundled("azure-conv").parent / trace_file
    prof = write_profile(tmp_path / "p.json")
    exe, sim = tmp_path / "exec", tmp_path / "sim"
    common = {"max_requests": 60, "clip_to_model": True}
    replay(str(src), exe, policy=policy, overrides={"cost_model": "profiled", "cost_profile": str(prof),
                                                    "num_gpu_blocks": 400}, record_plan=True, **common)
    replay(str(src), sim, policy=policy, overrides={"cost_model": "roofline", "num_gpu_blocks": 400}, **common)
    f = compare(sim, exe)
    assert "re-played at its measured step times" in f.step_source, f.step_source
    _, by_plan = reprice_plan(exe, rebuild_cost_model(json.loads((sim / "summary.json").read_text())))
    np.testing.assert_allclose(f.predicted_s, by_plan, rtol=1e-12,
                               err_msg="re-playing and re-pricing the plan price the same executed steps")
    own = measured_replay(json.loads((exe / "summary.json").read_text()), f.exec)
    np.testing.assert_array_equal(own, pd.read_parquet(exe / "steps.parquet").duration_s.to_numpy(),
                                  err_msg="EXEC's own model re-played prices its steps as it ran them")
    assert compare_runs(sim, exe)["step_mape"] == pytest.approx(f.step_mape)


def test_a_profile_measured_again_since_the_run_is_not_used_to_price_it(tmp_path):
    import blocksim.cost as cost
    from blocksim.experiments.runner import build_config
    path = cost.shipped_profile(build_config(model="llama-2-7b", gpu="h200-141gb"))
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    made = json.loads(copy.read_text())["created_utc"]
    summary = {"config": json.loads(json.dumps(_summary_config())),
               "cost_model": {"name": "profiled", "profile": str(copy), "created_utc": made}}
    assert rebuild_cost_model(summary).name == "profiled"
    summary["cost_model"]["created_utc"] = "2000-01-01T00:00:00Z"
    with pytest.raises(ValueError, match="measured at .* not at 2000-01-01"):
        rebuild_cost_model(summary)


def test_a_table_added_to_the_profile_since_the_run_is_not_used_to_price_it(tmp_path):
    """A table measured again by `blocksim profile --add-table` keeps the profile's created_utc;
    the run's record of the tables measured again tells it apart."""
    import blocksim.cost as cost
    from blocksim.experiments.runner import build_config
    path = cost.shipped_profile(build_config(model="llama-2-7b", gpu="h200-141gb"))
    data = json.loads(path.read_text())
    copy = tmp_path / path.name
    copy.write_text(json.dumps(data))
    then = cost.load_profile(copy).tables_measured
    assert then, "the shipped H200 profile holds tables measured again"
    summary = {"config": json.loads(json.dumps(_summary_config())),
               "cost_model": {"name": "profiled", "profile": str(copy), "created_utc": data["created_utc"],
                              "tables_measured": dict(sorted(then.items()))}}
    assert rebuild_cost_model(summary).name == "profiled"
    data["components"]["attn_decode"]["measured"]["utc"] = "2099-01-01T00:00:00Z"
    copy.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="attn_decode measured again since the run"):
        rebuild_cost_model(summary)
    del summary["cost_model"]["tables_measured"]  # a run recorded before the key: taken as it is
    assert rebuild_cost_model(summary).name == "profiled"


def test_a_profile_calibrated_since_the_run_is_not_used_to_price_it(tmp_path):
    """`blocksim profile --calibrate` keeps the base's created_utc; the run's record of the
    calibration (its time) tells a calibrated profile from its base and from another calibration."""
    import blocksim.cost as cost
    from blocksim.experiments.runner import build_config
    path = cost.shipped_profile(build_config(model="llama-2-7b", gpu="h200-141gb"))
    data = json.loads(path.read_text())
    copy = tmp_path / path.name
    copy.write_text(json.dumps(data))
    summary = {"config": json.loads(json.dumps(_summary_config())),
               "cost_model": {"name": "profiled", "profile": str(copy), "created_utc": data["created_utc"]}}
    assert rebuild_cost_model(summary).name == "profiled"
    data["calibrated"] = {"utc": "2099-01-01T00:00:00Z", "tables": {}}
    copy.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="is calibrated at 2099-01-01T00:00:00Z, the run used it not calibrated"):
        rebuild_cost_model(summary)
    summary["cost_model"]["calibrated"] = {"utc": "2099-01-01T00:00:00Z", "scales": {}}
    assert rebuild_cost_model(summary).name == "profiled"
    summary["cost_model"]["calibrated"]["utc"] = "2098-01-01T00:00:00Z"
    with pytest.raises(ValueError, match="the run used it calibrated at 2098"):
        rebuild_cost_model(summary)


def _summary_config() -> dict:
    """The `config` of a summary.json: that of a short run on the shipped profile's model and GPU."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        replay(TRACE.head(2), Path(d) / "r", overrides={"model": "llama-2-7b", "gpu": "h200-141gb",
                                                        "cost_model": "roofline"})
        return json.loads((Path(d) / "r" / "summary.json").read_text())["config"]


def test_a_scaled_profile_prices_every_step_that_much_longer(tmp_path):
    """benchmarks/fidelity_runs.py sensitivity: a profile with every measured time scaled prices
    each kind of step (graph, eager with prompts, block moves) by the same factor."""
    import importlib.util
    import warnings

    from blocksim.cost import ProfiledCostModel, load_profile, shipped_profile
    from blocksim.experiments.runner import build_config
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("fidelity_runs", root / "benchmarks" / "fidelity_runs.py")
    fr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fr)
    cfg = build_config(model="llama-3-8b", gpu="h200-141gb")
    src = shipped_profile(cfg)
    scaled = fr.scaled_profile(src, 1.25, tmp_path / src.name)
    assert json.loads(scaled.read_text())["components"]["attn_prefill"]["grid"] == \
        json.loads(src.read_text())["components"]["attn_prefill"]["grid"], "the grids stay"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = ProfiledCostModel(cfg, load_profile(src)), ProfiledCostModel(cfg, load_profile(scaled))
    for cm_a, cm_b in ((a.linear(300, 2, False), b.linear(300, 2, False)),
                       (a.attn_prefill(np.array([100, 900]), np.array([0, 64])),
                        b.attn_prefill(np.array([100, 900]), np.array([0, 64]))),
                       (a.attn_decode(16 * 700, 16, True, 1500), b.attn_decode(16 * 700, 16, True, 1500)),
                       (a.attn_decode(16 * 700, 16, True, 1500, shared=4000),
                        b.attn_decode(16 * 700, 16, True, 1500, shared=4000)),
                       (a.swap(3, 5) + a.copy(2), b.swap(3, 5) + b.copy(2)),
                       (a.overhead(True, 0), b.overhead(True, 0))):
        assert cm_b == pytest.approx(1.25 * cm_a, rel=1e-9)


def _benchmark_script(name: str):
    """benchmarks/NAME.py loaded as a module."""
    import importlib.util
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(name, root / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fidelity_runs():
    return _benchmark_script("fidelity_runs")


def test_sensitivity_scales_the_profile_its_twin_was_priced_by(tmp_path):
    """benchmarks/fidelity_runs.py sensitivity: the profile scaled is the one the unscaled twin in
    --sim recorded (`simulate --profile-dir` gives another than the shipped one)."""
    fr = _fidelity_runs()
    shipped = tmp_path / "shipped.json"
    base = tmp_path / "twin"
    base.mkdir()
    other = tmp_path / "profiles" / "llama-2-7b__h200-141gb__float16__tp1.json"
    for rec, want in (({"name": "profiled", "profile": str(other)}, other),
                      ({"name": "profiled", "profile": "blocksim/profiles/llama-2-7b__h200-141gb__float16__tp1.json"},
                       fr.ROOT / "blocksim" / "profiles" / "llama-2-7b__h200-141gb__float16__tp1.json"),
                      ({"name": "roofline", "params": {}}, shipped)):
        (base / "summary.json").write_text(json.dumps({"cost_model": rec}))
        assert fr.twin_profile(base, shipped) == want


def test_sensitivity_without_executed_runs_or_twins_is_refused_in_one_line(tmp_path, capsys):
    fr = _fidelity_runs()
    (tmp_path / "exec" / "r").mkdir(parents=True)
    args = ["sensitivity", "--sim", str(tmp_path / "sim"), "--out", str(tmp_path / "out"),
            "--json", str(tmp_path / "s.json")]
    assert fr.main(args + ["--exec", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--exec" in err and "no executed runs" in err
    (tmp_path / "exec" / "r" / "executor.json").write_text("{}")
    assert fr.main(args + ["--exec", str(tmp_path / "exec")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--sim" in err and "profiled/" in err
    assert not (tmp_path / "s.json").exists(), "no empty results file written"


@pytest.mark.parametrize("content", ['{"rows": [{"run": "r", "step": 0.01}]}', '{"rows": {"a": 1}}', "[]", "not json"])
def test_results_refuse_a_malformed_sensitivity_file_in_one_line(tmp_path, capsys, content):
    fr = _fidelity_runs()
    bad = tmp_path / "sens.json"
    bad.write_text(content)
    rc = fr.main(["results", "--exec", str(tmp_path / "exec"), "--sim", str(tmp_path / "sim"),
                  "--json", str(tmp_path / "out.json"), "--sensitivity", str(bad)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--sensitivity" in err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("same_lease", [True, False])
def test_the_lease_note_names_the_executed_twice_table_only_where_there_is_one(tmp_path, same_lease):
    """benchmarks/fidelity_runs.py results: a document without --repeat has no "Executed twice"
    table, so its lease paragraph must not point to one."""
    fr = _fidelity_runs()
    with_table = " ".join(fr.lease_note(same_lease, tmp_path, repeated=True).split())
    without = " ".join(fr.lease_note(same_lease, tmp_path, repeated=False).split())
    assert "Executed twice" in with_table
    assert "Executed twice" not in without
    assert without.endswith(("mean.", "them."))


def test_the_lease_note_names_the_tables_measured_on_the_runs_lease(tmp_path):
    """fidelity_runs.py results --added-tables-lease: the runs share a lease with the profiles' tables
    that name theirs under `measured`, each named with its day, the other tables from an earlier one."""
    fr = _fidelity_runs()
    exec_dir, sim = tmp_path / "exec", tmp_path / "sim"
    run = exec_dir / "azure-conv__vllm__llama-2-7b"
    run.mkdir(parents=True)
    (run / "executor.json").write_text("{}")
    (run / "summary.json").write_text(json.dumps({"config": {"gpu": {"name": "h100-80gb"}}}))
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"components": {
        "linear": {"seconds": [1.0]}, "decode_step": {"seconds": [1.0], "measured": {"utc": "2026-12-06T17:05:38Z"}},
        "attn_decode": {"seconds": [1.0], "measured": {"utc": "2026-12-05T09:00:00Z"}}}}))
    (sim / "profiled" / run.name).mkdir(parents=True)
    (sim / "profiled" / run.name / "summary.json").write_text(
        json.dumps({"cost_model": {"name": "profiled", "profile": str(prof)}}))
    added = fr.added_tables(fr.measured_tables(exec_dir, sim))
    assert added == {"attn_decode": ["2026-12-05"], "decode_step": ["2026-12-06"]}
    note = " ".join(fr.lease_note(False, exec_dir, repeated=True, added=added).split())
    assert "`attn_decode`, `decode_step`" in note and "2026-12-05, 2026-12-06" in note and "`linear`" not in note
    assert "executed on the earlier lease (\"Executed twice\"" in note


def test_the_profiles_step_errors_against_both_executions_by_kind(tmp_path):
    fr = _fidelity_runs()
    frames = {}
    for lease, measured in (("a", [1.0, 2.0, 4.0]), ("b", [1.02, 2.04, 4.0])):
        run = tmp_path / lease / "azure-conv__vllm__llama-2-7b"
        run.mkdir(parents=True)
        pd.DataFrame({"step": range(3), "measured_s": measured, "m_swap_s": 0.0, "m_copy_s": 0.0,
                      "graph": [True, True, False], "padded_batch": [2, 4, 0], "num_decodes": [2, 4, 0],
                      "num_prefills": [0, 0, 1], "num_tokens": [2, 4, 512]}).to_parquet(run / "executor_steps.parquet")
        frames[lease] = {run.name: np.array([1.0, 2.0, 4.2])}
    text = fr.kind_errors(tmp_path / "a", frames["a"], tmp_path / "b", frames["b"])
    rows = {ln.split("|")[2].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in text.splitlines() if ln.startswith("| llama-2-7b")}
    assert rows["decode, CUDA graph"][2:] == ["2", "+0.0%", "2", "-2.0%"]
    assert rows["eager, with a prompt"][2:] == ["1", "+5.0%", "1", "+5.0%"]


def test_results_refuse_repeat_sim_without_its_runs(tmp_path, capsys):
    fr = _fidelity_runs()
    rc = fr.main(["results", "--exec", str(tmp_path), "--sim", str(tmp_path), "--json", str(tmp_path / "o.json"),
                  "--repeat-sim", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--repeat-sim" in err and "--repeat too" in err
    assert not (tmp_path / "o.json").exists()


def test_results_refuse_two_lease_notes_at_once(tmp_path, capsys):
    fr = _fidelity_runs()
    rc = fr.main(["results", "--exec", str(tmp_path), "--sim", str(tmp_path), "--json", str(tmp_path / "o.json"),
                  "--same-lease", "--added-tables-lease"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "give one" in err and not (tmp_path / "o.json").exists()


def test_graph_steps_are_split_by_how_full_their_padded_batch_is(tmp_path):
    """fidelity_runs.py's per-step tables: graph steps of one or two rows, of full padded batches and
    of batches a quarter or more padding, each with its steps' mean error."""
    fr = _fidelity_runs()
    run = tmp_path / "azure-conv__vllm__llama-2-7b"
    run.mkdir()
    rows = [  # (padded batch, rows, measured, predicted)
        (2, 1, 1.0, 0.99), (16, 16, 1.0, 1.002), (16, 12, 1.0, 1.01), (16, 9, 1.0, 1.03), (16, 13, 1.0, 1.5)]
    pd.DataFrame({"step": range(len(rows)), "measured_s": [r[2] for r in rows], "m_swap_s": 0.0, "m_copy_s": 0.0,
                  "graph": True, "padded_batch": [r[0] for r in rows], "num_decodes": [r[1] for r in rows],
                  "num_prefills": 0, "num_tokens": [r[1] for r in rows]}).to_parquet(run / "executor_steps.parquet")
    text = fr.step_kinds(tmp_path, {run.name: np.array([r[3] for r in rows])})
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {run.name} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:] == ["5", "+10.6%", "11.0%", "1", "-1.0%", "1", "+0.2%", "2", "+2.0%"]


def test_figures_whose_executed_run_moved_beyond_the_target_are_not_judged():
    fr = _fidelity_runs()
    row = {"trace": "azure-conv", "preset": "vllm", "model": "llama-2-7b", "tensor_parallel": 1,
           **{k: 0.01 for k in fr.ERRORS}}
    far = dict(row, model="llama-3-8b", ttft_p50_err=0.05)
    moves = {fr.run_name("azure-conv", "vllm", "llama-2-7b"): ("H100", {k: 0.0 for k in fr.ERRORS}),
             fr.run_name("azure-conv", "vllm", "llama-3-8b"): ("H100", {**{k: 0.0 for k in fr.ERRORS},
                                                                       "ttft_p50_err": -0.2})}
    line = fr.judged([row, far], moves)
    assert "ttft_p50_err 1/1" in line, "the run that moved 20% between executions is left out"
    assert "tpot_p50_err 2/2" in line
    assert "ttft_p50_err 0/1" in fr.judged([dict(row, ttft_p50_err=0.05)], moves), "judged and outside its target"


def test_request_errors_take_each_requests_own_error_over_requests_finished_in_both():
    from analysis.fidelity import request_errors
    exe = pd.DataFrame({"request_id": [1, 2, 3, 4, 5], "status": ["finished"] * 4 + ["rejected"],
                        "ttft_s": [1.0, 2.0, 4.0, 0.0, 1.0], "tpot_s": [0.01, 0.02, 0.04, 0.01, 0.01],
                        "e2e_s": [2.0, 4.0, 8.0, 1.0, 1.0]})
    sim = exe.copy()
    sim["ttft_s"] = [1.1, 2.0, 3.6, 0.5, 9.0]     # +10%, 0%, -10%; request 4 (executed 0 s) and 5 (rejected) left out
    sim["status"] = "finished"
    r = request_errors(sim, exe).set_index("metric")
    assert r.loc["ttft", "median"] == pytest.approx(0.0) and r.loc["ttft", "requests"] == 3
    assert r.loc["ttft", "p10"] == pytest.approx(-0.08) and r.loc["ttft", "p90"] == pytest.approx(0.08)
    assert r.loc["tpot", "median"] == 0.0 and r.loc["tpot", "requests"] == 4
    # a one-token request (no TPOT) and a request finished in the simulated run only are left out
    exe.loc[0, "tpot_s"] = float("nan")
    r = request_errors(sim, exe).set_index("metric")
    assert r.loc["tpot", "requests"] == 3 and r.loc["e2e", "requests"] == 4


def test_the_request_table_sets_each_runs_p50_beside_its_median_request():
    fr = _fidelity_runs()
    row = {"trace": "azure-code", "preset": "vllm", "model": "llama-3-8b", "tpot_p50_err": 0.055,
           "tpot_request_median_err": 0.010}
    text = fr.request_table([row])
    assert "| azure-code | vllm | llama-3-8b | +5.5% | +1.0% |" in text
    assert fr.request_table([{k: v for k, v in row.items() if "request" not in k}]) == ""


def test_moves_refuse_a_before_that_is_neither_a_folder_nor_a_revision(tmp_path, capsys):
    fr = _fidelity_runs()
    rc = fr.main(["moves", "--before", "no-such-rev", "--out", str(tmp_path / "m"), "--json", str(tmp_path / "m.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--before no-such-rev" in err[0] and not (tmp_path / "m.json").exists()


def test_moves_between_identical_profiles_are_zero_and_name_each_run(tmp_path):
    """fidelity_runs.py moves: the same profiles before and after move no figure."""
    fr = _fidelity_runs()
    root = Path(__file__).resolve().parents[2]
    before = tmp_path / "before"
    before.mkdir()
    shutil.copy(root / "blocksim" / "profiles" / "llama-2-7b__h200-141gb__float16__tp1.json", before)
    out = tmp_path / "moves.json"
    rc = fr.main(["moves", "--before", str(before), "--models", "llama-2-7b", "--traces", "mooncake",
                  "--presets", "vllm-prefix", "--out", str(tmp_path / "m"), "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rc == 0 and [r["run"] for r in rows] == ["mooncake__vllm-prefix__llama-2-7b"]
    for k in fr.MOVE_KEYS:
        assert rows[0][k]["move"] == 0.0 and rows[0][k]["before"] > 0, k


def test_moves_refuse_a_model_without_a_profile_on_either_side_before_simulating(tmp_path, capsys):
    fr = _fidelity_runs()
    rc = fr.main(["moves", "--before", "HEAD", "--gpu", "no-such-gpu", "--models", "llama-2-7b",
                  "--out", str(tmp_path / "m"), "--json", str(tmp_path / "m.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no-such-gpu" in err[0] and not (tmp_path / "m" / "before").exists()
    assert not (tmp_path / "m.json").exists()


def test_mooncake_prefix_slice_reuses_prefixes_and_an_empty_window_is_refused(tmp_path, monkeypatch):
    """benchmarks/fidelity_runs.py: the mooncake-prefix slice holds the window's 52 requests, and
    the blocks its prompts send again are found in the prefix cache of `BLOCKS` blocks (the point
    of the slice); a window no request arrives in is refused naming the slice."""
    import traces
    fr = _fidelity_runs()
    path = fr.slice_file("mooncake-prefix", 1, tmp_path / "slices")
    t = traces.read_trace(path)
    assert len(t) == 52 and t.df["prompt_tokens"].max() <= fr.CLIP_TOKENS
    out = tmp_path / "run"
    policy, extra, _ = fr.PRESETS["vllm-prefix"]
    assert main(["replay", str(path), "--model", "llama-2-7b", "--gpu", "h100-80gb", "--policy", policy, *extra,
                 "--quiet", "--no-report", "--out", str(out)]) == 0
    m = json.loads((out / "summary.json").read_text())
    assert m["finished"] == 52 and m["prefix_cache_hits"] > 0.1 * m["prefix_cache_queries"] > 0
    monkeypatch.setitem(fr.SLICES, "empty", ("benchmarks/slices/mooncake_synthetic_1005_1020.jsonl", (100.0, 110.0), 1.0))
    with pytest.raises(ValueError, match="slice empty: no request"):
        fr.slice_file("empty", 1, tmp_path / "slices")


def test_every_slice_is_described_and_holds_requests(tmp_path):
    """fidelity_runs.py: each slice's document text names its trace, window and rate, every trace
    file of SLICES has a description, and each one-minute window holds requests; an Azure slice of
    another name still says why it hits no prefix."""
    fr = _fidelity_runs()
    assert set(fr.SOURCES) == {f for f, _, _ in fr.SLICES.values()}
    text = fr.slices_text(["azure-code", "mooncake-60"])
    assert ("azure-code = the bundled Azure code sample, arrivals [200 s, 220 s) at twice its rate" in text
            and "mooncake-60 = the bundled Mooncake sample (prefix hashes), arrivals [360 s, 420 s) at 1.5 "
            "times its rate" in text and "azure-conv" not in text)
    for name in ("azure-conv-60", "azure-code-60", "mooncake-60"):
        assert len(pd.read_parquet(fr.slice_file(name, 1, tmp_path / "slices"))) > 100
    miss = "azure-code-60__vllm-prefix__llama-3-8b"
    assert "the Azure samples carry no prefix hashes" in " ".join(fr.prefix_hits(_executed(tmp_path / "az", [miss])).split())


def test_the_one_minute_azure_windows_keep_a_short_queue_where_the_15_s_rates_grow_one(tmp_path, monkeypatch):
    """SLICES: at the one-minute Azure windows' rates (vllm, llama-3-8b, the shipped H100 profile)
    at most a few requests wait through the first three quarters of the arrivals; the same windows
    at the 15 s slices' rates end their arrivals with a queue of tens of requests."""
    fr = _fidelity_runs()
    for name, fast in (("azure-conv-60", "azure-conv"), ("azure-code-60", "azure-code")):
        monkeypatch.setitem(fr.SLICES, f"{name}-fast", (fr.SLICES[name][0], fr.SLICES[name][1], fr.SLICES[fast][2]))

    def queue(name):
        out, path = tmp_path / name, fr.slice_file(name, 1, tmp_path / "slices")
        policy, extra, _ = fr.PRESETS["vllm"]
        assert main(["replay", str(path), "--model", "llama-3-8b", "--gpu", "h100-80gb", "--policy", policy, *extra,
                     "--quiet", "--no-report", "--out", str(out)]) == 0
        st, last = pd.read_parquet(out / "steps.parquet"), pd.read_parquet(path).arrival_s.max()
        return int(st[st.start_s <= 0.75 * last].waiting.max()), int(st[st.start_s <= last].waiting.iloc[-1])

    for name in ("azure-conv-60", "azure-code-60"):
        assert queue(name)[0] <= 15, name
        assert queue(f"{name}-fast")[1] >= 30, name


def _executed(exec_dir: Path, names: list[str], hits: dict[str, int] | None = None) -> Path:
    """An executed-runs folder holding run directories of these names (their summaries with `hits`)."""
    for name in names:
        run = exec_dir / name
        run.mkdir(parents=True)
        (run / "executor.json").write_text("{}")
        h = (hits or {}).get(name, 0)
        (run / "summary.json").write_text(json.dumps({
            "prefix_cache_queries": 100, "prefix_cache_hits": h, "prefix_saved_tokens": 16 * h}))
    return exec_dir


def test_the_device_command_names_the_slices_presets_and_models_executed(tmp_path):
    """fidelity_runs.py results: the document's device command executes the runs its tables hold,
    naming what differs from the script's defaults, and profiles only where the runs share its lease."""
    fr = _fidelity_runs()
    part = _executed(tmp_path / "part", ["mooncake-prefix__vllm__llama-3-8b", "mooncake-prefix__vllm-prefix__llama-3-8b"])
    h100 = " ".join(fr.device_command(part, True, False).split())
    assert h100 == ('PROFILE_MODELS="" RUN_MODELS="llama-3-8b" TRACES="mooncake-prefix" '
                    'PRESETS="vllm vllm-prefix" \\ bash benchmarks/fidelity_h100.sh')
    h200 = " ".join(fr.device_command(part, False, True).split())
    assert h200.startswith('GPU=h200-141gb PROFILE_MODELS="llama-3-8b" RUN_MODELS="llama-3-8b" ')
    assert h200.endswith("bash benchmarks/fidelity_device.sh")
    full = _executed(tmp_path / "full", [fr.run_name(t, p, m) for t in fr.STANDARD_SLICES for p in fr.PRESETS
                                         for m in fr.MODELS])
    assert fr.device_command(full, False, True) == "GPU=h200-141gb bash benchmarks/fidelity_device.sh"
    h100_default = _executed(tmp_path / "h100", [fr.run_name(t, "vllm", m) for t in ("azure-conv", "azure-code")
                                                 for m in fr.MODELS])
    assert fr.device_command(h100_default, True, True) == "bash benchmarks/fidelity_h100.sh"
    # runs that are not every model x slice x preset of their own: the script's RUNS names them alone
    picked = _executed(tmp_path / "picked", ["azure-code-60__vllm-chunked__llama-2-7b",
                                             "mooncake-60__swap-n2__llama-3-8b"])
    assert " ".join(fr.device_command(picked, True, False).split()) == (
        'PROFILE_MODELS="" RUNS="llama-2-7b:azure-code-60:vllm-chunked llama-3-8b:mooncake-60:swap-n2" '
        '\\ bash benchmarks/fidelity_h100.sh')


def test_twins_priced_by_profiles_outside_the_shipped_folder_name_it_in_the_simulate_command(tmp_path):
    """A document whose twins were simulated with --profile-dir says so in its simulate command;
    twins priced by the shipped profiles (or naming none) need no option."""
    fr = _fidelity_runs()
    sim = tmp_path / "sim"
    twin = sim / "profiled" / "mooncake-prefix__vllm__llama-3-8b"
    twin.mkdir(parents=True)
    lease = tmp_path / "lease-profiles"
    (twin / "summary.json").write_text(json.dumps({"cost_model": {
        "name": "profiled", "profile": str(lease / "llama-3-8b__h100-80gb__float16__tp1.json")}}))
    assert fr.twins_profile_dir(sim) == str(lease.resolve())
    shipped = fr.ROOT / "blocksim" / "profiles" / "llama-3-8b__h100-80gb__float16__tp1.json"
    (twin / "summary.json").write_text(json.dumps({"cost_model": {"name": "profiled", "profile": str(shipped)}}))
    assert fr.twins_profile_dir(sim) is None
    (twin / "summary.json").write_text(json.dumps({"cost_model": {"name": "roofline"}}))
    assert fr.twins_profile_dir(sim) is None


def test_the_prefix_paragraph_says_why_a_run_hit_nothing_and_what_a_hit_executes(tmp_path):
    fr = _fidelity_runs()
    hit, miss = "mooncake-prefix__vllm-prefix__llama-2-7b", "azure-conv__vllm-prefix__llama-2-7b"
    text = " ".join(fr.prefix_hits(_executed(tmp_path / "both", [hit, miss, "azure-conv__vllm__llama-2-7b"],
                                             {hit: 7})).split())
    assert "carry no prefix hashes" in text and "Where blocks hit (mooncake-prefix)" in text
    assert f"| {hit} | 100 | 7 | 112 |" in text and "azure-conv__vllm__" not in text
    only_hit = " ".join(fr.prefix_hits(_executed(tmp_path / "hit", [hit], {hit: 7})).split())
    assert "Where no block hits" not in only_hit
    assert fr.prefix_hits(_executed(tmp_path / "none", ["azure-conv__vllm__llama-2-7b"])) == ""


def test_the_prefix_table_sets_each_runs_eager_error_beside_the_same_slice_without_the_cache(tmp_path):
    """With the twins' prices, each vllm-prefix run's eager prompt steps' mean error stands beside
    those of the same slice and model executed under vllm."""
    fr = _fidelity_runs()
    hit, plain = "mooncake-prefix__vllm-prefix__llama-2-7b", "mooncake-prefix__vllm__llama-2-7b"
    exec_dir = _executed(tmp_path / "exec", [hit, plain], {hit: 7})
    steps = {hit: ([0.10, 0.20, 0.01], [True, True, False]), plain: ([0.10, 0.30], [True, True])}
    priced = {}
    for run, (measured, prompt) in steps.items():
        pd.DataFrame({"measured_s": measured, "m_swap_s": 0.0, "m_copy_s": 0.0, "graph": [not p for p in prompt],
                      "num_prefills": [int(p) for p in prompt], "num_tokens": 512, "padded_batch": 1,
                      "num_decodes": 1}).to_parquet(exec_dir / run / "executor_steps.parquet")
        priced[run] = np.asarray(measured) * (1.02 if run == hit else 1.05)
    text = fr.prefix_hits(exec_dir, priced)
    assert f"| {hit} | 100 | 7 | 112 | 2 | +2.0% | 2 | +5.0% |" in text
    assert "under vllm: mean error" in text
    twins = _executed(tmp_path / "sim" / "profiled", [hit], {hit: 9})  # the twin hit other blocks
    text = fr.prefix_hits(exec_dir, priced, twins)
    assert f"| {hit} | 100 | 7 | 9 | 112 | 2 | +2.0% | 2 | +5.0% |" in text and "profiled twin: blocks hit" in text
    assert f"| {hit} | 100 | 7 | n/a | 112 |" in fr.prefix_hits(exec_dir, priced, tmp_path / "no-twins")


def test_sensitivity_at_a_scale_out_of_range_is_refused_and_its_rows_are_shown(tmp_path, capsys):
    """fidelity_runs.py sensitivity --at F: a scale outside 0.5-1.5 is refused in one line before
    anything runs; the rows it writes are shown, as signed percentages, under the slopes."""
    fr = _fidelity_runs()
    args = ["sensitivity", "--exec", str(tmp_path / "exec"), "--sim", str(tmp_path / "sim"),
            "--out", str(tmp_path / "out"), "--json", str(tmp_path / "s.json")]
    assert fr.main(args + ["--at", "0.97", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--at 3.0" in err
    assert not (tmp_path / "out").exists()
    row = {k: 0.5 for k in fr.LATENCY}
    (tmp_path / "s.json").write_text(json.dumps({"rows": [{"run": "r", "step": 0.01, **row}], "at": [
        {"run": "r", "scale": 0.97, **{k: -0.031 for k in fr.LATENCY}, "prefix_cache_hits": 12}]}))
    table = fr.sensitivity_table(tmp_path / "s.json")
    assert "| r | +0.5 |" in table and "| r | 0.97 | -3.1% |" in table and "sensitivity --at" in table
    assert table.rstrip().endswith("| -3.1% | 12 |")


def test_steps_measured_far_beyond_their_price_are_counted_per_run():
    """The per-step section counts, per run, the steps measured beyond 1.25 times their price and
    the seconds they add; runs recording late segments give those and the steps timed again."""
    import pandas as pd
    fr = _fidelity_runs()
    x = pd.DataFrame({"run": ["a", "a", "a", "b"], "measured_s": [0.030, 0.010, 0.013, 0.010],
                      "predicted_s": [0.010, 0.010, 0.010, 0.010]})
    lines = fr.far_steps(x)
    assert "| a | 3 | 2 | 0.023 | 0.05 | n/a | n/a |" in lines and "| b | 1 | 0 | 0.000 | 0.01 | n/a | n/a |" in lines
    assert fr.far_steps(x.assign(measured_s=0.011)) == []
    rec = x.assign(late_segments=[2, 0, 1, 0], retimed=[True, False, False, False])
    assert "| a | 3 | 2 | 0.023 | 0.05 | 2 | 1 |" in fr.far_steps(rec)


def test_prompt_steps_are_grouped_by_the_prompts_they_hold():
    """fidelity_runs results: eager prompt steps by how many prompts (or chunks) they hold (3 and more
    together) and their token band, with their count, runs, mean error and MAPE."""
    fr = _fidelity_runs()
    e = pd.DataFrame({"num_prefills": [1, 1, 2, 2, 4], "tokens": ["a", "a", "b", "b", "b"],
                      "run": ["r1", "r2", "r1", "r1", "r2"], "err": [0.01, -0.03, 0.02, 0.04, -0.1]})
    e["tokens"] = e["tokens"].astype("category")
    rows = [line for line in fr.prompt_counts(e)[5:]]  # after the title, the header and its rule
    assert rows == ["| 1 | a | 2 | 2 | -1.0% | 2.0% |", "| 2 | b | 2 | 1 | +3.0% | 3.0% |",
                    "| 3 or more | b | 1 | 1 | -10.0% | 10.0% |"]
    assert fr.prompt_counts(e.iloc[:0]) == []


def test_moves_between_a_revision_of_the_simulator_and_itself_are_zero(tmp_path):
    """fidelity_runs.py moves --code: the simulator as of HEAD against the working tree, both priced by
    the working tree's profiles (a slice whose steps the working tree's edits, if any, leave alone)."""
    fr = _fidelity_runs()
    out = tmp_path / "moves.json"
    rc = fr.main(["moves", "--code", "--before", "HEAD", "--models", "llama-2-7b", "--traces", "mooncake",
                  "--presets", "vllm", "--out", str(tmp_path / "m"), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and "code as of HEAD" in doc["before"]
    assert (tmp_path / "m" / "code-before" / "blocksim" / "cli.py").is_file()
    for k in fr.MOVE_KEYS:
        assert doc["rows"][0][k]["move"] == 0.0, k


def test_moves_code_refuses_a_revision_that_is_not_one(tmp_path, capsys):
    fr = _fidelity_runs()
    rc = fr.main(["moves", "--code", "--before", "no-such-rev", "--out", str(tmp_path / "m"),
                  "--json", str(tmp_path / "m.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--before no-such-rev" in err[0] and not (tmp_path / "m.json").exists()


def test_cached_prompts_count_the_chunks_over_cached_keys_from_a_recorded_plan(tmp_path):
    """fidelity_runs.cached_prompts: per step, the prompts (chunks) of a recorded plan that run over
    cached keys: every chunk after a prompt's first under chunked prefill, none without chunks or
    prefix caching; None for a run without a plan or whose plan holds other steps."""
    import pandas as pd

    from blocksim.experiments.runner import replay
    fr = _fidelity_runs()
    trace = fr.slice_file("mooncake", 1, tmp_path / "traces")
    got = {}
    for policy in ("vllm-chunked", "vllm"):
        out = tmp_path / policy
        replay(str(trace), out, policy=policy, overrides={"model": "llama-2-7b", "gpu": "h100-80gb",
                                                           "num_gpu_blocks": 900}, record_plan=True)
        steps = pd.read_parquet(out / "steps.parquet")
        got[policy] = (fr.cached_prompts(out, len(steps)), steps)
        assert fr.cached_prompts(out, len(steps) + 1) is None, "a plan of other steps is not read"
    cached, steps = got["vllm-chunked"]
    assert cached.max() >= 1 and (cached <= steps.num_prefill_seqs.to_numpy()).all()
    assert (cached[steps.num_prefill_seqs.to_numpy() == 0] == 0).all()
    cached, steps = got["vllm"]
    assert (cached == 0).all() and steps.num_prefill_seqs.sum() > 0
    assert fr.cached_prompts(tmp_path / "traces", 1) is None, "no plan there"
    # two samples a request: a prompt counts once, not once a sample
    trace2 = fr.slice_file("mooncake", 2, tmp_path / "traces")
    out = tmp_path / "n2-chunked"
    replay(str(trace2), out, policy="vllm-chunked", overrides={"model": "llama-2-7b", "gpu": "h100-80gb",
                                                               "num_gpu_blocks": 900}, record_plan=True)
    steps = pd.read_parquet(out / "steps.parquet")
    cached = fr.cached_prompts(out, len(steps))
    assert cached.max() >= 1 and (cached <= steps.num_prefill_seqs.to_numpy()).all()


def test_an_executed_runs_expected_seconds_add_the_sleeps_of_its_eager_steps_to_their_price():
    """`expected_exec_s`: the priced time, the start, and per eager step (a prompt or block moves)
    the sleeps before its layers + 2 segments; a pure-decode step a graph replay's one sleep."""
    import pandas as pd
    from validation.sleeps import GRAPH_LEAD_S, LEAD_S
    fr = _fidelity_runs()
    steps = pd.DataFrame({"num_prefill_seqs": [1, 0, 0, 0], "num_decode_seqs": [0, 3, 2, 0],
                          "blocks_swapped_in": [0, 0, 4, 0], "blocks_swapped_out": [0] * 4,
                          "blocks_copied": [0] * 4, "duration_s": [0.1, 0.02, 0.03, 0.0]})
    want = fr.EXEC_START_S + 0.15 + 2 * 34 * LEAD_S * fr.EXEC_EAGER_EXTRA + GRAPH_LEAD_S
    assert fr.expected_exec_s(steps, 32) == pytest.approx(want)


def test_execute_starts_no_run_it_expects_past_the_budget(tmp_path, capsys):
    """`execute --budget-s`: a run whose simulated twin says it would end past the budget is not
    started (no GPU needed to see it), and the line says how long it was expected to take."""
    import argparse
    fr = _fidelity_runs()
    args = argparse.Namespace(
        out=str(tmp_path / "exec"), models=["llama-2-7b"], traces=["mooncake-prefix"], presets=["vllm"],
        gpu="h100-80gb", budget_s=5.0, tensor_parallel=1, executor_prefill=None)
    assert fr.cmd_execute(args) == 0
    out = capsys.readouterr().out
    assert "mooncake-prefix__vllm__llama-2-7b: skipped (" in out and "s expected" in out
    assert not (tmp_path / "exec" / "mooncake-prefix__vllm__llama-2-7b").exists()


def test_execute_starts_the_runs_that_fit_the_budget_with_its_margin_and_those_of_unknown_time(
        tmp_path, capsys, monkeypatch):
    """A run fits when `EXEC_MARGIN` times its expected seconds fit in what is left; a later,
    shorter run still starts after a longer one is skipped; a run whose twin fails to simulate
    starts, and the line says its time is unknown and why."""
    import argparse
    fr = _fidelity_runs()
    expected = {"vllm": (100.0, ""), "vllm-prefix": (30.0, ""), "vllm-chunked": (None, "blocksim: error: x")}
    monkeypatch.setattr(fr, "_expected", lambda path, preset, *rest: expected[preset])
    started, argvs = [], []
    monkeypatch.setattr(fr, "blocksim", lambda argv, log, *rest: argvs.append(argv)
                        or started.append(argv[argv.index("--policy") + 1]) or 0)
    args = argparse.Namespace(
        out=str(tmp_path / "exec"), models=["llama-2-7b"], traces=["mooncake-prefix"],
        presets=["vllm", "vllm-prefix", "vllm-chunked"], gpu="h100-80gb", budget_s=100.0, tensor_parallel=1,
        executor_prefill="wgmma")
    assert fr.cmd_execute(args) == 0
    out = capsys.readouterr().out
    assert started == ["vllm-prefix", "vllm-chunked"], "100 s expected does not fit 100 s with the margin"
    assert all(a[a.index("--executor-prefill") + 1] == "wgmma" and "cuda" in a for a in argvs)
    assert "vllm__llama-2-7b: skipped (100 s expected" in out
    assert "vllm-prefix__llama-2-7b: 30 s expected" in out
    assert "vllm-chunked__llama-2-7b: its time unknown (its simulation failed: blocksim: error: x)" in out


def test_estimate_lists_each_runs_expected_seconds_and_their_sum(capsys):
    import argparse
    fr = _fidelity_runs()
    args = argparse.Namespace(models=["llama-2-7b"], traces=["mooncake-prefix"], presets=["vllm", "swap-n2"],
                              gpu="h100-80gb", tensor_parallel=1)
    assert fr.cmd_estimate(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    secs = [float(line.split()[-2]) for line in lines]
    assert [line.split()[0] for line in lines[:2]] == ["mooncake-prefix__vllm__llama-2-7b",
                                                      "mooncake-prefix__swap-n2__llama-2-7b"]
    assert all(s > fr.EXEC_START_S for s in secs[:2]) and secs[2] == pytest.approx(sum(secs[:2]), abs=1.0)


def test_estimate_adds_each_models_profile_at_the_seconds_its_shipped_profile_took(capsys):
    import argparse
    fr = _fidelity_runs()
    prof = json.loads((fr.ROOT / "blocksim" / "profiles" / "llama-3-8b__h100-80gb__float16__tp1.json").read_text())
    want = sum(prof["measure_s"].values()) + sum(c["measured"]["measure_s"] for c in prof["components"].values()
                                                 if isinstance(c, dict) and "measured" in c)
    args = argparse.Namespace(models=["llama-3-8b"], traces=["mooncake-prefix"], presets=["vllm"], gpu="h100-80gb",
                              tensor_parallel=1, profiles=True)
    assert fr.cmd_estimate(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    from validation.profile import DECODE_CONTEXT, LINEAR_TOKENS
    more = len(set(LINEAR_TOKENS) - set(prof["components"]["linear"]["grid"]["tokens"]))
    want += more * fr.LINEAR_POINT_S  # today's linear grid, beyond the points the profile holds
    ctx = prof["components"]["attn_decode"]["grid"]["context"]
    ctx_more = len([c for c in DECODE_CONTEXT if c not in ctx and c <= max(ctx)])
    # each decode context it lacks at the seconds one of its own took (its decode tables' over their contexts)
    # its graph-step tables measured in one pass, today's in DECODE_PASSES
    from validation.profile import DECODE_PASSES
    assert "passes" not in prof["components"]["decode_step"]
    step_s = prof["measure_s"]["decode_step, decode_step_longest"]
    want += ctx_more * (prof["measure_s"]["attn_decode"] + step_s * DECODE_PASSES) / len(ctx)
    want += step_s * (DECODE_PASSES - 1)
    added = [n for n, c in prof["components"].items() if isinstance(c, dict) and "measured" in c]
    assert sorted(added) == ["decode_step_padded", "decode_step_shared"]
    assert lines[0].startswith(f"profile llama-3-8b (as measured, {', '.join(added)} added later"
                               + (f", {more} linear points more" if more else "")
                               + (f", {ctx_more} decode contexts more" if ctx_more else ")"))
    assert float(lines[0].split()[-2]) == pytest.approx(want, abs=0.5)
    assert float(lines[-1].split()[-2]) == pytest.approx(want + float(lines[1].split()[-2]), abs=1.0)
    args.gpu, args.models = "h200-141gb", ["llama-2-7b"]  # its shipped profile records no measure_s
    assert fr.cmd_estimate(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "profile llama-2-7b: its time unknown" in err


def test_estimate_for_a_gpu_the_simulator_refuses_exits_2_naming_the_run(capsys):
    import argparse
    fr = _fidelity_runs()
    args = argparse.Namespace(models=["llama-2-7b"], traces=["mooncake-prefix"], presets=["vllm"],
                              gpu="no-such-gpu", tensor_parallel=1)
    assert fr.cmd_estimate(args) == 2
    err = capsys.readouterr().err
    assert "mooncake-prefix__vllm__llama-2-7b" in err and "no-such-gpu" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_linear_grid_reports_against_the_coarse_grid_it_is_given(tmp_path, capsys):
    """benchmarks/linear_grid.py: a file measured every 8 tokens, read against its multiples of 64
    (the profile's grid) or its powers of two; a coarse grid the file's counts miss is refused in one
    line."""
    import importlib.util
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("linear_grid", root / "benchmarks" / "linear_grid.py")
    lg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lg)
    tokens = list(range(768, 897, 8))
    assert lg.coarse_points(tokens, "64").tolist() == [n % 64 == 0 for n in tokens]
    wide = list(range(512, 1025, 8))
    assert [n for n, k in zip(wide, lg.coarse_points(wide, "pow2")) if k] == [512, 1024]
    # a step in the time between 768 and 832: the 64-token grid's interpolation misses it
    secs = [0.020 if n < 824 else 0.026 for n in tokens]
    f = tmp_path / "fine.json"
    f.write_text(json.dumps({"model": "m", "device": "d", "tokens": tokens, "seconds": secs}))
    assert lg.report(str(f), "64") == 0
    out = capsys.readouterr().out
    assert "interpolation between [768, 832, 896] tokens" in out
    assert "   800 tokens  measured   20.000 ms  interpolated   23.000 ms  +15.0%" in out
    with pytest.raises(SystemExit) as e:
        lg.report(str(f), "pow2")
    assert e.value.code == 2 and "--coarse pow2: fewer than two" in capsys.readouterr().err


def test_prefill_placement_puts_two_long_blocks_on_one_sm_where_the_boundary_adds_a_row_block(tmp_path, capsys,
                                                                                               monkeypatch):
    """benchmarks/prefill_placement.py: llama-3-8b's last chunk of 128 tokens over 3,968 cached
    beside 384 new leaves each of its long row blocks an SM of its own; 127 over 3,969 beside 385
    (one row block more in the grid) puts two on one SM; a file that is not a wide_steps.py result is
    refused in one line (exit 2)."""
    import importlib.util
    import sys
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("prefill_placement", root / "benchmarks" / "prefill_placement.py")
    pp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pp)
    fits = pp.placement([128, 384], [3968, 0], 32, 8, 128, 132)
    shares = pp.placement([127, 385], [3969, 0], 32, 8, 128, 132)
    assert fits["grid"] == [24, 8, 2] and shares["grid"] == [25, 8, 2]
    assert fits["longest_block_keys"] == shares["longest_block_keys"] == 4096
    assert fits["share"] < 1.2 < 1.9 < shares["share"]
    assert pp.placement([183], [3912], 32, 8, 128, 132)["share"] == 1.0
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    monkeypatch.setattr(sys, "argv", ["prefill_placement.py", "--wide-steps", str(bad)])
    assert pp.main() == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a wide_steps.py result" in err


def test_prefill_placement_prices_the_held_out_cases_and_refuses_a_profile_of_another_model(tmp_path, capsys,
                                                                                             monkeypatch):
    """benchmarks/prefill_placement.py --predicted / --price on the committed placement2 cases: the
    prices written before they were timed and the same profile's model today agree, each case's
    error is its price over its measured attention; a profile of another model: one line, exit 2."""
    import sys
    pp = _benchmark_script("prefill_placement")
    res = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    place = res / "fidelity-h100-placement"
    lease6 = res / "fidelity-h100-lease6" / "profiles" / "llama-3-8b__h100-80gb__float16__tp1.json"
    out = tmp_path / "check.json"
    monkeypatch.setattr(sys, "argv", ["prefill_placement.py", "--wide-steps",
                                      str(place / "wide-steps-placement2-h100-80gb.json"), "--price", str(lease6),
                                      "--predicted", str(place / "placement2-predicted.json"), "--json", str(out)])
    assert pp.main() == 0
    got = json.loads(out.read_text())
    written = json.loads((place / "placement2-predicted.json").read_text())["predicted"]
    priced, before = f"priced by {lease6}", f"placed_s of {place / 'placement2-predicted.json'}"
    assert got["errors"][priced]["cases"] == got["errors"][before]["cases"] == len(written) == 14
    for row in got["cases"]:
        want = written[row["case"]]["placed_s"] / row["attn_in_step_s"] - 1
        assert row["errors"][before] == pytest.approx(want)
        assert row["errors"][priced] == pytest.approx(want, abs=1e-9), "the model prices as it did before the timing"
    other = Path(__file__).resolve().parents[2] / "blocksim" / "profiles" / "llama-2-7b__h100-80gb__float16__tp1.json"
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["prefill_placement.py", "--wide-steps",
                                      str(place / "wide-steps-placement2-h100-80gb.json"), "--price", str(other)])
    assert pp.main() == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "llama-2-7b" in err and "llama-3-8b" in err


def test_a_carried_table_keeps_its_lease_and_the_profile_still_loads(tmp_path, capsys):
    """A table carried from another lease's profile is the source's, names where it was measured
    and where it came from; a profile of another model is refused in one line, exit 2, the
    destination left as it was."""
    from blocksim.cost.profile_file import load_profile
    mod = _benchmark_script("profile_carry_table")
    res = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    src = res / "fidelity-h100-lease6" / "profiles" / "llama-3-8b__h100-80gb__float16__tp1.json"
    dest = tmp_path / "llama-3-8b__h100-80gb__float16__tp1.json"
    dest.write_text((res / "fidelity-h100-lease7" / "profiles" / dest.name).read_text())
    assert "decode_step_shared" not in json.loads(dest.read_text())["components"]
    assert mod.main([str(src), str(dest), "--table", "decode_step_shared"]) == 0
    before, after = json.loads(src.read_text())["components"], json.loads(dest.read_text())
    table = after["components"]["decode_step_shared"]
    assert table["seconds"] == before["decode_step_shared"]["seconds"]
    assert table["measured"]["utc"] == before["decode_step_shared"]["measured"]["utc"]
    assert table["measured"]["carried_from"]["profile"] == src.name
    assert after["created_utc"] != table["measured"]["utc"]
    assert "decode_step_shared" in load_profile(str(dest)).tables_measured
    other = Path(__file__).resolve().parents[2] / "blocksim" / "profiles" / "llama-2-7b__h100-80gb__float16__tp1.json"
    text = dest.read_text()
    capsys.readouterr()
    assert mod.main([str(other), str(dest), "--table", "decode_step_shared"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model" in err[0] and "llama-2-7b" in err[0]
    assert mod.main([str(src), str(dest), "--table", "overhead"]) == 2
    assert dest.read_text() == text


def test_the_commands_name_a_table_carried_from_another_lease(tmp_path):
    """A profile whose table was carried from another lease's profile says so in the commands
    block, with the command that measured it there; a table added on its own lease stays 'then'."""
    import argparse
    fr = _fidelity_runs()
    prof = {"command": "blocksim profile --model llama-3-8b", "components": {
        "decode_step_padded": {"measured": {"command": "blocksim profile --add-table decode_step_padded"}},
        "decode_step_shared": {"measured": {"command": "blocksim profile --add-table decode_step_shared",
                                            "carried_from": {"profile": "lease6.json"}}}}}
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "llama-3-8b__h100-80gb__float16__tp1.json").write_text(json.dumps(prof))
    twin = tmp_path / "sim" / "profiled" / "mooncake-60__vllm__llama-3-8b"
    twin.mkdir(parents=True)
    (twin / "summary.json").write_text(json.dumps({"cost_model": {
        "name": "profiled", "profile": str(pdir / "llama-3-8b__h100-80gb__float16__tp1.json")}}))
    a = argparse.Namespace(exec=str(tmp_path / "exec"), sim=str(tmp_path / "sim"), same_lease=True,
                           added_tables_lease=False, repeat=None, repeat_sim=None, sensitivity=None,
                           json="out.json", markdown="out.md")
    text = fr.commands_block(a, ["NVIDIA H100 80GB HBM3"])
    assert "#   then, its decode_step_padded by: blocksim profile --add-table decode_step_padded" in text
    assert ("#   its decode_step_shared carried from another lease's lease6.json (benchmarks/profile_carry_table.py), "
            "measured there by: blocksim profile --add-table decode_step_shared") in text


def _execute_two_runs_of_40_s_taking_60_s(tmp_path, monkeypatch, rc: int) -> None:
    """`execute --budget-s 130` of two runs expected at 40 s each, each taking 60 s on a clock of
    its own and returning `rc`."""
    import argparse
    fr = _fidelity_runs()
    monkeypatch.setattr(fr, "_expected", lambda path, preset, *rest: (40.0, ""))
    clock = [0.0]
    monkeypatch.setattr(fr.time, "perf_counter", lambda: clock[0])

    def run(argv, log, *rest):
        clock[0] += 60.0
        return rc
    monkeypatch.setattr(fr, "blocksim", run)
    args = argparse.Namespace(
        out=str(tmp_path / "exec"), models=["llama-2-7b"], traces=["mooncake-prefix"],
        presets=["vllm", "vllm-prefix"], gpu="h100-80gb", budget_s=130.0, tensor_parallel=1,
        executor_prefill=None)
    assert fr.cmd_execute(args) == 0


def test_execute_expects_later_runs_at_the_pace_of_those_it_has_finished(tmp_path, capsys, monkeypatch):
    """A run that took 1.5 times its expected seconds makes the next run's expectation 1.5 times
    its own (`machine_pace`), so a run that would fit at the constants' pace is skipped; a run
    faster than expected never shortens the next one's expectation."""
    fr = _fidelity_runs()
    assert fr.machine_pace([]) == 1.0
    assert fr.machine_pace([(10.0, 8.0)]) == 1.0
    assert fr.machine_pace([(10.0, 8.0), (20.0, 30.0), (10.0, 12.0)]) == pytest.approx(1.5)
    _execute_two_runs_of_40_s_taking_60_s(tmp_path, monkeypatch, rc=0)
    out = capsys.readouterr().out
    assert "vllm__llama-2-7b: 40 s expected\n" in out
    # 70 s left: 1.2 x 40 = 48 would fit, 1.2 x 1.5 x 40 = 72 does not
    assert "vllm-prefix__llama-2-7b: skipped (40 s expected, 1.50 times that at this machine's pace so far" in out


def test_a_failed_run_sets_no_pace(tmp_path, capsys, monkeypatch):
    """A run that fails (rc != 0) after 1.5 times its expected seconds leaves the next run's
    expectation as it was: its time says nothing of the machine's pace."""
    _execute_two_runs_of_40_s_taking_60_s(tmp_path, monkeypatch, rc=1)
    out = capsys.readouterr().out
    assert "vllm-prefix__llama-2-7b: 40 s expected\n" in out  # 1.2 x 40 fits the 70 s left
