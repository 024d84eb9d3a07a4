"""blocksim/experiments/compare.py (the (policy x rate) preset of the sweep driver) and its command,
with fake simulators writing the tiny hand-computed run (the real one is
``blocksim.experiments.runner.replay``)."""

import argparse
from pathlib import Path

import pandas as pd
import pytest
from rundir_fixtures import tiny_summary, write_run

import blocksim.experiments.compare
import traces
from analysis.report import SECTION_IDS
from analysis.slo import parse_slo
from blocksim.experiments.compare import add_compare_command, compare, run_dir_name, slo_text

TRACE_ROWS = 60


def fake_replay(trace, out_dir, *, policy="vllm", rate_scale=1.0, overrides=None,
                progress=False, write_report=False):
    """Writes the tiny run; fails for policy 'broken' at rate 2 and for policy 'hollow'."""
    if policy == "broken" and rate_scale == 2.0:
        raise RuntimeError("out of KV blocks at step 7")
    if policy == "hollow":
        return {"policy": policy}  # claims success, writes nothing
    out = Path(out_dir)
    summary = {**tiny_summary(policy), "requests_per_s": 0.375 * rate_scale, "trace": trace.name,
               "model_override": (overrides or {}).get("model", ""), "trace_requests": len(trace)}
    write_run(out, summary=summary)
    assert not progress and not write_report
    return summary


def counting_replay(trace, out_dir, **kwargs):
    """`fake_replay` that also leaves a mark per call beside the run directories."""
    (Path(out_dir).parent.parent / f"call-{kwargs['policy']}-{kwargs['rate_scale']:g}").touch()
    return fake_replay(trace, out_dir, **kwargs)


@pytest.fixture
def trace_file(tmp_path) -> str:
    path = tmp_path / "t.csv"
    rows = "".join(f"{i * 0.5},{10 + i},{5 + i}\n" for i in range(TRACE_ROWS))
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return str(path)


def test_one_row_per_run_with_memory_fractions(tmp_path, trace_file):
    out = tmp_path / "cmp"
    df = compare(trace_file, ["vllm", "orca-max"], [0.5, 1, 2], out, workers=2, runner=fake_replay)
    assert list(zip(df["policy"], df["rate_scale"])) == [
        ("vllm", 0.5), ("vllm", 1.0), ("vllm", 2.0), ("orca-max", 0.5), ("orca-max", 1.0), ("orca-max", 2.0)]
    assert (df["status"] == "ok").all() and (df["error"] == "").all()
    assert df["token_states_frac"].tolist() == [0.2375] * 6
    assert df["free_frac"].tolist() == [0.55] * 6
    assert df["requests_per_s"].tolist() == [0.1875, 0.375, 0.75] * 2, "the runner's summary metrics"
    assert df["capacity_tokens"].tolist() == [100] * 6
    assert (out / "vllm_x0.5" / "steps.parquet").is_file()
    on_disk = pd.read_parquet(out / "summary.parquet")
    assert on_disk["policy"].tolist() == df["policy"].tolist()
    assert {"token_states_frac", "reservation_frac", "internal_frag_frac", "external_frag_frac",
            "free_frac", "offered_rate_req_s", "rate_scale", "status", "error"} <= set(on_disk.columns)
    html = (out / "report.html").read_text()
    assert all(f'<section id="{s}">' in html for s in SECTION_IDS)


def test_a_failed_run_is_reported_and_the_others_complete(tmp_path, trace_file):
    out = tmp_path / "cmp"
    df = compare(trace_file, ["vllm", "broken"], [1, 2], out, workers=2, runner=fake_replay,
                 slo={"ttft": 2.0})
    status = dict(zip(zip(df["policy"], df["rate_scale"]), df["status"]))
    assert status == {("vllm", 1.0): "ok", ("vllm", 2.0): "ok", ("broken", 1.0): "ok", ("broken", 2.0): "failed"}
    failed = df[df["status"] == "failed"].iloc[0]
    assert failed["error"] == "RuntimeError: out of KV blocks at step 7"
    assert pd.isna(failed["token_states_frac"])
    assert "out of KV blocks" in (out / "broken_x2" / "error.txt").read_text(), "traceback kept"
    assert df.loc[df["status"] == "ok", "goodput_requests"].tolist() == [2, 2, 2]
    md = (out / "report.md").read_text()
    assert "3 of 4 runs ok." in md and "Failed runs: broken x2 " in md


def test_a_run_without_its_files_is_failed(tmp_path, trace_file):
    df = compare(trace_file, ["hollow", "vllm"], [1], tmp_path / "cmp", workers=1, runner=fake_replay)
    assert df["status"].tolist() == ["failed", "ok"]
    assert "missing requests.parquet" in df["error"].iloc[0]


