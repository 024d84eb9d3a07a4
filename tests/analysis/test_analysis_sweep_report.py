"""analysis/sweep_report.py: honest heatmap colour scales, heatmaps held where they inform, findings first."""

import pandas as pd
import pytest

from analysis.sweep_report import MIN_RELATIVE_SPAN, colour_limits, heatmap_images, informative_slice, sweep_sections


def test_values_that_differ_by_noise_share_a_colour():
    lo, hi = colour_limits([3.26660, 3.26661, 3.26662])
    assert hi - lo == pytest.approx(MIN_RELATIVE_SPAN * 3.26662), "the scale is widened, not stretched over 2e-5"
    assert lo < 3.2666 and hi > 3.26662, "every value lies inside the scale"


def test_a_real_difference_spans_the_scale():
    assert colour_limits([1.78, 2.25, 2.34]) == (1.78, 2.34)
    assert colour_limits([0.0, 0.0]) == (-0.5, 0.5), "all zero: a unit scale about zero"
    assert colour_limits([float("nan")]) is None


def _grid() -> pd.DataFrame:
    """Throughput of two policies x two block sizes at two rates: identical at the idle rate."""
    rows = []
    for rate in (0.5, 4.0):
        for policy, speed in (("vllm", 1.0), ("orca-max", 0.6)):
            for bs in (16, 32):
                busy = rate * (speed if rate > 1 else 1.0) * (1.0 if bs == 16 else 0.97)
                rows.append({"trace": "t", "policy": policy, "block_size": bs, "rate_scale": rate,
                             "status": "ok", "requests_per_s": busy})
    return pd.DataFrame(rows)


def test_the_held_axis_sits_where_the_metric_varies():
    fixed, rows = informative_slice(_grid(), ["rate_scale"], "requests_per_s")
    assert fixed == {"rate_scale": 4.0} and (rows["rate_scale"] == 4.0).all()
    images = heatmap_images(_grid(), ["policy", "block_size", "rate_scale"], {"x": "policy", "y": "block_size"})
    assert len(images) == 1
    assert "other axes at rate_scale=4.0 (where it varies most)" in images[0].caption
    assert images[0].png.startswith(b"\x89PNG")


def test_sweep_report_leads_with_findings_and_ends_with_the_setup():
    df = _grid().assign(rejected=[0, 0, 0, 0, 0, 0, 3, 0], requests=100, run_dir=[f"runs/p{i}" for i in range(8)])
    sections = sweep_sections(df, {"name": "s", "axes": {"policy": [], "block_size": [], "rate_scale": []}})
    ids = [s.id for s in sections]
    assert ids[0] == "headline" and ids[-2:] == ["runs", "setup"]
    text = " ".join(i for i in sections[0].items if isinstance(i, str))
    assert "1 runs rejected requests too long for the model, up to 3 of 100 (runs/p6)" in text
    assert "Best by throughput on t: policy=vllm, block_size=16, rate_scale=4.0 (4 req/s)." in text
