"""analysis/rundir.py: a bad run directory fails with a message naming what is wrong."""

import json

import pytest
from rundir_fixtures import tiny_requests, tiny_steps, tiny_summary, write_run

from analysis.rundir import RunDirError, load_run


def test_loads_the_three_files_and_no_extents(tiny_run):
    run = load_run(tiny_run)
    assert len(run.requests) == 4 and len(run.steps) == 4
    assert run.policy == "vllm" and run.capacity_tokens == 100
    assert run.free_extents is None, "free_extents.parquet is optional"


def test_loads_free_extents_when_present(tiny_run_extents):
    assert len(load_run(tiny_run_extents).free_extents) == 4


@pytest.mark.parametrize("missing", ["requests.parquet", "steps.parquet", "summary.json"])
def test_missing_file_is_named(tiny_run, missing):
    (tiny_run / missing).unlink()
    with pytest.raises(RunDirError, match=f"missing {missing}"):
        load_run(tiny_run)


def test_all_missing_files_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError) as err:
        load_run(tmp_path / "empty")
    assert all(f in str(err.value) for f in ("requests.parquet", "steps.parquet", "summary.json"))


def test_not_a_directory(tmp_path):
    with pytest.raises(RunDirError, match="not a directory"):
        load_run(tmp_path / "nope")


def test_missing_columns_are_named(tmp_path):
    steps = tiny_steps().drop(columns=["mem_free", "duration_s"])
    with pytest.raises(RunDirError, match=r"steps.parquet: missing column\(s\) duration_s, mem_free"):
        load_run(write_run(tmp_path / "r", steps=steps))
    requests = tiny_requests().drop(columns=["ttft_s"])
    with pytest.raises(RunDirError, match=r"requests.parquet: missing column\(s\) ttft_s"):
        load_run(write_run(tmp_path / "r2", requests=requests))


def test_missing_extent_column_is_named(tmp_path):
    import pandas as pd

    with pytest.raises(RunDirError, match="free_extents.parquet: missing column"):
        load_run(write_run(tmp_path / "r", extents=pd.DataFrame({"step": [0], "start_s": [0.0]})))


@pytest.mark.parametrize("version", ["2.0", 7, "banana"])
def test_incompatible_version_is_refused(tmp_path, version):
    with pytest.raises(RunDirError, match="version .* is not supported"):
        load_run(write_run(tmp_path / "r", summary={**tiny_summary(), "version": version}))


@pytest.mark.parametrize("version", ["1.0", 1, "0.1.0", "1.3.2"])
def test_compatible_versions_load(tmp_path, version):
    load_run(write_run(tmp_path / "r", summary={**tiny_summary(), "version": version}))


def test_missing_summary_keys_and_bad_json(tiny_run):
    summary = tiny_summary()
    del summary["capacity_tokens"], summary["version"]
    (tiny_run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RunDirError, match=r"missing key\(s\) version, capacity_tokens"):
        load_run(tiny_run)
    (tiny_run / "summary.json").write_text("{not json")
    with pytest.raises(RunDirError, match="not valid JSON"):
        load_run(tiny_run)


def test_corrupt_parquet(tiny_run):
    (tiny_run / "steps.parquet").write_text("garbage")
    with pytest.raises(RunDirError, match="steps.parquet: cannot be read as parquet"):
        load_run(tiny_run)
