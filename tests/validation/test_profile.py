"""validation.profile: the cost profile written from a kernels.bench results file (no GPU)."""
from __future__ import annotations

import json

import pytest

from blocksim.catalog import GPUS
from blocksim.cost import CostParams
from validation import profile


def results(**over):
    row = {"shape": [8, 32, 8, 16384], "kv_bytes": 537_000_000, "fast": 0.130, "fast_default": 0.125,
           "copy_gbs": 4250.0}
    res = {"device": "NVIDIA H200 (132 SMs)", "torch": "2.11.0", "copy_gbs": 4250.0, "fast_storage": "H2ND",
           "headline": [row, dict(row)]}
    res.update(over)
    return res


def test_profile_scale_is_predicted_over_measured_bandwidth(tmp_path):
    path = tmp_path / "profile.json"
    prof = profile.write_profile(results(), path)
    measured = 2 * 537_000_000 / (2 * 0.125e-3) / 1e9        # the default-storage times
    assert prof["params"]["scale_attn_decode"] == pytest.approx(4800 * 0.8 / measured, abs=1e-4)
    assert json.loads(path.read_text()) == prof
    assert "H2ND storage" in prof["source"] and "h200-141gb" in prof["source"]


def test_profile_reads_the_gpu_and_efficiency_from_the_simulator():
    prof = profile.build_profile(results(device="NVIDIA H100 80GB HBM3 (132 SMs)"))
    measured = 2 * 537_000_000 / (2 * 0.125e-3) / 1e9
    want = GPUS["h100-80gb"].hbm_bw_gbps * CostParams().bw_efficiency / measured
    assert prof["params"]["scale_attn_decode"] == pytest.approx(want, abs=1e-4)


def test_profile_loads_as_a_cost_profile(tmp_path):
    path = tmp_path / "profile.json"
    prof = profile.write_profile(results(), path)
    assert CostParams.from_json(path).scale_attn_decode == prof["params"]["scale_attn_decode"]


def test_profile_needs_a_known_gpu_and_headline_rows(tmp_path):
    assert profile.write_profile(results(device="Some GPU"), tmp_path / "p.json") is None
    assert profile.write_profile(results(headline=[]), tmp_path / "p.json") is None
    assert not (tmp_path / "p.json").exists()


def test_profile_command_writes_the_file_or_says_why_not(tmp_path, capsys):
    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps(results()))
    out = tmp_path / "profile.json"
    assert profile.main([str(saved), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["params"]["scale_attn_decode"] > 0
    saved.write_text(json.dumps(results(device="Some GPU")))
    assert profile.main([str(saved), "--out", str(tmp_path / "none.json")]) == 1
    assert "does not know" in capsys.readouterr().err
