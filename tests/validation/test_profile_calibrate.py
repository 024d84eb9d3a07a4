"""validation.profile_calibrate: `blocksim profile --calibrate` measures a sample of a base profile's
cells on this device and writes the base with each seconds table scaled by its median ratio; on the
CPU with a tiny model and a quick base (the graph-step tables are measured on a GPU only)."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

pytest.importorskip("torch")

from blocksim.cli import main  # noqa: E402
from validation import profile_calibrate as cal  # noqa: E402

TINY = """models:
  tiny: {num_layers: 2, hidden_size: 256, num_heads: 4, num_kv_heads: 2, head_size: 64, num_params: 1.0e6,
         max_model_len: 256, intermediate_size: 256, vocab_size: 512}
"""
SCALED = ("linear", "attn_prefill", "attn_decode", "cache_write", "sample", "swap_out", "swap_in", "copy")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """(the base profile, its path, where the calibrated profile is to be written)."""
    from validation.profile import profile
    d = tmp_path_factory.mktemp("calibrate")
    (d / "tiny.yaml").write_text(TINY)
    base = profile("tiny", gpu="h200-141gb", device="cpu", quick=True, catalog=[str(d / "tiny.yaml")],
                   progress=False)
    base_path = d / "base.json"
    base_path.write_text(json.dumps(base))
    out = d / "out" / "calibrated.json"
    return base, base_path, out


def _calibrate(base_path, out, *more, model="tiny"):
    return main(["profile", "--model", model, "--catalog", str(base_path.parent / "tiny.yaml"), "--device", "cpu",
                 "--calibrate", "--from", str(base_path), "--out", str(out), "--quiet", *more])


@pytest.fixture(scope="module")
def written(calibrated):
    """(the base profile, its path, the calibrated profile, its path, the command's stdout lines)."""
    base, base_path, out = calibrated
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert _calibrate(base_path, out) == 0
    return base, base_path, json.loads(out.read_text()), out, stdout.getvalue().splitlines()


def test_the_calibrated_profile_is_the_base_with_each_seconds_table_scaled(written):
    base, _, prof, _, _ = written
    tables = prof["calibrated"]["tables"]
    assert sorted(tables) == sorted(SCALED), "every seconds table a CPU measures; no graph-step table"
    for name in SCALED:
        rec = tables[name]
        assert rec["scale"] > 0 and rec["cells"] >= 1 and rec["p10"] <= rec["scale"] <= rec["p90"], name
        assert rec["measure_s"] >= 0
        np.testing.assert_allclose(np.asarray(prof["components"][name]["seconds"]),
                                   np.asarray(base["components"][name]["seconds"]) * rec["scale"], rtol=1e-12,
                                   err_msg=f"{name}: base seconds times its scale")
        assert prof["components"][name]["grid"] == base["components"][name]["grid"], "the same grid"
    assert prof["components"]["overhead"] == base["components"]["overhead"], "the overhead is left as it was"
    assert {k: v for k, v in prof.items() if k not in ("components", "calibrated")} == \
        {k: v for k, v in base.items() if k != "components"}, "the base's header, unchanged"


def test_the_calibrated_key_names_the_device_the_base_and_the_command(written):
    base, base_path, prof, _, lines = written
    c = prof["calibrated"]
    assert c["device"] == "cpu" and c["torch"] and c["utc"].endswith("Z") and c["measure_s"] >= 0
    assert c["base"] == {"path": str(base_path), "created_utc": base["created_utc"]}
    assert c["command"].startswith("blocksim profile --model tiny ") and "--calibrate --from" in c["command"]
    per_table = [line for line in lines if line.startswith("calibrate tiny: ") and "scale" in line]
    assert len(per_table) == len(SCALED) and all("10%-90%" in line for line in per_table), "one line per table"
    assert any("tables calibrated on cpu in" in line for line in lines), "and the total seconds"


def test_the_cost_model_reads_a_calibrated_profile_and_prices_a_step(written):
    from blocksim.cost import ProfiledCostModel, load_profile
    from blocksim.experiments.runner import build_config
    base, base_path, prof, out, _ = written
    config = build_config(catalog=[str(base_path.parent / "tiny.yaml")], model="tiny", gpu="h200-141gb",
                          num_gpu_blocks=24)
    model, before = ProfiledCostModel(config, load_profile(out)), ProfiledCostModel(config, load_profile(base_path))
    scales = {k: v["scale"] for k, v in prof["calibrated"]["tables"].items()}
    lin, write = (np.asarray(base["components"][k]["seconds"]) for k in ("linear", "cache_write"))
    i, j = (base["components"][k]["grid"]["tokens"].index(16) for k in ("linear", "cache_write"))  # grid points
    assert model.linear(16) == pytest.approx(lin[i] * scales["linear"] + write[j] * scales["cache_write"], rel=1e-9), \
        "a step of 16 tokens on the grid: its linear layers and cache writes, each scaled"
    assert before.linear(16) == pytest.approx(lin[i] + write[j], rel=1e-9)
    assert model.attn_decode(128, batch=2) > 0
    rec = model.describe()["calibrated"]
    assert rec["device"] == "cpu" and rec["scales"] == scales
    assert "calibrated" not in before.describe()


def test_a_calibrated_profile_is_not_taken_for_its_base_by_the_fidelity_report(written):
    from analysis.fidelity import _same_model
    from blocksim.cost import ProfiledCostModel, load_profile
    from blocksim.experiments.runner import build_config
    _, base_path, _, out, _ = written
    config = build_config(catalog=[str(base_path.parent / "tiny.yaml")], model="tiny", gpu="h200-141gb",
                          num_gpu_blocks=24)
    a, b = (ProfiledCostModel(config, load_profile(p)).describe() for p in (base_path, out))
    b["profile"] = str(base_path.parent / base_path.name)  # the same file name, as a shipped name would be
    assert not _same_model(a, b) and _same_model(b, dict(b))


def _one_line_refusal(capsys, rc: int, *words) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and all(w in err for w in words), err
    return err


@pytest.mark.parametrize("field, value, said", [
    ("device", "NVIDIA H100 80GB HBM3", "was measured on 'NVIDIA H100 80GB HBM3', this device is 'cpu'"),
    ("dtype", "bfloat16", "is a bfloat16 profile, --dtype is float16"),
    ("block_size", 32, "has blocks of 32 tokens, --block-size is 16"),
    ("cuda_graph_batch_sizes", [1, 2, 4], "holds CUDA graphs of sizes [1, 2, 4]"),
    ("tensor_parallel", 2, "is a tensor-parallel profile"),
    ("calibrated", {"base": {"path": "x.json"}}, "is itself calibrated"),
])
def test_a_base_that_cannot_be_calibrated_here_is_refused_in_one_line(calibrated, tmp_path, capsys, field, value,
                                                                      said):
    base, base_path, _ = calibrated
    other = tmp_path / "base.json"
    other.write_text(json.dumps({**base, field: value}))
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "out.json"
    _one_line_refusal(capsys, _calibrate(other, out), "--calibrate", said)
    assert not out.exists(), "nothing written"


def test_a_base_of_another_model_unreadable_or_not_a_profile_is_refused(calibrated, tmp_path, capsys):
    _, base_path, _ = calibrated
    out = tmp_path / "out.json"
    _one_line_refusal(capsys, _calibrate(base_path, out, model="llama-2-7b"),
                      "is a profile of 'tiny', --model names 'llama-2-7b'", "--from")
    _one_line_refusal(capsys, _calibrate(tmp_path / "none.json", out), "cannot read the profile", "--from")
    (tmp_path / "other.json").write_text('{"format": "blocksim-roofline/1"}')
    _one_line_refusal(capsys, _calibrate(tmp_path / "other.json", out), "is not a blocksim-profile/1 file")
    _one_line_refusal(capsys, _calibrate(base_path, out, "--gpu-name", "h100-80gb"),
                      "is a profile for 'h200-141gb', --gpu-name names 'h100-80gb'")
    _one_line_refusal(capsys, _calibrate(base_path, base_path), "--out names the base")
    assert not out.exists()


@pytest.mark.parametrize("more, said", [
    (["--add-table", "attn_decode"], "--calibrate with --add-table"),
    (["--leave-out", "decode_step"], "--calibrate with --leave-out"),
    (["--tier-dir", "."], "--calibrate with --tier-dir"),
    (["--tensor-parallel", "2"], "--calibrate with --tensor-parallel"),
])
def test_calibrate_with_an_option_of_a_measured_profile_is_refused_in_one_line(calibrated, tmp_path, capsys, more,
                                                                               said):
    _, base_path, _ = calibrated
    _one_line_refusal(capsys, _calibrate(base_path, tmp_path / "out.json", *more), said)


def test_calibrate_needs_out_and_from_needs_calibrate(calibrated, capsys):
    _, base_path, _ = calibrated
    cat = str(base_path.parent / "tiny.yaml")
    rc = main(["profile", "--model", "tiny", "--catalog", cat, "--device", "cpu", "--calibrate", "--from",
               str(base_path)])
    _one_line_refusal(capsys, rc, "--out")
    rc = main(["profile", "--model", "tiny", "--catalog", cat, "--device", "cpu", "--from", str(base_path),
               "--out", str(base_path.parent / "x.json")])
    _one_line_refusal(capsys, rc, "add --calibrate")
    rc = main(["profile", "--model", "tiny", "--catalog", cat, "--device", "cpu", "--calibrate", "--out",
               str(base_path.parent / "x.json")])
    _one_line_refusal(capsys, rc, "device 'cpu' is none of the catalog's GPUs", "--from")


# --- the sample and the scale, on hand-made tables ------------------------------------------------------
@pytest.mark.parametrize("n, every, want", [(10, 4, [0, 4, 8, 9]), (9, 4, [0, 4, 8]), (1, 3, [0]), (2, 12, [0, 1]),
                                            (79, 12, [0, 12, 24, 36, 48, 60, 72, 78])])
def test_the_sample_takes_every_kth_value_and_both_ends(n, every, want):
    assert cal.sampled_indices(n, every) == want
    values = list(range(100, 100 + n))
    assert cal.sampled(values, every) == tuple(values[i] for i in want)
    assert cal.sampled(values, every)[0] == values[0] and cal.sampled(values, every)[-1] == values[-1]


def test_the_scale_is_the_median_ratio_of_the_sampled_cells_on_the_bases_grid():
    base = {"axes": ["batch", "context"], "grid": {"batch": [1, 2, 4], "context": [16, 64]},
            "seconds": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]}
    measured = {"axes": ["batch", "context"], "grid": {"batch": [1, 4, 8], "context": [16, 64]},
                "seconds": [[1.1, 2.06], [5.0 * 1.03, 6.0 * 0.5], [9.0, 9.0]]}  # batch 8: not on the base's grid
    r = cal.cell_ratios(base, measured)
    np.testing.assert_allclose(sorted(r), sorted([1.1, 1.03, 1.03, 0.5]))
    rec = cal.scale_of(r)
    assert rec["scale"] == pytest.approx(1.03) and rec["cells"] == 4, "the median: one outlier does not move it"
    assert rec["p10"] < rec["scale"] < rec["p90"]


