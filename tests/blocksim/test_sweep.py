"""blocksim/sweep*.py: grids of real replays on the bundled traces (30 requests each, so fast)."""

import argparse
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from blocksim.experiments.sweep import add_sweep_command, run_sweep
from blocksim.experiments.points import ERROR_FILE, replay_runner
from blocksim.experiments.search import Search
from blocksim.experiments.spec import Point, SpecError, load_spec, parse_spec

SLO = "ttft=2s,tpot=100ms"


def spec(**changes):
    data = {"trace": "bundled:azure-conv", "base": {"max_requests": 30},
            "axes": {"block_size": [16, 32], "rate_scale": [1, 2]}}
    data.update(changes)
    return parse_spec(data)


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- runners that misbehave on purpose

def raising_runner(trace, out_dir, **kw):
    """Raises for block size 32; the real simulator otherwise."""
    if (kw.get("overrides") or {}).get("block_size") == 32:
        raise RuntimeError("no KV blocks left at step 7")
    return replay_runner(trace, out_dir, **kw)


def crashing_runner(trace, out_dir, **kw):
    """Kills its worker process for block size 32 at rate 2, every time."""
    if (kw.get("overrides") or {}).get("block_size") == 32 and kw["rate_scale"] == 2:
        os._exit(3)
    return replay_runner(trace, out_dir, **kw)


def flaky_runner(trace, out_dir, **kw):
    """Kills its worker the first time it runs block size 32 at rate 2, then works."""
    if (kw.get("overrides") or {}).get("block_size") == 32 and kw["rate_scale"] == 2:
        marker = Path(os.environ["SWEEP_TEST_MARKER"])
        if not marker.exists():
            marker.write_text("died once")
            os._exit(3)
    return replay_runner(trace, out_dir, **kw)


# ---------------------------------------------------------------- local sweeps

def test_local_sweep_writes_one_run_per_point_a_table_and_a_report(tmp_path):
    s = spec(trace=["bundled:azure-conv", "bundled:azure-code"])
    df = run_sweep(s, tmp_path, workers=2, slo=SLO)
    assert len(df) == 8, "2 traces x 2 block sizes x 2 rate scales"
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert list(zip(df["trace"], df["block_size"], df["rate_scale"]))[:4] == [
        ("azure-conv", 16, 1.0), ("azure-conv", 16, 2.0), ("azure-conv", 32, 1.0), ("azure-conv", 32, 2.0)], \
        "rows in grid order, the first axis slowest"
    assert (df["requests"] == 30).all() and (df["max_requests"] == 30).all()
    assert (df["attempts"] == 1).all()
    assert {"slo_attainment", "goodput_requests_per_s", "token_states_frac", "offered_rate_req_s"} <= set(df.columns)
    for run_dir in df["run_dir"]:
        assert (tmp_path / run_dir / "summary.json").is_file(), run_dir
        assert not (tmp_path / run_dir / "report.html").exists(), "no per-run report"
    assert df.loc[df["rate_scale"] == 2, "offered_rate_req_s"].round(6).tolist() == \
        (df.loc[df["rate_scale"] == 1, "offered_rate_req_s"] * 2).round(6).tolist(), "rate scale applied"
    on_disk = pd.read_parquet(tmp_path / "sweep.parquet")
    assert on_disk["run_dir"].tolist() == df["run_dir"].tolist()
    html = (tmp_path / "sweep_report.html").read_text()
    assert 'src="data:image/png;base64,' in html, "heatmaps embedded"
    assert all(f'<section id="{s}">' in html for s in ("setup", "heatmaps", "best", "runs"))
    assert (tmp_path / "sweep_report.md").is_file() and not (tmp_path / ".partial").exists()


