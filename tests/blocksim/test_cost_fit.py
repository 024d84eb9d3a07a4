"""The roofline's constants fitted on a profile's grids: recovered from a profile the roofline made."""

import json

import numpy as np
import pytest
from cost_profiles import synthetic_profile

from blocksim.cli import main
from blocksim.cost import CostParams, RooflineCostModel, fit_roofline, load_cost_file
from blocksim.cost.fit import grid_errors
from blocksim.cost.profile_file import parse_profile
from blocksim.experiments.runner import build_config

TRUE = CostParams(flops_efficiency=0.45, bw_efficiency=0.7, step_overhead_s=0.0007, transfer_latency_s=3e-6,
                  launch_s=2e-5, swap_batched=True, scale_attn_prefill=1.3, scale_attn_decode=0.9,
                  scale_swap=0.8, scale_copy=2.0)


def roofline_profile(config, params: CostParams) -> dict:
    """A profile whose tables are the roofline's own predictions (cache writes and sampling negligible)."""
    rm = RooflineCostModel(config, params)
    prof = synthetic_profile()
    c = prof["components"]
    tok = c["linear"]["grid"]["tokens"]
    c["linear"]["seconds"] = [rm.linear(t) for t in tok]
    c["cache_write"]["seconds"] = [1e-15] * len(c["cache_write"]["grid"]["tokens"])
    c["sample"]["seconds"] = [1e-15] * len(c["sample"]["grid"]["sequences"])
    g = c["attn_prefill"]["grid"]
    c["attn_prefill"]["seconds"] = [[[rm.attn_prefill(np.full(b, p), np.full(b, cc)) for cc in g["cached_tokens"]]
                                     for p in g["new_tokens"]] for b in g["batch"]]
    g = c["attn_decode"]["grid"]
    c["attn_decode"]["seconds"] = [[float(rm.attn_decode(b * x)) for x in g["context"]] for b in g["batch"]]
    for k in ("swap_in", "swap_out"):
        c[k]["seconds"] = [rm.swap(b) for b in c[k]["grid"]["blocks"]]
    c["copy"]["seconds"] = [rm.copy(b) for b in c["copy"]["grid"]["blocks"]]
    c["overhead"] = {"eager_s": 0.002, "graph_s": params.step_overhead_s}
    return prof


def test_fit_recovers_the_constants_of_a_roofline_made_profile():
    cfg = build_config()
    prof = parse_profile(roofline_profile(cfg, TRUE), "roofline.json")
    fit = fit_roofline(prof, cfg)
    assert fit.flops_efficiency == pytest.approx(TRUE.flops_efficiency, rel=0.03)
    assert fit.bw_efficiency == pytest.approx(TRUE.bw_efficiency, rel=0.03)
    assert fit.step_overhead_s == TRUE.step_overhead_s, "the graph overhead: most steps are decode-only"
    assert fit.scale_swap == pytest.approx(TRUE.scale_swap, rel=1e-6)
    assert fit.transfer_latency_s == pytest.approx(TRUE.transfer_latency_s, rel=1e-6)
    assert fit.scale_copy == pytest.approx(TRUE.scale_copy, rel=1e-6)
    assert fit.launch_s == pytest.approx(TRUE.launch_s, rel=1e-6)
    err = grid_errors(prof, cfg, fit)
    assert err["linear"]["mape_pct"] < 2.0
    for comp in ("attn_prefill", "attn_decode", "swap", "copy"):
        assert err[comp]["mape_pct"] < 1e-6, f"{comp}: one multiplier reproduces a roofline-made table"
    default = grid_errors(prof, cfg)
    assert default["swap"]["mape_pct"] > 50, "the default constants (a copy per block per layer) are far off"


def test_fit_on_a_measured_like_profile_reduces_the_grid_error():
    cfg = build_config()
    prof = parse_profile(synthetic_profile(), "synthetic.json")
    fit = fit_roofline(prof, cfg)
    before, after = grid_errors(prof, cfg), grid_errors(prof, cfg, fit)
    for comp in ("linear", "swap", "copy"):
        assert after[comp]["mape_pct"] < before[comp]["mape_pct"], comp