def test_one_policy_in_process(tmp_path, trace_file):
    out = tmp_path / "cmp"
    df = compare(trace_file, ["vllm"], [1.0], out, workers=1, runner=fake_replay, model="llama-2-13b")
    assert df["status"].tolist() == ["ok"] and df["model_override"].tolist() == ["llama-2-13b"]
    assert (out / "report.html").is_file() and (out / "compare.json").is_file()


def test_all_runs_failing_still_writes_a_report(tmp_path, trace_file):
    out = tmp_path / "cmp"
    df = compare(trace_file, ["hollow"], [1.0], out, workers=1, runner=fake_replay)
    assert df["status"].tolist() == ["failed"]
    html = (out / "report.html").read_text()
    assert all(f'<section id="{s}">' in html for s in SECTION_IDS)


@pytest.mark.parametrize("policies, rates, message", [([], [1], "at least one policy"),
                                                      (["vllm"], [0], "positive"),
                                                      (["vllm"], [], "positive")])
def test_bad_arguments(tmp_path, trace_file, policies, rates, message):
    with pytest.raises(ValueError, match=message):
        compare(trace_file, policies, rates, tmp_path, runner=fake_replay)


def test_run_dir_names():
    assert run_dir_name("vllm", 0.5) == "vllm_x0.5"
    assert run_dir_name("orca-pow2", 4.0) == "orca-pow2_x4"
    assert run_dir_name("my.pkg:Policy", 1.0) == "my.pkg-Policy_x1"


def test_a_missing_trace_fails_before_any_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace .*nope.csv not found"):
        compare(tmp_path / "nope.csv", ["vllm"], [1.0], tmp_path / "cmp")
    assert not (tmp_path / "cmp").exists()


def test_max_requests_cuts_the_trace_each_run_receives(tmp_path, trace_file):
    df = compare(trace_file, ["vllm"], [1.0, 2.0], tmp_path / "cmp", workers=1, runner=fake_replay,
                 max_requests=25)
    assert df["trace_requests"].tolist() == [25, 25], "the first 25 of the trace's 60 requests"
    assert df["trace"].tolist() == ["t", "t"]


def test_a_rerun_reuses_complete_runs_and_retries_failed_ones(tmp_path, trace_file):
    out = tmp_path / "cmp"
    first = compare(trace_file, ["vllm", "broken"], [1, 2], out, workers=1, runner=counting_replay, report=False)
    assert first["attempts"].tolist() == [1, 1, 1, 1]
    for mark in out.glob("call-*"):
        mark.unlink()
    second = compare(trace_file, ["vllm", "broken"], [1, 2], out, workers=1, runner=counting_replay, report=False)
    assert second["attempts"].tolist() == [0, 0, 0, 1], "only the failed run runs again"
    assert sorted(m.name for m in out.glob("call-*")) == ["call-broken-2"]
    assert second["status"].tolist() == first["status"].tolist()
    assert second["requests_per_s"][:3].tolist() == first["requests_per_s"][:3].tolist() == [0.375, 0.75, 0.375]
    assert not (out / ".partial").exists()


@pytest.mark.parametrize("slo", [{"ttft": 2.0}, {"ttft": 0.1, "tpot": 1e-05, "e2e": 30.000001}])
def test_the_slo_reaches_the_runs_unchanged(slo):
    assert parse_slo(slo_text(slo)) == slo


def test_the_real_simulator_on_a_bundled_trace(tmp_path):
    out = tmp_path / "cmp"
    df = compare(traces.bundled("azure-conv"), ["vllm", "orca-max"], [1.0, 2.0], out, workers=1,
                 max_requests=20, slo={"ttft": 2.0})
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert df["run_dir"].tolist() == ["vllm_x1", "vllm_x2", "orca-max_x1", "orca-max_x2"]
    assert (df["requests"] == 20).all()
    rate = dict(zip(zip(df["policy"], df["rate_scale"]), df["offered_rate_req_s"]))
    assert rate[("vllm", 2.0)] == pytest.approx(2 * rate[("vllm", 1.0)]), "rate scale applied"
    assert {"goodput_requests_per_s", "slo_attainment", "token_states_frac"} <= set(df.columns)
    assert (out / "report.html").is_file() and (out / "compare.json").is_file()


# ---------------------------------------------------------------- blocksim compare