def test_run_directory_names_are_readable_stable_and_unique():
    points = spec(axes={"block_size": [16, 32], "watermark": [0.0, 0.01]}, seeds=[0, 1]).points()
    names = [p.name() for p in points]
    assert len(set(names)) == len(names) == 8
    assert names[0].startswith("azure-conv_bs16_wm0_s0_"), names[0]
    assert names == [p.name() for p in spec(axes={"block_size": [16, 32], "watermark": [0.0, 0.01]},
                                            seeds=[0, 1]).points()], "same spec, same names"
    other_base = spec(base={"max_requests": 31}, axes={"block_size": [16, 32], "watermark": [0.0, 0.01]},
                      seeds=[0, 1]).points()[0].name()
    assert other_base != names[0], "the hash covers the base options too"


def test_seeds_repeat_each_point_with_its_own_poisson_arrivals(tmp_path):
    df = run_sweep(spec(axes={"block_size": [16]}, seeds=[0, 1]), tmp_path, workers=1, report=False)
    assert df["seed"].tolist() == [0, 1]
    assert df["offered_rate_req_s"].nunique() == 2, "different seeds, different arrival times"


def test_rerun_skips_complete_points_and_reruns_a_killed_one(tmp_path):
    s = spec()
    first = run_sweep(s, tmp_path, workers=1, report=False)
    killed = tmp_path / first["run_dir"][1]
    (killed / "summary.json").write_text('{"version": 1, "conf')  # killed while writing
    (tmp_path / ".partial" / "x.123").mkdir(parents=True)  # a dead worker's scratch directory
    second = run_sweep(s, tmp_path, workers=1, report=False)
    assert second["attempts"].tolist() == [0, 1, 0, 0], "only the incomplete point runs again"
    assert (second["status"] == "ok").all()
    assert json.loads((killed / "summary.json").read_text())["requests"] == 30
    assert second["requests_per_s"].tolist() == first["requests_per_s"].tolist()
    assert not (tmp_path / ".partial").exists()


def test_rerun_with_a_new_slo_recomputes_goodput_without_simulating(tmp_path):
    s = spec(axes={"block_size": [16]})
    run_sweep(s, tmp_path, workers=1, report=False)
    df = run_sweep(s, tmp_path, workers=1, report=False, slo="ttft=1ms")
    assert df["attempts"].tolist() == [0] and df["slo_attainment"].tolist() == [0.0]


def test_a_point_that_raises_is_reported_and_the_others_complete(tmp_path):
    df = run_sweep(spec(), tmp_path, workers=2, runner=raising_runner)
    failed = df[df["status"] == "failed"]
    assert failed["block_size"].tolist() == [32, 32]
    assert (failed["error"] == "RuntimeError: no KV blocks left at step 7").all()
    assert (failed["attempts"] == 1).all(), "an exception is the point's own answer: not retried"
    assert "Traceback" in (tmp_path / failed["run_dir"].iloc[0] / ERROR_FILE).read_text()
    assert (df.loc[df["block_size"] == 16, "status"] == "ok").all()
    assert '<section id="failed">' in (tmp_path / "sweep_report.html").read_text()
    again = run_sweep(spec(), tmp_path, workers=2, report=False)
    assert (again["status"] == "ok").all() and again["attempts"].tolist() == [0, 0, 1, 1], \
        "a rerun keeps the good points and retries the failed ones"


def test_a_worker_that_dies_is_retried_once_then_reported(tmp_path):
    df = run_sweep(spec(), tmp_path, workers=2, runner=crashing_runner, report=False)
    status = dict(zip(zip(df["block_size"], df["rate_scale"]), df["status"]))
    assert status == {(16, 1.0): "ok", (16, 2.0): "ok", (32, 1.0): "ok", (32, 2.0): "failed"}
    bad = df[df["status"] == "failed"].iloc[0]
    assert bad["attempts"] == 2 and "worker process died" in bad["error"] and "again on retry" in bad["error"]