def test_cost_fit_command_writes_a_roofline_parameter_file(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(synthetic_profile()))
    out = tmp_path / "fit.json"
    assert main(["cost-fit", str(path), "--out", str(out), "--errors"]) == 0
    text = capsys.readouterr().out
    assert "default MAPE" in text and "attn_decode" in text
    params = load_cost_file(out)
    assert isinstance(params, CostParams) and params.swap_batched is True
    assert json.loads(out.read_text())["format"] == "blocksim-roofline/1"
    assert (tmp_path / "fit.errors.json").is_file()


def test_the_roofline_without_a_file_takes_constants_fitted_on_shipped_profiles(tmp_path, monkeypatch):
    from cost_profiles import write_profile

    from blocksim.cost.profile_file import profile_name
    from blocksim.policies import make_cost_model
    monkeypatch.setattr("blocksim.cost.profile_file.PROFILES_DIR", tmp_path)
    own = write_profile(tmp_path / profile_name("llama-2-7b", "h100-80gb", "float16", 1))
    write_profile(tmp_path / profile_name("mistral-7b", "h100-80gb", "float16", 1), model="mistral-7b")
    roof = make_cost_model(build_config(cost_model="roofline"))
    assert roof.describe()["profile"] == f"fitted on blocksim/profiles/{own.name}", \
        "the run's own model's profile, named portably"
    cfg = build_config(cost_model="roofline")
    assert roof.params == fit_roofline(parse_profile(synthetic_profile(), "x"), cfg)
    other = make_cost_model(build_config(model="llama-2-13b", cost_model="auto"))
    assert isinstance(other, RooflineCostModel) and other.describe()["profile"].count("h100-80gb") == 2, \
        "a model without a profile: the roofline fitted on its GPU's profiles"
    bare = make_cost_model(build_config(gpu="h200-141gb", cost_model="roofline"))
    assert bare.params == CostParams() and bare.describe()["profile"] is None, "no profile of the GPU: defaults"


def test_log_span_weights_share_out_the_grid_span():
    from blocksim.cost.fit import log_span_weights
    x = np.array([1.0, 2.0, 4.0, 8.0, 8.5, 9.0, 16.0])
    w = log_span_weights(x)
    assert w.sum() == pytest.approx(np.log(16.0))
    assert w[0] == pytest.approx(np.log(2.0) / 2) and w[1] == pytest.approx(np.log(2.0))
    assert w[4] < w[1] / 5, "a point among close neighbours covers little"


def test_a_densely_sampled_stretch_of_the_linear_grid_does_not_move_the_efficiencies():
    """The fit weighs each linear point by the span of log tokens it covers: sampling 256-4,096 tokens
    every 16 tokens (as today's profiles do) fits the same efficiencies as sampling it by powers of two."""
    cfg = build_config()
    rm = RooflineCostModel(cfg, TRUE)
    flop_s, floor_s = rm.linear(16384) / 16384, rm.linear(1)

    def fitted(tokens):
        prof = roofline_profile(cfg, TRUE)
        lin = prof["components"]["linear"]
        lin["grid"]["tokens"] = [float(t) for t in tokens]
        # a soft knee: no roofline reproduces it, so where the fit weighs its points matters
        lin["seconds"] = [float(np.hypot(flop_s * t, floor_s)) for t in tokens]
        return fit_roofline(parse_profile(prof, "soft-knee.json"), cfg)

    sparse = [2.0 ** k for k in range(15)]
    dense = sorted(set(sparse) | set(range(256, 4097, 16)))
    a, b = fitted(sparse), fitted(dense)
    assert b.bw_efficiency == pytest.approx(a.bw_efficiency, rel=0.02)
    assert b.flops_efficiency == pytest.approx(a.flops_efficiency, rel=0.02)
