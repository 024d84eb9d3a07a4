"""Tensor parallelism's communication in the cost models: two all-reduces per layer priced by the
roofline's ring formula or a profile's measured table, the t_comm_s column (only when TP > 1),
and spans priced exactly as single steps."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from cost_profiles import synthetic_profile

from blocksim.catalog import GPUS, Catalog
from blocksim.config import ConfigError
from blocksim.cost import ProfiledCostModel, ProfileWarning, RooflineCostModel, fit_roofline, load_profile
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.policies import make_cost_model
from blocksim.records.schema import COMM_COLUMN, STEP_COLUMNS, STEP_COLUMNS_TP

TRACE = pd.DataFrame({"arrival_s": [0.0, 0.01, 0.02, 0.5, 0.51], "prompt_tokens": [300, 40, 900, 70, 2000],
                      "output_tokens": [30, 80, 5, 60, 12]})


def config(tp: int, **kw):
    return build_config(model="llama-2-70b", gpu="h200-141gb", tensor_parallel=tp, num_gpu_blocks=400, **kw)


def test_roofline_prices_two_ring_allreduces_per_layer():
    cm = RooflineCostModel(config(4))
    g, tokens = GPUS["h200-141gb"], 128
    nbytes = tokens * 8192 * 2  # tokens x hidden x float16
    one = g.allreduce_latency_s + 2 * 3 / 4 * nbytes / (g.gpu_link_gbps * 1e9 * 0.8)
    assert cm.comm(tokens) == pytest.approx(2 * 80 * one, rel=1e-12), "2 per layer x 80 layers, ring at TP 4"
    assert cm.comm(0) == 0.0, "a step without tokens all-reduces nothing"
    assert RooflineCostModel(config(1)).comm(tokens) == 0.0, "one GPU: no communication"
    assert RooflineCostModel(config(8)).comm(tokens) > cm.comm(tokens) > RooflineCostModel(config(2)).comm(tokens), \
        "the ring's traffic 2 (N - 1) / N grows with N"


def test_the_catalog_gives_nvlink_to_sxm_gpus_and_pcie_to_the_l4(tmp_path):
    assert GPUS["h100-80gb"].gpu_link_gbps == GPUS["h200-141gb"].gpu_link_gbps == 450.0
    assert GPUS["a100-80gb"].gpu_link_gbps == 300.0 and GPUS["l4"].gpu_link_gbps == 32.0
    f = tmp_path / "c.yaml"
    f.write_text("gpus:\n  g: {memory_gib: 8, hbm_bw_gbps: 100, fp16_tflops: 10, host_link_gbps: 8}\n")
    assert Catalog([f]).gpu("g").gpu_link_gbps > 0, "a user's GPU without a link figure gets the PCIe default"
    f.write_text("gpus:\n  g: {memory_gib: 8, hbm_bw_gbps: 100, fp16_tflops: 10, host_link_gbps: 8, "
                 "gpu_link_gbps: -1}\n")
    with pytest.raises(ConfigError, match="gpu_link_gbps"):
        Catalog([f])


def test_only_tensor_parallel_runs_record_t_comm_s():
    one = Engine(config(1), TRACE, make_cost_model(config(1), None)).run().steps
    assert list(one.columns) == list(STEP_COLUMNS) and COMM_COLUMN not in one
    cfg = config(2)
    cm = make_cost_model(cfg, None)
    steps = Engine(cfg, TRACE, cm).run().steps
    assert list(steps.columns) == list(STEP_COLUMNS_TP)
    tokens = (steps.prefill_tokens + steps.num_decode_seqs).to_numpy()
    assert np.array_equal(steps.t_comm_s.to_numpy(), [cm.comm(int(t)) for t in tokens]), "each step's all-reduces"
    assert (steps.t_comm_s > 0).all()
    parts = steps[[c for c in STEP_COLUMNS_TP if c.startswith("t_")]].sum(axis=1)
    assert np.allclose(steps.duration_s, parts, rtol=1e-12), "a step lasts the sum of its components, t_comm_s included"


def profile(tmp_path, **kw):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(synthetic_profile("llama-2-70b", "h200-141gb", tensor_parallel=2, **kw)))
    return load_profile(path)


def test_profiled_comm_reads_the_allreduce_table_else_the_ring_formula(tmp_path):
    cfg = config(2)
    with_table = ProfiledCostModel(cfg, profile(tmp_path, allreduce=True))
    table = with_table.profile.tables["allreduce"]
    nbytes = 64 * 8192 * 2
    one = float(np.interp(nbytes, table.grids[0], table.seconds))
    assert with_table.comm(64) == pytest.approx(2 * 80 * one, rel=1e-12), "2 x layers all-reduces from the table"
    without = ProfiledCostModel(cfg, profile(tmp_path))
    assert without.comm(64) == RooflineCostModel(cfg).comm(64), "no table: the roofline's ring formula"
    assert with_table.describe()["allreduce"] == "profile"


def test_a_tensor_parallel_decode_step_table_holds_the_allreduces(tmp_path):
    cm = ProfiledCostModel(config(2), profile(tmp_path, allreduce=True, decode_step=True))
    ds = cm.decode_step.eval(np.array([32.0]), np.array([4000.0]))[0]
    total = cm.linear(30, 30, True) + cm.attn_decode(30 * 4000, 30, True) + cm.comm(30)
    assert total == pytest.approx(ds, rel=1e-12), "linear + attention + all-reduces = the whole graph step"


def test_allreduces_beyond_the_table_are_counted(tmp_path):
    cm = ProfiledCostModel(config(2), profile(tmp_path, allreduce=True))
    big = int(cm.allreduce_line.hi // cm.allreduce_bytes_per_token) + 1
    steps = pd.DataFrame({"num_prefill_seqs": [1, 1], "num_decode_seqs": [0, 0], "prefill_tokens": [big, 16],
                          "decode_ctx_tokens": [0, 0], "blocks_swapped_in": [0, 0], "blocks_swapped_out": [0, 0],
                          "blocks_copied": [0, 0]})
    assert cm.extrapolated(steps)["allreduce.bytes"] == 1


@pytest.mark.parametrize("cost", ["roofline", "profiled"])
@pytest.mark.parametrize("preset", ["vllm", "vllm-chunked"])
def test_spans_price_tensor_parallel_steps_exactly_as_stepping(tmp_path, cost, preset):
    cfg = build_config(preset, model="llama-2-70b", gpu="h200-141gb", tensor_parallel=2, num_gpu_blocks=120,
                       cost_model=cost)
    source = None
    if cost == "profiled":
        source = tmp_path / "p.json"
        source.write_text(json.dumps(synthetic_profile("llama-2-70b", "h200-141gb", tensor_parallel=2,
                                                       allreduce=True, decode_step=True)))
        source = str(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        a = Engine(cfg, TRACE, make_cost_model(cfg, source), spans=True).run()
        b = Engine(cfg, TRACE, make_cost_model(cfg, source), spans=False).run()
    assert len(a.steps) > len(TRACE)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)


def test_the_roofline_fit_reads_link_efficiency_and_latency_off_the_allreduce_table(tmp_path):
    cfg = config(2)
    params = fit_roofline(profile(tmp_path, allreduce=True), cfg)
    assert params.link_efficiency == pytest.approx(360 / 450, rel=1e-6), "the synthetic table's 360 GB/s bus bandwidth"
    assert params.allreduce_latency_s == pytest.approx(8e-6, rel=1e-6)
    fitted = RooflineCostModel(cfg, params)
    table = ProfiledCostModel(cfg, profile(tmp_path, allreduce=True))
    assert fitted.comm(100) == pytest.approx(table.comm(100), rel=1e-6)
    assert fit_roofline(profile(tmp_path), cfg).allreduce_latency_s is None, "no table: the catalog's figures"