def test_a_worker_that_dies_once_succeeds_on_retry(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_TEST_MARKER", str(tmp_path / "marker"))
    df = run_sweep(spec(), tmp_path / "out", workers=2, runner=flaky_runner, report=False)
    assert (df["status"] == "ok").all()
    assert df.loc[(df["block_size"] == 32) & (df["rate_scale"] == 2), "attempts"].tolist() == [2]


# ---------------------------------------------------------------- capacity search

def test_bisection_brackets_then_narrows_to_the_threshold_crossing():
    true_max = 3.0  # attainment 1 up to rate 3, then 0
    search = Search(Point("t", {"rate_scale": 1.0}), start=1.0, steps=6)
    probes = []
    while (rate := search.next_rate()) is not None:
        probes.append(rate)
        search.record(rate, {"status": "ok", "slo_attainment": 1.0 if rate <= true_max else 0.0}, 0.9)
    assert probes[:3] == [1.0, 2.0, 4.0], "doubling until a probe misses"
    assert search.status == "found" and search.lo <= true_max < search.hi
    assert search.hi / search.lo < 2 ** (1 / 32), "six geometric bisections of a factor-2 bracket"
    assert len(probes) == 9


def test_find_max_rate_per_configuration(tmp_path):
    s = spec(axes={"max_num_seqs": [2, 64]}, base={"max_requests": 30, "block_size": 16})
    df = run_sweep(s, tmp_path, workers=2, slo="ttft=2s", find="max-rate", bisect_steps=3)
    mr = df.attrs["max_rate"]
    assert mr["max_num_seqs"].tolist() == [2, 64]
    small, large = mr.iloc[0], mr.iloc[1]
    assert small["search_status"] == "found"
    assert small["slo_attainment"] >= 0.9 and small["max_rate_scale"] < small["first_failing_rate_scale"]
    assert large["max_rate_scale"] > small["max_rate_scale"], "more sequences per batch, more capacity"
    probe = df[df["run_dir"] == small["max_rate_run_dir"]].iloc[0]
    assert probe["rate_scale"] == small["max_rate_scale"] and probe["slo_attainment"] >= 0.9
    assert pd.read_parquet(tmp_path / "max_rate.parquet")["max_rate_scale"].tolist() == mr["max_rate_scale"].tolist()
    assert '<section id="max-rate">' in (tmp_path / "sweep_report.html").read_text()
    again = run_sweep(s, tmp_path, workers=2, slo="ttft=2s", find="max-rate", bisect_steps=3, report=False)
    assert (again["attempts"] == 0).all(), "a rerun search replays its probes from disk"
    assert again.attrs["max_rate"]["max_rate_scale"].tolist() == mr["max_rate_scale"].tolist()


def test_find_needs_an_slo_and_no_rate_axis(tmp_path):
    with pytest.raises(SpecError, match="needs an SLO"):
        run_sweep(spec(axes={"block_size": [16]}), tmp_path, find="max-rate")
    with pytest.raises(SpecError, match="remove the 'rate_scale' axis"):
        run_sweep(spec(), tmp_path, find="max-rate", slo=SLO)


# ---------------------------------------------------------------- spec validation

def test_an_unknown_axis_fails_before_anything_runs(tmp_path):
    with pytest.raises(SpecError, match=r"point \[trace=azure-conv blok_size=16\]: unknown option"):
        run_sweep(spec(axes={"blok_size": [16, 32]}), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_bad_value_names_its_point(tmp_path):
    with pytest.raises(SpecError, match=r"block_size=7\]: .*power of two"):
        run_sweep(spec(axes={"block_size": [16, 7]}), tmp_path)


@pytest.mark.parametrize("text, message", [
    ("trace: [bundled:azure-conv\naxes: {", "not valid YAML"),
    ("- just\n- a list\n", "a YAML mapping"),
    ("trace: bundled:azure-conv\naxis: {block_size: [16]}\n", r"unknown top-level key\(s\) \['axis'\]"),
    ("trace: bundled:azure-conv\naxes: {block_size: []}\n", "axis 'block_size': needs a non-empty list"),
    ("trace: bundled:azure-conv\naxes: {block_size: 16}\n", "axis 'block_size': needs a non-empty list"),
    ("trace: bundled:nope\n", "no bundled trace 'nope'"),
    ("trace: missing.csv\n", r"trace 'missing.csv': no such file"),
    ("base: {max_requests: 10}\n", "needs 'trace:'"),
    ("trace: bundled:azure-conv\nseeds: [a]\n", "'seeds' must be a non-empty list of integers"),
    ("trace: bundled:azure-conv\nslo: ttft=2\n", "slo: SLO item 'ttft=2'"),
    ("trace: bundled:azure-conv\naxes: {seed: [1, 2]}\n", "set by the top-level"),
])
def test_spec_errors_are_clear(tmp_path, text, message):
    with pytest.raises(SpecError, match=message) as info:
        load_spec(write_yaml(tmp_path, text))
    assert str(info.value).startswith(str(tmp_path / "spec.yaml")), "the message names the file"


def test_relative_trace_paths_are_read_from_the_spec_directory(tmp_path):
    import traces
    (tmp_path / "t.csv").write_text(traces.bundled("azure-conv").read_text())
    s = load_spec(write_yaml(tmp_path, "trace: t.csv\nbase: {max_requests: 30}\n"))
    assert s.traces[0].label == "t" and Path(s.traces[0].source) == tmp_path / "t.csv"


# ---------------------------------------------------------------- command line

def run_cli(argv):
    parser = argparse.ArgumentParser(prog="blocksim")
    add_sweep_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_runs_a_sweep_and_exits_2_on_a_bad_spec(tmp_path, capsys):
    good = write_yaml(tmp_path, "trace: bundled:azure-conv\nbase: {max_requests: 30}\naxes: {block_size: [16, 32]}\n")
    assert run_cli(["sweep", str(good), "--out", str(tmp_path / "out"), "--quiet", "--no-report"]) == 0
    assert "2 runs: 2 ok" in capsys.readouterr().out
    assert run_cli(["sweep", str(good), "--out", str(tmp_path / "x"), "--dry-run"]) == 0
    assert "2 points" in capsys.readouterr().out and not (tmp_path / "x").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("trace: bundled:azure-conv\naxes: {blok_size: [16]}\n")
    assert run_cli(["sweep", str(bad), "--out", str(tmp_path / "out2")]) == 2
    assert "blocksim sweep: point [trace=azure-conv blok_size=16]: unknown option" in capsys.readouterr().err


def test_a_sweep_warns_about_rejections_up_front_and_counts_them_after(tmp_path, capsys):
    spec = write_yaml(tmp_path, "trace: bundled:azure-conv\nbase: {max_requests: 300}\naxes: {block_size: [16, 32]}\n")
    assert run_cli(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet", "--no-report"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("will be rejected") == 1, "one warning for the points sharing a model"
    assert "trace azure-conv: warning: 12 of 300 requests (4.0%)" in captured.err
    assert "clip_to_model: true in 'base' clips them" in captured.err
    assert "2 runs rejected requests, up to 12 of 300" in captured.out
    clipped = write_yaml(tmp_path, "trace: bundled:azure-conv\nbase: {max_requests: 300, clip_to_model: true}\n"
                                   "axes: {block_size: [16, 32]}\n")
    assert run_cli(["sweep", str(clipped), "--out", str(tmp_path / "clip"), "--quiet", "--no-report"]) == 0
    captured = capsys.readouterr()
    assert "will be rejected" not in captured.err and "rejected requests" not in captured.out


# ---------------------------------------------------------------- Ray

def test_ray_backend_on_a_local_ray(tmp_path):
    pytest.importorskip("ray")
    s = spec(axes={"block_size": [16, 32]})
    df = run_sweep(s, tmp_path, backend="ray", workers=2, report=False)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    local = run_sweep(s, tmp_path / "local", workers=1, report=False)
    assert df["requests_per_s"].tolist() == local["requests_per_s"].tolist(), "same results as the local backend"
    for run_dir in df["run_dir"]:
        assert (tmp_path / run_dir / "steps.parquet").is_file(), "the driver wrote the run directory"
    again = run_sweep(s, tmp_path, backend="ray", workers=2, report=False)
    assert (again["attempts"] == 0).all()
    assert not math.isnan(df["token_states_frac"].iloc[0])