def _parse(argv):
    parser = argparse.ArgumentParser(prog="blocksim")
    add_compare_command(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_compare_arguments():
    args = _parse(["compare", "t.csv", "--policy", "vllm", "--policy", "orca-max", "--rate-scale",
                   "0.5,1,2,4", "--slo", "ttft=2s,tpot=100ms", "--out", "o", "--max-requests", "50",
                   "--model", "m", "--set", "block_size=32", "--set", "watermark=0.01", "--backend", "ray"])
    assert args.policy == ["vllm", "orca-max"] and args.rate_scale == [0.5, 1.0, 2.0, 4.0]
    assert args.slo == parse_slo("ttft=2s,tpot=100ms")
    assert args.set == [("block_size", 32), ("watermark", 0.01)]
    assert args.backend == "ray"


@pytest.mark.parametrize("argv", [
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--rate-scale", "1,x"],
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--rate-scale", "-1"],
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--slo", "ttft=2"],
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--set", "novalue"],
    ["compare", "t.csv", "--policy", "vllm", "--out", "o", "--backend", "dask"],
])
def test_compare_bad_arguments_exit(argv):
    with pytest.raises(SystemExit):
        _parse(argv)


def test_compare_command_passes_overrides(tmp_path, trace_file, monkeypatch, capsys):
    seen = []

    def runner(trace, out_dir, *, policy, rate_scale, overrides, progress, write_report):
        seen.append((len(trace), overrides))
        if policy == "orca-max":
            raise RuntimeError("this run broke")
        write_run(Path(out_dir))
        return {}

    monkeypatch.setattr(blocksim.experiments.compare, "replay_runner", runner)
    out = tmp_path / "cmp"
    args = _parse(["compare", trace_file, "--policy", "vllm", "--policy", "orca-max", "--out", str(out),
                   "--workers", "1", "--max-requests", "50", "--gpu", "a100-80gb", "--set", "block_size=32",
                   "--no-progress"])
    assert args.func(args) == 1, "exit status 1 when a run failed"
    assert seen == [(50, {"block_size": 32, "gpu": "a100-80gb"})] * 2, "the first 50 requests, the overrides"
    captured = capsys.readouterr()
    assert "this run broke" in captured.out and "1 of 2 runs failed" in captured.err
    assert (out / "summary.parquet").is_file() and (out / "report.html").is_file()


def test_compare_refuses_an_unknown_policy_before_running(tmp_path, trace_file, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(blocksim.experiments.compare, "replay_runner", lambda *a, **k: ran.append(a))
    args = _parse(["compare", trace_file, "--policy", "vllm", "--policy", "vllm-turbo",
                   "--out", str(tmp_path / "o"), "--workers", "1", "--no-progress"])
    assert args.func(args) == 2 and not ran
    assert "unknown policy 'vllm-turbo'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compare_command_with_a_missing_trace(tmp_path, capsys):
    args = _parse(["compare", str(tmp_path / "nope.csv"), "--policy", "vllm", "--out", str(tmp_path / "o")])
    assert args.func(args) == 2
    assert "nope.csv not found" in capsys.readouterr().err


def test_a_run_option_the_point_does_not_apply_reaches_the_runner(tmp_path, trace_file):
    seen = []

    def runner(trace, out_dir, *, policy, rate_scale, overrides, progress, write_report):
        seen.append(overrides)
        write_run(Path(out_dir))
        return {}

    compare(trace_file, ["vllm"], [1.0], tmp_path / "cmp", workers=1, runner=runner, report=False,
            clip_to_model=True, max_requests=10)
    assert seen == [{"clip_to_model": True}], "clip_to_model goes to replay; max_requests cuts the trace"


def test_compare_warns_up_front_and_counts_rejections_in_its_table_and_report(tmp_path, capsys):
    from blocksim.cli import main

    out = tmp_path / "cmp"
    code = main(["compare", str(traces.bundled("azure-conv")), "--policy", "vllm", "--policy", "orca-max",
                 "--max-requests", "300", "--workers", "1", "--out", str(out), "--no-progress"])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.err.count("will be rejected") == 1, "one warning for both policies (same model)"
    assert "--set clip_to_model=true clips them" in captured.err
    header, units, *rows = captured.out.splitlines()[:4]
    assert header.split()[-1] == "rejected" and all(r.split()[-1] == "12" for r in rows)
    assert "rejected requests: up to 12 of 300 per run" in captured.out
    md = (out / "report.md").read_text()
    assert "Runs rejected requests too long for the model, up to 12 of 300" in md
    clipped = main(["compare", str(traces.bundled("azure-conv")), "--policy", "vllm", "--max-requests", "300",
                    "--workers", "1", "--set", "clip_to_model=true", "--out", str(tmp_path / "clip"),
                    "--no-progress"])
    assert clipped == 0 and "will be rejected" not in capsys.readouterr().err


def test_a_comparison_table_from_before_the_headline_columns_still_reports(tmp_path, trace_file):
    out = tmp_path / "cmp"
    compare(trace_file, ["vllm", "orca-max"], [1.0], out, workers=1, runner=fake_replay, report=False)
    old = pd.read_parquet(out / "summary.parquet").drop(columns=["token_states_of_used_frac", "running_mean",
                                                                 "waiting_mean"])
    old.to_parquet(out / "summary.parquet")
    from analysis.report import write_report

    _, md = write_report(out)
    assert "| vllm | x1 | 0.38 |" in md.read_text() and "| - |" in md.read_text(), "missing columns read '-'"
