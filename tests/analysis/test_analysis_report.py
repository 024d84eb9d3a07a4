"""analysis/report.py: every section present in report.html and report.md, images embedded."""

import re
import time

import pytest
from rundir_fixtures import synthetic_run, tiny_steps, write_run

from analysis.document import format_value
from analysis.report import SECTION_IDS, write_report
from analysis.rundir import RunDirError

FRAGMENTATION_IDS = ("fragmentation-breakdown", "worst-windows", "free-extents")


def _check_html(html: str, ids) -> None:
    for sid in ids:
        assert f'<section id="{sid}">' in html, f"section {sid} missing"
        assert f'href="#{sid}"' in html, f"no link to section {sid}"
    srcs = re.findall(r'<img [^>]*src="([^"]*)"', html)
    assert srcs, "the report has images"
    assert all(s.startswith("data:image/png;base64,") for s in srcs), "images are embedded"
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert not re.search(r'<link |url\(', html), "no external stylesheets or fonts"


def _check_md(md_path, ids) -> None:
    md = md_path.read_text()
    for sid in ids:
        assert f'<a id="{sid}"></a>' in md, f"anchor {sid} missing"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images and all((md_path.parent / name).stat().st_size > 0 for name in images)


def test_single_run_report_has_every_section(tiny_run_extents):
    html_path, md_path = write_report(tiny_run_extents)
    assert (html_path.name, md_path.name) == ("report.html", "report.md")
    _check_html(html_path.read_text(), SECTION_IDS + FRAGMENTATION_IDS)
    _check_md(md_path, SECTION_IDS + FRAGMENTATION_IDS)
    md = md_path.read_text()
    headings = re.findall(r"^## (.*)$", md, re.MULTILINE)
    assert headings[:2] == ["Findings", "Time-averaged memory breakdown"], "findings and the breakdown lead"
    assert headings[-2:] == ["Appendix: all metrics", "Appendix: configuration"], "configuration is an appendix"
    assert {"Memory breakdown over time", "Latency CDFs"} <= set(headings)


def test_findings_state_rejections_with_their_reason_and_the_headline_table(tiny_run):
    _, md_path = write_report(tiny_run)
    findings = md_path.read_text().split("## Findings", 1)[1].split("<a id=", 1)[0]
    assert "4 requests: 3 finished, 1 rejected. 1 rejected: prompt too long." in findings
    assert "| policy | throughput (req/s) | TTFT p99 (s) | TPOT p99 (ms) | used KV holding tokens (%) |" in findings
    assert "| vllm | 0.38 | 3.96 | 1990 | 53 | 2 | 1 |" in findings, "preemptions and rejected close the row"


def test_a_chart_with_nothing_to_show_is_a_sentence(tmp_path):
    steps = tiny_steps().assign(preempted=0, blocks_swapped_in=0, blocks_swapped_out=0)
    _, md_path = write_report(write_run(tmp_path / "calm", steps=steps))
    md = md_path.read_text()
    for sid in ("preemptions-over-time", "latency-vs-rate"):
        section = md.split(f'<a id="{sid}"></a>', 1)[1].split("<a id=", 1)[0]
        assert "![" not in section, f"{sid}: no empty chart"
    assert "No request was preempted and no block swapped." in md
    assert "One run is one point" in md


def test_summary_section_shows_exact_metrics_and_goodput(tiny_run):
    _, md_path = write_report(tiny_run, slo={"ttft": 2.0})
    md = md_path.read_text()
    assert "| requests_per_s | 0.375 |" in md
    assert "| token_states_frac | 0.2375 |" in md
    assert "| goodput_requests | 2 |" in md and "ttft=2000ms" in md
    assert "| scheduler.max_num_seqs | 256 |" in md, "nested config is flattened"


def test_report_on_a_missing_directory(tmp_path):
    with pytest.raises(RunDirError, match="not a directory"):
        write_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="missing requests.parquet, steps.parquet, summary.json"):
        write_report(tmp_path / "empty")


def test_large_run_plots_quickly(tmp_path):
    path = synthetic_run(tmp_path / "big", 500_000, 20_000)
    t0 = time.perf_counter()
    html_path, _ = write_report(path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 30, f"report of a 500k-step run took {elapsed:.1f} s"
    assert html_path.stat().st_size < 5_000_000, "figures are downsampled, not one point per step"


@pytest.mark.parametrize("value, text", [
    (3, "3"), (2.0, "2"), (0.123456, "0.1235"), (float("nan"), ""), (None, ""), ("x", "x"), (True, "True"),
])
def test_format_value(value, text):
    assert format_value(value) == text
