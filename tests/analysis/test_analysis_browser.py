"""report.html in a real headless browser (Debian's chromium): no console errors, every image shows.

The report itself has no JavaScript. The test loads a copy with a probe script prepended that
records errors (script errors and resources that fail to load, caught in the capture phase),
and after the load event writes every image's decoded and rendered size into the DOM, which
``--dump-dom`` then prints.
"""

import json
import re
import shutil
import subprocess

import pytest

from analysis.report import write_report

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
  var probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({images: images, errors: window.__errors,
    resources: performance.getEntriesByType("resource").map(function (r) { return r.name; })});
  document.body.appendChild(probe);
});
</script>"""


def _chromium(url: str, profile) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--window-size=1280,2000", "--virtual-time-budget=5000", "--dump-dom", url],
        capture_output=True, text=True, timeout=90, check=False,
    )


def test_report_loads_without_errors_and_every_image_renders(tiny_run_extents, tmp_path):
    html_path, _ = write_report(tiny_run_extents)
    page = html_path.read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))

    result = _chromium(probed.as_uri(), tmp_path / "profile")
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.DOTALL)
    assert match, f"probe did not run; stderr: {result.stderr[-2000:]}"
    probe = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&")
                       .replace("&lt;", "<").replace("&gt;", ">"))

    assert probe["errors"] == [], "errors while loading the report"
    assert probe["resources"] == [], "the report fetched something (it must be self-contained)"
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], "console messages while loading the report"
    images = probe["images"]
    assert len(images) == page.count("<img "), "every image reached the DOM"
    for img in images:
        assert img["complete"] and min(img["natural"]) > 0, f"{img['alt']} did not decode"
        assert min(img["rendered"]) > 0, f"{img['alt']} has no rendered size"
