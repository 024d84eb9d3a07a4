"""Run directories appear whole or not at all; Ctrl-C leaves earlier output as it was."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blocksim.config import ConfigError
from blocksim.experiments.rundir import resumable, staged

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "data" / "azure_conv_2023_sample.csv"


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def test_staged_renames_into_place_when_complete(tmp_path):
    out = tmp_path / "run"
    with staged(out) as tmp:
        assert tmp.name == "run" and tmp != out, "built aside, under its final name"
        (tmp / "summary.json").write_text("{}")
        assert not out.exists(), "nothing at --out before the run completes"
    assert (out / "summary.json").exists()
    assert siblings(out) == [], "no temporary directory left beside it"


def test_staged_removes_the_partial_run_and_keeps_the_earlier_one_on_error(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.html").write_text("earlier")
    with pytest.raises(KeyboardInterrupt):
        with staged(out, overwrite=True) as tmp:
            (tmp / "summary.json").write_text("{}")
            raise KeyboardInterrupt
    assert [p.name for p in out.iterdir()] == ["report.html"], "the earlier run is untouched"
    assert siblings(out) == []


def test_a_non_empty_out_is_refused_without_overwrite_and_replaced_whole_with_it(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.html").write_text("from a 2,000-request run")
    with pytest.raises(ConfigError, match="--overwrite"):
        with staged(out):
            pass
    with staged(out, overwrite=True) as tmp:
        (tmp / "summary.json").write_text("{}")
    assert [p.name for p in out.iterdir()] == ["summary.json"], "no stale report beside the new summary"
    assert siblings(out) == []


def test_an_empty_out_is_accepted_and_a_file_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with staged(tmp_path / "empty") as tmp:
        (tmp / "x").write_text("")
    assert (tmp_path / "empty" / "x").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        with staged(tmp_path / "file"):
            pass


def test_resumable_reuses_its_own_output_refuses_others_and_restores_on_interrupt(tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.json").write_text("{}")
    with resumable(out, marker="compare.json"):
        pass
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an earlier output"):
        with resumable(other, marker="compare.json"):
            pass
    with pytest.raises(KeyboardInterrupt):
        with resumable(other, marker="compare.json", overwrite=True):
            other.mkdir()
            (other / "half.parquet").write_text("")
            raise KeyboardInterrupt
    assert [p.name for p in other.iterdir()] == ["notes.txt"], "--overwrite interrupted: the old output is back"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "other"]


def test_replay_without_overwrite_refuses_before_simulating(tmp_path, capsys):
    from blocksim.cli import main

    out = tmp_path / "run"
    out.mkdir()
    (out / "report.html").write_text("earlier")
    code = main(["replay", str(TRACE), "--out", str(out), "--max-requests", "5", "--no-report", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--overwrite" in err[0], err
    code = main(["replay", str(TRACE), "--out", str(out), "--max-requests", "5", "--no-report", "--quiet",
                 "--overwrite", "--clip-to-model"])
    assert code == 0 and not (out / "report.html").exists() and (out / "summary.json").exists()


def test_ctrl_c_during_a_plan_recording_rerun_exits_130_in_one_line_and_keeps_the_earlier_run(tmp_path):
    """The slow path on purpose: --record-plan steps one by one and writes plan shards as it goes."""
    out = tmp_path / "run"
    (out / "plan").mkdir(parents=True)
    (out / "plan" / "meta.json").write_text('{"earlier": true}')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "blocksim", "replay", str(TRACE), "--out", str(out), "--overwrite",
                             "--record-plan", "--no-report", "--clip-to-model"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".run.partial-") for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the replay should still be running"
        time.sleep(0.05)
    time.sleep(0.5)  # into the simulation, plan shards being recorded
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert proc.returncode == 130, err
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["run"], "no partial directory is left"
    assert (out / "plan" / "meta.json").read_text() == '{"earlier": true}', "the earlier plan is intact"
    assert sorted(p.name for p in (out / "plan").iterdir()) == ["meta.json"]


def test_ctrl_c_during_a_compare_with_overwrite_puts_the_earlier_output_back(tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.json").write_text('{"earlier": true}')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "blocksim", "compare", str(TRACE), "--policy", "vllm",
                             "--policy", "orca-max", "--policy", "vllm-prefix", "--rate-scale", "0.5,1,2",
                             "--out", str(out), "--overwrite", "--workers", "2", "--set", "clip_to_model=true"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / ".partial").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the comparison should still be running"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert [p.name for p in out.iterdir()] == ["compare.json"], "the earlier comparison is back, alone"
    assert (out / "compare.json").read_text() == '{"earlier": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["cmp"], "nothing left beside it"
