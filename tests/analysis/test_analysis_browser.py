"""Every kind of report in a real headless browser (Debian's chromium): no console errors, every
image shows, the main tables fit the page without horizontal scrolling; a screenshot per kind.

The reports have no JavaScript. The test loads a copy with a probe script prepended that
records errors (script errors and resources that fail to load, caught in the capture phase),
and after the load event writes every image's decoded and rendered size, and every table's
width against its container's, into the DOM, which ``--dump-dom`` then prints. The screenshots
(``<kind>.png``) go to ``$BLOCKSIM_ARTEFACTS`` when set, else to the test's temporary directory.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import traces
from analysis.fragmentation import fragmentation_report
from analysis.report import APPENDIX_IDS, write_report
from blocksim.experiments.compare import compare
from blocksim.experiments.runner import replay
from blocksim.experiments.spec import parse_spec
from blocksim.experiments.sweep import run_sweep

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  var t = e.target || {};
  window.__errors.push(e.message || ("failed to load " + (t.src || t.href || t.tagName)));
}, true);
var __consoleError = console.error;
console.error = function () { window.__errors.push("console.error: " + [].join.call(arguments, " "));
                              __consoleError.apply(console, arguments); };
window.addEventListener("load", function () {
  var images = [].map.call(document.images, function (img) {
    var box = img.getBoundingClientRect();
    return {alt: img.alt, complete: img.complete, natural: [img.naturalWidth, img.naturalHeight],
            rendered: [box.width, box.height]};
  });
  var tables = [].map.call(document.querySelectorAll("div.scroll"), function (div) {
    var section = div.closest("section");
    return {section: section ? section.id : "", scroll: div.scrollWidth, client: div.clientWidth};
  });
  var probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({images: images, tables: tables, errors: window.__errors,
    resources: performance.getEntriesByType("resource").map(function (r) { return r.name; })});
  document.body.appendChild(probe);
});
</script>"""


def _chromium(url: str, profile, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--window-size=1280,2000", "--virtual-time-budget=5000", *extra, url],
        capture_output=True, text=True, timeout=90, check=False,
    )


def _artefacts(tmp_path) -> Path:
    path = Path(os.environ.get("BLOCKSIM_ARTEFACTS") or tmp_path / "artefacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_in_browser(html_path: Path, tmp_path: Path, kind: str, wide_ok=APPENDIX_IDS) -> dict:
    """Load a report in chromium: no errors, every image decoded and shown, no table wider than its
    container outside the ``wide_ok`` sections; keep a full-page screenshot as ``<kind>.png``."""
    page = html_path.read_text()
    probed = tmp_path / f"probed-{kind}.html"
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))

    result = _chromium(probed.as_uri(), tmp_path / "profile", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.DOTALL)
    assert match, f"probe did not run; stderr: {result.stderr[-2000:]}"
    probe = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&")
                       .replace("&lt;", "<").replace("&gt;", ">"))

    assert probe["errors"] == [], f"{kind}: errors while loading the report"
    assert probe["resources"] == [], f"{kind}: the report fetched something (it must be self-contained)"
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], f"{kind}: console messages while loading the report"
    images = probe["images"]
    assert images and len(images) == page.count("<img "), f"{kind}: every image reached the DOM"
    for img in images:
        assert img["complete"] and min(img["natural"]) > 0, f"{kind}: {img['alt']} did not decode"
        assert min(img["rendered"]) > 0, f"{kind}: {img['alt']} has no rendered size"
    assert probe["tables"], f"{kind}: the tables were measured"
    scrolling = [t for t in probe["tables"] if t["section"] not in wide_ok and t["scroll"] > t["client"]]
    assert scrolling == [], f"{kind}: main tables need horizontal scrolling"

    shot = _artefacts(tmp_path) / f"{kind}.png"
    _chromium(probed.as_uri(), tmp_path / "profile", "--hide-scrollbars", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 10_000, f"{kind}: screenshot {shot}"
    return probe


def test_single_run_report_in_the_browser(tiny_run_extents, tmp_path):
    html_path, _ = write_report(tiny_run_extents)
    check_in_browser(html_path, tmp_path, "run-report")


def test_fragmentation_report_in_the_browser(tiny_run_extents, tmp_path):
    rep = fragmentation_report(tiny_run_extents)
    check_in_browser(rep.html_path, tmp_path, "fragmentation-report")


def test_a_real_run_and_comparison_in_the_browser(tmp_path):
    trace = traces.head(traces.read_trace(traces.bundled("azure-conv")), 300)
    run = tmp_path / "run"
    replay(trace, run, overrides={"model": "llama-2-7b", "gpu": "a100-40gb"}, write_report=True)
    check_in_browser(run / "report.html", tmp_path, "run-report-real")
    out = tmp_path / "cmp"
    compare(trace, ["vllm", "orca-oracle", "orca-max"], [0.5, 1.0], out, workers=1,
            overrides={"model": "llama-2-7b", "gpu": "a100-40gb", "clip_to_model": True})
    check_in_browser(out / "report.html", tmp_path, "compare-report")


def test_sweep_report_in_the_browser(tmp_path):
    spec = parse_spec({"name": "browser", "trace": "bundled:azure-conv",
                       "base": {"max_requests": 150, "clip_to_model": True, "gpu": "a100-40gb"},
                       "axes": {"policy": ["vllm", "orca-max"], "block_size": [16, 32], "rate_scale": [0.5, 2.0]}})
    run_sweep(spec, tmp_path / "sweep", workers=1)
    check_in_browser(tmp_path / "sweep" / "sweep_report.html", tmp_path, "sweep-report", wide_ok=("runs", "setup"))
