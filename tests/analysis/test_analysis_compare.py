"""blocksim/experiments/compare.py with fake simulators (the real one is ``blocksim.experiments.runner.replay``)."""

from pathlib import Path

import pandas as pd
import pytest
from rundir_fixtures import tiny_summary, write_run

from blocksim.experiments.compare import compare, run_dir_name
from analysis.report import SECTION_IDS

CALLS_LOG = "calls.txt"


def fake_replay(trace_path, out_dir, *, policy="vllm", rate_scale=1.0, overrides=None,
                progress=False, write_report=False):
    """Writes the tiny run; fails for policy 'broken' at rate 2 and for policy 'hollow'."""
    if policy == "broken" and rate_scale == 2.0:
        raise RuntimeError("out of KV blocks at step 7")
    if policy == "hollow":
        return {"policy": policy}  # claims success, writes nothing
    out = Path(out_dir)
    summary = {**tiny_summary(policy), "requests_per_s": 0.375 * rate_scale, "trace": trace_path,
               "model_override": (overrides or {}).get("model", "")}
    write_run(out, summary=summary)
    assert not progress and not write_report
    return summary


def test_one_row_per_run_with_memory_fractions(tmp_path):
    out = tmp_path / "cmp"
    df = compare("t.csv", ["vllm", "orca-max"], [0.5, 1, 2], out, workers=2, runner=fake_replay)
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


def test_a_failed_run_is_reported_and_the_others_complete(tmp_path):
    out = tmp_path / "cmp"
    df = compare("t.csv", ["vllm", "broken"], [1, 2], out, workers=2, runner=fake_replay,
                 slo={"ttft": 2.0})
    status = dict(zip(zip(df["policy"], df["rate_scale"]), df["status"]))
    assert status == {("vllm", 1.0): "ok", ("vllm", 2.0): "ok", ("broken", 1.0): "ok", ("broken", 2.0): "failed"}
    failed = df[df["status"] == "failed"].iloc[0]
    assert failed["error"] == "RuntimeError: out of KV blocks at step 7"
    assert pd.isna(failed["token_states_frac"])
    assert "out of KV blocks" in (out / "broken_x2" / "error.txt").read_text(), "traceback kept"
    assert df.loc[df["status"] == "ok", "goodput_requests"].tolist() == [2, 2, 2]
    md = (out / "report.md").read_text()
    assert "3 of 4 runs ok." in md and "Failed runs: broken x2." in md


def test_a_run_without_its_files_is_failed(tmp_path):
    df = compare("t.csv", ["hollow", "vllm"], [1], tmp_path / "cmp", workers=1, runner=fake_replay)
    assert df["status"].tolist() == ["failed", "ok"]
    assert "missing requests.parquet" in df["error"].iloc[0]


def test_one_policy_in_process(tmp_path):
    out = tmp_path / "cmp"
    df = compare("t.csv", ["vllm"], [1.0], out, workers=1, runner=fake_replay, model="llama-2-13b")
    assert df["status"].tolist() == ["ok"] and df["model_override"].tolist() == ["llama-2-13b"]
    assert (out / "report.html").is_file() and (out / "compare.json").is_file()


def test_all_runs_failing_still_writes_a_report(tmp_path):
    out = tmp_path / "cmp"
    df = compare("t.csv", ["hollow"], [1.0], out, workers=1, runner=fake_replay)
    assert df["status"].tolist() == ["failed"]
    html = (out / "report.html").read_text()
    assert all(f'<section id="{s}">' in html for s in SECTION_IDS)


@pytest.mark.parametrize("policies, rates, message", [([], [1], "at least one policy"),
                                                      (["vllm"], [0], "positive"),
                                                      (["vllm"], [], "positive")])
def test_bad_arguments(tmp_path, policies, rates, message):
    with pytest.raises(ValueError, match=message):
        compare("t.csv", policies, rates, tmp_path, runner=fake_replay)


def test_run_dir_names():
    assert run_dir_name("vllm", 0.5) == "vllm_x0.5"
    assert run_dir_name("orca-pow2", 4.0) == "orca-pow2_x4"
    assert run_dir_name("my.pkg:Policy", 1.0) == "my.pkg-Policy_x1"


def test_a_missing_trace_fails_before_any_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace .*nope.csv not found"):
        compare(tmp_path / "nope.csv", ["vllm"], [1.0], tmp_path / "cmp")
    assert not (tmp_path / "cmp").exists()