def test_capped_cells_and_other_axes_give_no_ratio():
    base = {"axes": ["batch", "context", "longest"], "grid": {"batch": [1], "context": [16], "longest": [1.0, 8.0]},
            "seconds": [[[1.0, 2.0]]], "capped": [[1, 16, 8.0]]}
    measured = json.loads(json.dumps(base))
    measured["seconds"] = [[[1.5, 9.0]]]
    assert cal.cell_ratios(base, measured).tolist() == [1.5], "the capped cell is extrapolated, not measured"
    assert cal.cell_ratios(base, {**measured, "axes": ["batch", "context", "other"]}).size == 0


def test_graph_seconds_are_compared_on_their_own_axis():
    base = {"axes": ["tokens"], "grid": {"tokens": [1, 2, 4], "graph_tokens": [1, 8]}, "seconds": [1.0, 2.0, 3.0],
            "graph_seconds": [0.5, 1.0]}
    measured = {"axes": ["tokens"], "grid": {"tokens": [1, 4], "graph_tokens": [8]}, "seconds": [2.0, 6.0],
                "graph_seconds": [1.1]}
    assert cal.cell_ratios(base, measured).tolist() == [2.0, 2.0]
    assert cal.cell_ratios(base, measured, "graph_seconds").tolist() == pytest.approx([1.1])


@pytest.mark.gpu
def test_a_quick_profile_calibrated_on_a_gpu_scales_its_graph_steps_too(tmp_path):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from validation.profile import profile
    (tmp_path / "tiny.yaml").write_text(TINY)
    base = profile("tiny", gpu="h200-141gb", quick=True, catalog=[str(tmp_path / "tiny.yaml")], progress=False)
    base_path = tmp_path / "base.json"
    base_path.write_text(json.dumps(base))
    out = tmp_path / "cal.json"
    assert main(["profile", "--model", "tiny", "--catalog", str(tmp_path / "tiny.yaml"), "--gpu-name", "h200-141gb",
                 "--calibrate", "--from", str(base_path), "--out", str(out), "--quiet"]) == 0
    tables = json.loads(out.read_text())["calibrated"]["tables"]
    assert {"decode_step", "decode_step_longest", "linear.graph_seconds"} <= set(tables)
    assert not {"decode_step_shared", "decode_step_padded"} & set(tables), "ratio tables are left as they are"
