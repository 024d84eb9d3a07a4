"""analysis/fragmentation.py on the tiny run: 2 s windows over 8 s are [0,2) [2,4) [4,6) [6,8).

Wasted slots per step: 30, 40, 10, 0. Window [0,2) holds steps 0 and 1 (by start):
(30*1 + 40*3) / 4 = 37.5; [2,4) holds no step; [4,6) = 10; [6,8) = 0.
"""

import pytest
from rundir_fixtures import tiny_steps, write_run

from analysis.fragmentation import (
    extent_distribution,
    fragmentation_report,
    resident_requests,
    worst_windows,
)
from analysis.rundir import load_run


def test_worst_windows_exact(tiny_run):
    w = worst_windows(load_run(tiny_run), top_k=2, window_s=2.0)
    assert w["rank"].tolist() == [1, 2]
    assert w["start_s"].tolist() == [0.0, 4.0] and w["end_s"].tolist() == [2.0, 6.0]
    assert w["wasted_slots"].tolist() == [37.5, 10.0]
    assert w["wasted_frac"].tolist() == [0.375, 0.1]
    assert w[["reservation", "internal_frag", "external_frag"]].iloc[0].tolist() == [12.5, 8.75, 16.25]
    assert w["resident_requests"].tolist() == [1, 2]


def test_empty_windows_are_never_chosen(tiny_run):
    w = worst_windows(load_run(tiny_run), top_k=10, window_s=2.0)
    assert w["start_s"].tolist() == [0.0, 4.0, 6.0], "[2,4) has no step"


def test_ties_go_to_the_earlier_window(tmp_path):
    steps = tiny_steps().assign(mem_reservation=0, mem_internal_frag=0, mem_external_frag=0)
    w = worst_windows(load_run(write_run(tmp_path / "r", steps=steps)), top_k=2, window_s=2.0)
    assert w["start_s"].tolist() == [0.0, 4.0]


def test_resident_requests_exact(tiny_run):
    run = load_run(tiny_run)
    res = resident_requests(run, worst_windows(run, top_k=2, window_s=2.0))
    # [0,2): r0 (scheduled 0, done 4). r1 is scheduled at 2 = window end: not resident.
    # [4,6): r1 (2..5) and r2 (4..6); r0 finished at 4 = window start: not resident.
    # The rejected r3 is never scheduled. Largest total tokens first: r1 24, r2 7.
    assert res[["window", "request_id"]].values.tolist() == [[1, 0], [2, 1], [2, 2]]
    assert res["total_tokens"].tolist() == [14, 24, 7]


def test_extent_distribution_power_of_two_classes(tiny_run_extents):
    d = extent_distribution(load_run(tiny_run_extents).free_extents)
    assert d["size_tokens"].tolist() == ["8-15", "16-31", "64-127"]
    assert d["extents"].tolist() == [1, 2, 1]
    assert d["free_tokens"].tolist() == [10, 50, 100]
    assert d["free_share"].tolist() == [0.0625, 0.3125, 0.625]


def test_report_writes_files_and_returns_tables(tiny_run_extents):
    rep = fragmentation_report(tiny_run_extents, top_k=3, window_s=2.0)
    assert rep.breakdown["mean_slots"].tolist() == [23.75, 6.25, 6.875, 8.125, 55.0]
    assert rep.breakdown["frac"].sum() == pytest.approx(1.0)
    assert len(rep.windows) == 3 and rep.extents is not None
    md = rep.md_path.read_text()
    for heading in ("time-averaged breakdown", "worst windows", "free-extent sizes"):
        assert f"## Fragmentation: {heading}" in md
    assert "#1 0-2 s: 1" in md
    for png in ("fragmentation_worst-windows.png", "fragmentation_free-extents.png"):
        assert (tiny_run_extents / png).stat().st_size > 0 and f"]({png})" in md
    html = rep.html_path.read_text()
    assert all(f'id="{s}"' in html for s in ("fragmentation-breakdown", "worst-windows", "free-extents"))


def test_report_without_extents_says_so(tiny_run):
    rep = fragmentation_report(tiny_run)
    assert rep.extents is None
    assert "records no free extents" in rep.md_path.read_text()
