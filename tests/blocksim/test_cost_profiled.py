"""The profiled cost model: interpolation, extrapolation counting, CUDA-graph padding, refusals,
default selection, and spans priced exactly as single steps."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from cost_profiles import GRAPH_SIZES, synthetic_profile, write_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocksim import cost as cost_pkg
from blocksim.config import ConfigError
from blocksim.cost import ProfiledCostModel, ProfileWarning, RooflineCostModel, load_cost_file, load_profile
from blocksim.cost.interpolate import Line, Table
from blocksim.cost.profile_file import parse_profile, profile_name
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from blocksim.policies import make_cost_model


@pytest.fixture
def profile_path(tmp_path):
    return write_profile(tmp_path / "p.json")


def model(path, **cfg):
    return ProfiledCostModel(build_config(**cfg), load_profile(path))


# --- interpolation --------------------------------------------------------------------------------
def test_every_table_returns_its_measured_seconds_on_grid_points(profile_path):
    prof = load_profile(profile_path)
    for name, grid in prof.tables.items():
        tab = Table(grid)
        mesh = [m.ravel() for m in np.meshgrid(*grid.grids, indexing="ij")]
        np.testing.assert_allclose(tab.eval(*mesh), grid.seconds.ravel(), rtol=1e-12,
                                   err_msg=f"{name} off its measured values on the grid")
        if len(grid.axes) == 1:
            np.testing.assert_allclose(Line.of(grid).eval(grid.grids[0]), grid.seconds, rtol=1e-12)


def test_interpolation_is_linear_monotone_and_extrapolates_straight_lines():
    from blocksim.cost.profile_file import Grid
    x = np.array([1.0, 4.0, 16.0, 64.0])
    line = Line.of(Grid("cache_write", ("tokens",), (x,), 3e-4 + 2e-6 * x))  # a floor plus a slope
    q = np.linspace(1.0, 64.0, 500)
    y = line.eval(q)
    assert (np.diff(y) > 0).all(), "monotone grid values give monotone interpolation"
    np.testing.assert_allclose(y, 3e-4 + 2e-6 * q, rtol=1e-12, err_msg="exact for a floor plus a slope")
    beyond = np.array([128.0, 1000.0])
    np.testing.assert_allclose(line.eval(beyond), 3e-4 + 2e-6 * beyond, rtol=1e-12,
                               err_msg="extrapolation continues the line of the two nearest points")
    assert line.outside(np.array([0.5, 1.0, 64.0, 65.0])).tolist() == [True, False, False, True]
    falling = Line.of(Grid("copy", ("blocks",), (np.array([2.0, 4.0]),), np.array([1e-3, 2e-3])))
    assert falling.eval(np.array([1e-3]))[0] > 0, "a line extrapolated below zero keeps a positive floor"


def test_prefill_new_tokens_follow_power_laws_and_cached_tokens_lines():
    from blocksim.cost.profile_file import Grid
    new, cached = np.array([16.0, 64.0, 256.0]), np.array([0.0, 100.0])
    secs = np.array([[[1e-6 * p * p + 1e-6 * c * p for c in cached] for p in new]])  # quadratic in p
    tab = Table(Grid("attn_prefill", ("batch", "new_tokens", "cached_tokens"), (np.array([1.0]), new, cached), secs))
    assert tab.power == (False, True, False)
    assert tab.eval(1.0, 32.0, 0.0)[0] == pytest.approx(1e-6 * 32 * 32, rel=1e-12), "p^2 exact between grid points"
    assert tab.eval(1.0, 512.0, 0.0)[0] == pytest.approx(1e-6 * 512 * 512, rel=1e-12), "and beyond them"
    # along cached tokens a straight line at each new-token grid point
    assert tab.eval(1.0, 16.0, 50.0)[0] == pytest.approx(1e-6 * 256 + 1e-6 * 50 * 16, rel=1e-12)
    assert tab.point(1.0, 40.0, 30.0) == pytest.approx(tab.eval(1.0, 40.0, 30.0)[0], rel=1e-12)


# --- pricing rules --------------------------------------------------------------------------------
def test_decode_only_steps_pad_to_the_next_captured_graph_size(profile_path):
    cm = model(profile_path)
    prof = synthetic_profile()
    graph = dict(zip(GRAPH_SIZES, prof["components"]["linear"]["graph_seconds"]))
    assert cm.padded(17) == 24 and cm.padded(256) == 256 and cm.padded(257) is None
    lin = cm.linear(17, 17, True) - cm.cache_write.eval(np.array([17.0]))[0] - cm.sample.eval(np.array([17.0]))[0]
    assert lin == pytest.approx(graph[24], rel=1e-12), "a batch of 17 replays the graph captured for 24"
    eager = cm.linear(17, 17, False) - cm.cache_write.eval(np.array([17.0]))[0] - cm.sample.eval(np.array([17.0]))[0]
    assert eager == pytest.approx(float(cm.linear_eager.eval(np.array([17.0]))[0]), rel=1e-12)
    assert cm.overhead(True, 17) == prof["components"]["overhead"]["graph_s"]
    assert cm.overhead(True, 0) == prof["components"]["overhead"]["eager_s"], "a step with a prompt runs eager"
    assert cm.overhead(True, 300) == prof["components"]["overhead"]["eager_s"], "beyond the largest graph: eager"
    assert cm.overhead(False) == 0.0


def test_decode_step_table_prices_a_whole_graph_step(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(synthetic_profile(decode_step=True)))
    cm = model(path)
    ds = cm.decode_step.eval(np.array([32.0]), np.array([1000.0]))[0]
    lin = cm.linear(30, 30, True)
    att = cm.attn_decode(30 * 1000, 30, True)
    assert lin + att == pytest.approx(ds, rel=1e-12), "linear + attention = the whole step at the padded batch"
    assert cm.attn_decode(30 * 1000, 30, False) == pytest.approx(
        cm.decode.eval(np.array([30.0]), np.array([1000.0]))[0], rel=1e-12), "with a prompt: attention alone"


def test_the_longest_row_prices_an_uneven_graph_step(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(synthetic_profile(decode_step="longest")))
    cm = model(path)
    assert cm.prices_longest_row and not model(write_profile(tmp_path / "p.json", decode_step=True)).prices_longest_row
    lin = cm.linear(32, 32, True)
    even = cm.attn_decode(32 * 1000, 32, True, 1000)
    assert lin + even == pytest.approx(cm.decode_step.eval(32.0, 1000.0)[0], rel=1e-12), \
        "equal rows at a graph size: the table's slice of equal rows"
    uneven = cm.attn_decode(32 * 1000, 32, True, 3000)
    assert lin + uneven == pytest.approx(cm.decode_longest.eval(32.0, 1000.0, 3.0)[0], rel=1e-12)
    assert uneven > even, "the same tokens with a longer longest row cost more"
    # 30 rows replay the graph of 32: the mean counts the two padding rows as rows of no context
    assert cm.attn_decode(30 * 1000, 30, True, 1000) + cm.linear(30, 30, True) == pytest.approx(
        cm.decode_longest.eval(32.0, 30 * 1000 / 32, 32 / 30)[0], rel=1e-12)
    spans = cm.attn_decode(np.array([30 * 1000, 30 * 1001]), 30, True, np.array([1000, 1001]))
    assert spans.tolist() == [cm.attn_decode(30 * 1000, 30, True, 1000), cm.attn_decode(30 * 1001, 30, True, 1001)]
    cm.count_longest(np.array([32 * 100, 32 * 100, 32 * 1000]), 32, np.array([100, 900, 32 * 1000]))
    assert cm.step_outside == {"decode_step_longest.longest": 2}, "longest over the mean beyond the grid's 8"


def test_an_uneven_eager_batch_adds_the_longest_tables_extra_seconds_to_its_attention(tmp_path):
    """An eager step (a prompt beside the decodes) prices its decode attention at the mean context
    plus what decode_step_longest gives the same rows with that longest row beyond the same tokens
    spread evenly; an even batch is the attention alone, and the ratio beyond the grid is held at
    its edge and counted."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps(synthetic_profile(decode_step="longest")))
    cm = model(path)
    alone = cm.decode.eval(np.array([30.0]), np.array([1000.0]))[0]
    assert cm.attn_decode(30 * 1000, 30, False, 1000) == pytest.approx(alone, rel=1e-12), "even rows: attention alone"
    assert cm.attn_decode(30 * 1000, 30, False) == pytest.approx(alone, rel=1e-12), "no longest row given"
    extra = cm.decode_longest.eval(30.0, 1000.0, 3.0)[0] - cm.decode_longest.eval(30.0, 1000.0, 1.0)[0]
    assert extra > 0
    assert cm.attn_decode(30 * 1000, 30, False, 3000) == pytest.approx(alone + extra, rel=1e-9)
    top = cm.decode_longest.grids[2][-1]
    held = cm.attn_decode(30 * 1000, 30, False, int(1000 * top))
    assert cm.attn_decode(30 * 1000, 30, False, int(1000 * top * 2)) == pytest.approx(held, rel=1e-12)
    cm.count_longest(30 * 1000, 30, int(1000 * top), False)
    assert cm.step_outside == {}, "the mean over the step's own rows, not a graph's padded ones"
    cm.count_longest(30 * 1000, 30, int(1000 * top * 2), False)
    assert cm.step_outside == {"decode_step_longest.longest": 1}, "held at the grid's largest ratio, and counted"
    spans = cm.attn_decode(np.array([30 * 1000, 30 * 1001]), 30, False, np.array([3000, 3001]))
    assert spans.tolist() == [cm.attn_decode(30 * 1000, 30, False, 3000), cm.attn_decode(30 * 1001, 30, False, 3001)]
    rough = write_profile(tmp_path / "p.json", decode_step=True)
    assert model(rough).attn_decode(30 * 1000, 30, False, 3000) == pytest.approx(
        model(rough).attn_decode(30 * 1000, 30, False), rel=1e-12), "a profile without the table: the mean alone"


def test_an_eager_step_costs_the_median_of_the_profiles_measured_differences(tmp_path):
    prof = synthetic_profile()
    prof["components"]["overhead"].update(eager_s=0.0, eager_cases_s=[-3e-4, -1e-4, 2e-4, -2e-4])
    path = tmp_path / "o.json"
    path.write_text(json.dumps(prof))
    cm = model(path)
    assert cm.overhead(True, 0) == pytest.approx(-1.5e-4, rel=1e-12), "the parts over-count: a negative difference"
    assert cm.overhead(True, 17) == prof["components"]["overhead"]["graph_s"], "a graph step is measured whole"
    prof["components"]["overhead"]["eager_cases_s"] = [-1.0, -1.0]  # more than the cheapest eager step takes
    path.write_text(json.dumps(prof))
    with pytest.warns(ProfileWarning, match="components.overhead.eager_cases_s.*no time"):
        cm = model(path)
    assert cm.overhead(True, 0) == prof["components"]["overhead"]["eager_s"], "the floored figure instead"
    prof["components"]["overhead"]["eager_cases_s"] = ["x"]
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError, match="components.overhead.eager_cases_s"):
        load_profile(path)


def test_prefill_attention_prices_each_prompt_at_the_batch_that_lasts_as_long_as_the_step(profile_path):
    cm = model(profile_path)
    p, c = np.array([256.0, 1024.0]), np.array([0.0, 512.0])
    alone = cm.prefill.eval(1.0, p, c)
    batch = alone.sum() / alone  # the short prompt runs alongside the long one: a larger batch of its shape
    want = float(np.sum(cm.prefill.eval(batch, p, c) / batch))
    got = cm.attn_prefill(np.array([256, 1024]), np.array([0, 512]))
    assert got == pytest.approx(want, rel=1e-12)
    assert alone.max() <= got <= alone.sum(), "no faster than its longest prompt alone, no slower than all in turn"
    uniform = cm.attn_prefill(np.array([256, 256]), np.array([512, 512]))
    assert uniform == pytest.approx(cm.prefill.eval(2.0, 256.0, 512.0)[0], rel=1e-12), "a uniform batch reads its grid"
    near = cm.attn_prefill(np.array([1000, 1001]), np.array([0, 0]))
    assert near == pytest.approx(cm.prefill.eval(2.0, 1000.5, 0.0)[0], rel=1e-3), "near-equal prompts: near the grid"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), min_size=2, max_size=6))
def test_prefill_attention_of_a_batch_is_never_below_its_longest_prompt_alone(profile_path, prompts):
    """A chunk over a long prefix beside a short first chunk (chunked prefill's usual pair) must not
    be priced below the long chunk alone: the others' thread blocks cannot shorten its own."""
    cm = model(profile_path)
    p = np.array([n for n, _ in prompts], np.int64)
    c = np.array([k for _, k in prompts], np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = max(cm.attn_prefill(p[i:i + 1], c[i:i + 1]) for i in range(len(p)))
        got = cm.attn_prefill(p, c)
    assert got >= alone * (1 - 1e-12)


def test_swap_and_copy_blocks_are_converted_to_the_profiles_block_size(profile_path):
    cm16, cm32 = model(profile_path, block_size=16), model(profile_path, block_size=32)
    assert cm32.swap(4, 0) == pytest.approx(cm16.swap(8, 0), rel=1e-12)
    assert cm32.copy(2) == pytest.approx(cm16.copy(4), rel=1e-12)
    assert cm16.swap(3, 5) == pytest.approx(cm16.swap(3, 0) + cm16.swap(0, 5), rel=1e-12)


# --- extrapolation ------------------------------------------------------------------------------------
def test_steps_outside_the_grid_are_counted_per_component_and_warned_once(profile_path):
    cm = model(profile_path)
    cm.attn_prefill(np.array([8192]), np.array([0]))   # new_tokens beyond 4096
    cm.attn_prefill(np.array([100]), np.array([0]))    # inside
    steps = pd.DataFrame({
        "num_prefill_seqs": [1, 1, 0, 0, 0], "prefill_tokens": [8192, 100, 0, 0, 0],
        "num_decode_seqs": [0, 0, 4, 300, 2], "decode_ctx_tokens": [0, 0, 4 * 20000, 300 * 100, 2 * 50],
        "blocks_swapped_in": [0, 0, 0, 0, 2000], "blocks_swapped_out": [0, 0, 0, 0, 0], "blocks_copied": [0] * 5,
    })
    with pytest.warns(ProfileWarning, match="extrapolated") as rec:
        report = cm.report(steps)
    assert len(rec) == 1, "one warning at the end of the run"
    got = report["extrapolated_steps"]
    assert got["attn_prefill.new_tokens"] == 1
    assert got["attn_decode.context"] == 1, "mean context 20000 > 16384"
    assert got["attn_decode.batch"] == 1, "batch 300 > 256"
    assert got["sample.sequences"] == 1, "300 sequences sample beyond the grid's 256"
    assert got["swap_in.blocks"] == 1
    assert "linear.tokens" not in got and "linear.graph_tokens" not in got, "8192 tokens is the grid's last point"
    assert "cache_write.tokens" not in got
    assert sum(got.values()) == 5


def test_a_run_inside_the_grid_warns_nothing(profile_path):
    cm = model(profile_path)
    steps = pd.DataFrame({"num_prefill_seqs": [1], "prefill_tokens": [100], "num_decode_seqs": [3],
                          "decode_ctx_tokens": [300], "blocks_swapped_in": [0], "blocks_swapped_out": [0],
                          "blocks_copied": [0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cm.report(steps)["extrapolated_steps"] == {}


# --- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value, run", [("model", "llama-3-8b", "llama-2-7b"), ("gpu", "h200-141gb", "h100-80gb"),
                                             ("dtype", "bfloat16", "float16"), ("tensor_parallel", 2, 1)])
def test_a_profile_of_another_setup_is_refused_naming_both(tmp_path, key, value, run):
    prof = synthetic_profile()
    prof[key] = value
    path = tmp_path / "x.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError) as e:
        model(path)
    msg = str(e.value)
    assert repr(value) in msg and repr(run) in msg and str(path) in msg and "\n" not in msg


@pytest.mark.parametrize("mutate, where", [
    (lambda p: p.update(format="blocksim-profile/9"), "format"),
    (lambda p: p["components"].pop("attn_decode"), "components.attn_decode"),
    (lambda p: p["components"]["copy"].update(seconds=[1.0, 2.0]), "components.copy.seconds"),
    (lambda p: p["components"]["swap_in"]["grid"].update(blocks=[4, 1, 16, 64, 256, 1024]), "components.swap_in.grid"),
    (lambda p: p["components"]["sample"].update(seconds=[0.0, 1, 1, 1, 1]), "components.sample.seconds"),
    (lambda p: p["components"]["linear"].update(axes=["batch"]), "components.linear.axes"),
    (lambda p: p.pop("tensor_parallel"), "tensor_parallel"),
    (lambda p: p["components"].update(overhead={"eager_s": -1, "graph_s": 0}), "components.overhead.eager_s"),
])
def test_a_malformed_profile_is_refused_naming_the_field(tmp_path, mutate, where):
    prof = synthetic_profile()
    mutate(prof)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError) as e:
        load_cost_file(path)
    assert where in str(e.value) and str(path) in str(e.value)


def test_not_json_and_unknown_components(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_cost_file(bad)
    prof = synthetic_profile()
    prof["components"]["rotary"] = {"axes": ["tokens"]}
    with pytest.warns(ProfileWarning, match="rotary"):
        parse_profile(prof, "p.json")


def test_the_format_key_tells_profiles_from_roofline_parameters(tmp_path, profile_path):
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"params": {"scale_attn_decode": 1.2}}))
    assert isinstance(load_cost_file(params), cost_pkg.CostParams)
    cfg = build_config(cost_model="profiled")
    with pytest.raises(ConfigError, match="roofline parameters"):
        make_cost_model(cfg, str(params))
    roof = make_cost_model(build_config(cost_model="roofline"), str(profile_path))
    assert isinstance(roof, RooflineCostModel) and "fitted on" in roof.describe()["profile"]
    auto = make_cost_model(build_config(), str(profile_path))
    assert isinstance(auto, ProfiledCostModel)


def test_default_uses_a_shipped_profile_of_the_runs_setup_else_the_roofline(tmp_path, monkeypatch):
    monkeypatch.setattr("blocksim.cost.profile_file.PROFILES_DIR", tmp_path)
    cfg = build_config()
    assert isinstance(make_cost_model(cfg), RooflineCostModel), "nothing shipped: the roofline"
    with pytest.raises(ConfigError, match="no shipped profile"):
        make_cost_model(build_config(cost_model="profiled"))
    write_profile(tmp_path / profile_name("llama-2-7b", "h100-80gb", "float16", 1))
    assert isinstance(make_cost_model(cfg), ProfiledCostModel)
    assert isinstance(make_cost_model(build_config(gpu="h200-141gb")), RooflineCostModel), "another GPU: roofline"
    res = Engine(cfg, pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [20], "output_tokens": [3]})).run()
    assert res.summary["cost_model"]["name"] == "profiled"
    name = profile_name("llama-2-7b", "h100-80gb", "float16", 1)
    assert res.summary["cost_model"]["profile"] == f"blocksim/profiles/{name}", "a shipped profile, named portably"
    assert load_profile(f"blocksim/profiles/{name}").model == "llama-2-7b", "and found again by that name"


# --- spans --------------------------------------------------------------------------------------------
requests = st.integers(1, 20).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=k, max_size=k),
    st.lists(st.integers(1, 300), min_size=k, max_size=k),
    st.lists(st.integers(1, 80), min_size=k, max_size=k),
    st.lists(st.sampled_from([1, 1, 2]), min_size=k, max_size=k),
))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=requests, blocks=st.integers(8, 80), block_size=st.sampled_from([8, 16, 32]),
       preset=st.sampled_from(["vllm", "vllm-prefix", "vllm-chunked", "orca-pow2"]),
       decode_step=st.sampled_from([False, True, "longest"]), max_seqs=st.sampled_from([4, 20]),
       mode=st.sampled_from(["auto", "recompute", "swap"]), tp=st.sampled_from([1, 2]), allreduce=st.booleans(),
       shared=st.sampled_from([None, 0.9]), padded=st.sampled_from([None, 0.95]), small_graphs=st.booleans())
def test_spans_price_steps_exactly_as_stepping_one_by_one(tmp_path_factory, lists, blocks, block_size, preset,
                                                         decode_step, max_seqs, mode, tp, allreduce, shared, padded,
                                                         small_graphs):
    """`small_graphs`: graphs of at most 4 rows, so that decode-only steps of more rows run eagerly
    (priced by their longest row too, in spans as one by one)."""
    arrivals, prompts, outputs, ns = lists
    trace = pd.DataFrame({"arrival_s": np.cumsum(arrivals), "prompt_tokens": prompts, "output_tokens": outputs,
                          "n": ns})
    path = tmp_path_factory.mktemp("prof") / "p.json"
    prof = synthetic_profile(decode_step=decode_step, tensor_parallel=tp, allreduce=allreduce,
                             shared=shared if decode_step == "longest" else None,
                             padded=padded if decode_step == "longest" else None)
    if small_graphs:
        prof["cuda_graph_batch_sizes"] = [1, 2, 4]
    path.write_text(json.dumps(prof))
    knobs = {} if preset == "orca-pow2" else {"watermark": 0.0, "preemption": mode}
    cfg = build_config(preset, num_gpu_blocks=blocks, block_size=block_size, max_num_seqs=max_seqs,
                       cost_model="profiled", tensor_parallel=tp, **knobs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        a = Engine(cfg, trace, make_cost_model(cfg, str(path)), spans=True).run()
        b = Engine(cfg, trace, make_cost_model(cfg, str(path)), spans=False).run()
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert a.summary["cost_model"] == b.summary["cost_model"], "the same steps counted outside the grid"


@settings(max_examples=60, deadline=None)
@given(b=st.floats(0.5, 20), p=st.floats(1, 20000), c=st.floats(0, 20000))
def test_the_one_point_path_agrees_with_the_vectorized_one(b, p, c):
    tab = Table(load_profile_dict(synthetic_profile()).tables["attn_prefill"])
    assert tab.point(b, p, c) == pytest.approx(float(tab.eval(b, p, c)[0]), rel=1e-12)


def load_profile_dict(d):
    return parse_profile(d, "synthetic.json")


def test_the_leave_one_out_check_is_exact_for_the_shapes_each_rule_follows(tmp_path):
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "interpolation_check", Path(__file__).resolve().parents[2] / "benchmarks" / "interpolation_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = np.array([16.0, 64.0, 256.0, 1024.0])
    line = mod.leave_one_out(x, np.stack([3e-4 + 2e-6 * x, 5e-4 + 1e-6 * x], axis=1), 0)
    assert line["straight_line"] == pytest.approx(0.0, abs=1e-12) and line["power_law"] > 0.01
    square = mod.leave_one_out(x, 1e-9 * x ** 2, 0)
    assert square["power_law"] == pytest.approx(0.0, abs=1e-12) and square["straight_line"] > 0.1
    cached = np.array([0.0, 512.0, 2048.0])   # seconds linear in the work p (c + p / 2): the work rule is exact
    work = 2e-4 + 1e-11 * x[None, :, None] * (cached[None, None, :] + x[None, :, None] / 2)
    assert mod.work_leave_one_out(x, cached, np.repeat(work, 2, axis=0)) == pytest.approx(0.0, abs=1e-12)
    path = write_profile(tmp_path / "p.json", decode_step=True)
    rows = {(r["table"], r["axis"]): r for r in mod.check(path)["rows"]}
    assert ("decode_step", "context") in rows and "work" in rows[("attn_prefill", "new_tokens")]


@settings(max_examples=40, deadline=None)
@given(x=st.lists(st.floats(0.5, 20000), min_size=1, max_size=6), y=st.floats(0.5, 12), one=st.booleans())
def test_the_plane_gives_the_tables_bilinear_values_inside_and_beyond_the_grid(x, y, one):
    from blocksim.cost.interpolate import Plane
    from blocksim.cost.profile_file import Grid
    gx, gy = np.array([16.0, 64.0, 256.0, 1024.0, 4096.0]), (np.array([2.0]) if one else np.array([1.0, 2.0, 3.0, 8.0]))
    secs = 1e-3 + 1e-7 * gx[:, None] * (1 + 0.3 * np.log(gy)[None, :]) + 1e-5 * np.sqrt(gy)[None, :]
    tab = Table(Grid("decode_step_longest", ("context", "longest"), (gx, gy), secs))
    xs = np.asarray(x)
    ys = np.full(len(xs), y)
    plane = Plane("p", gx, gy, secs)
    np.testing.assert_allclose(plane.eval(xs, ys), tab.eval(xs, ys), rtol=1e-9)
    assert [plane.point(float(a), y) for a in xs] == plane.eval(xs, ys).tolist(), "one point: the same bits"


def test_static_batching_prices_its_padding_rows_in_the_longest_row(tmp_path):
    """A request that finished keeps being computed as padding under static batching: its context
    counts in the step's longest row as in its total."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps(synthetic_profile(decode_step="longest")))
    trace = pd.DataFrame({"arrival_s": [0.0, 0.0], "prompt_tokens": [3000, 100], "output_tokens": [5, 200], "n": [1, 1]})
    cfg = build_config("static", cost_model="profiled")
    cm = make_cost_model(cfg, str(path))
    seen = []
    priced = cm.attn_decode

    def spy(ctx, batch=0, decode_only=False, longest=None):
        seen.append((ctx, batch, longest))
        return priced(ctx, batch, decode_only, longest)
    cm.attn_decode = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        Engine(cfg, trace, cm, spans=False).run()
    padded = [(c, b, top) for c, b, top in seen if top is not None and b == 2 and c > 3000 + 100]
    assert padded, "steps where the finished long request is computed as padding"
    assert all(top >= 3000 for _, _, top in padded), "the padding row is the longest"


# --- rows that share blocks (the prompt of a request's samples) -----------------------------------
def test_rows_sharing_blocks_scale_a_graph_step_by_the_measured_pairs(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(synthetic_profile(decode_step="longest", shared=0.9)))
    cm = model(path)
    plain = model(write_profile(tmp_path / "l.json", decode_step="longest"))
    assert cm.prices_shared_rows and not plain.prices_shared_rows
    lin = cm.linear(32, 32, True)
    whole = lin + cm.attn_decode(32 * 1000, 32, True, 1000)
    assert cm.attn_decode(32 * 1000, 32, True, 1000, shared=0) == cm.attn_decode(32 * 1000, 32, True, 1000)
    # the table's pairs share 0.45 of the tokens: there the step lasts 0.9 of its own-blocks twin
    assert lin + cm.attn_decode(32 * 1000, 32, True, 1000, shared=int(0.45 * 32 * 1000)) == pytest.approx(
        0.9 * whole, rel=1e-9)
    half = lin + cm.attn_decode(32 * 1000, 32, True, 1000, shared=int(0.225 * 32 * 1000))
    assert half == pytest.approx(0.95 * whole, rel=1e-9), "linear in the shared fraction"
    beyond = lin + cm.attn_decode(32 * 1000, 32, True, 1000, shared=16 * 1000)
    assert beyond == pytest.approx(0.9 * whole, rel=1e-9), "no further than the measured pairs"
    # a span prices each step as one step alone would
    span = cm.attn_decode(np.array([32 * 1000, 32 * 1001]), 32, True, np.array([1000, 1001]), shared=7000)
    assert span.tolist() == [cm.attn_decode(32 * 1000, 32, True, 1000, shared=7000),
                             cm.attn_decode(32 * 1001, 32, True, 1001, shared=7000)]
    assert cm.attn_decode(32 * 1000, 32, False, 1000, shared=7000) == cm.attn_decode(32 * 1000, 32, False, 1000), \
        "an eager step is priced without the shared blocks"


@pytest.mark.parametrize("table, edit, match", [
    ("decode_step_shared", lambda t: t.update(shared_fraction=[[0.6] * len(r) for r in t["shared_fraction"]]),
     "in \\(0, 0.5\\]"),
    ("decode_step_shared", lambda t: t.pop("own_seconds"), "missing own_seconds"),
    ("decode_step_padded", lambda t: t["grid"].update(real=[0.5, 1.0]), "fractions of real rows in \\(0, 1\\)"),
    ("decode_step_padded", lambda t: t.pop("spread_seconds"), "missing spread_seconds")])
def test_a_bad_graph_step_table_is_refused_naming_its_field(tmp_path, table, edit, match):
    prof = synthetic_profile(decode_step="longest", shared=0.9, padded=0.95)
    edit(prof["components"][table])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError, match=f"{table}.*{match}"):
        load_profile(path)


def test_samples_sharing_a_prompt_run_shorter_graph_steps_and_single_samples_do_not_change(tmp_path):
    shared, plain = tmp_path / "s.json", tmp_path / "l.json"
    shared.write_text(json.dumps(synthetic_profile(decode_step="longest", shared=0.9)))
    plain.write_text(json.dumps(synthetic_profile(decode_step="longest")))
    cfg = build_config("vllm", cost_model="profiled", preemption="swap")
    rng = np.random.default_rng(3)
    one = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 2, 24)), "prompt_tokens": rng.integers(64, 2000, 24),
                        "output_tokens": rng.integers(8, 120, 24), "n": 1})
    two = one.assign(n=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        runs = {(name, n): Engine(cfg, trace, make_cost_model(cfg, str(path))).run()
                for name, path in (("shared", shared), ("plain", plain)) for n, trace in (("one", one), ("two", two))
}
        stepped = Engine(cfg, two, make_cost_model(cfg, str(shared)), spans=False).run()
    pd.testing.assert_frame_equal(runs["shared", "one"].steps, runs["plain", "one"].steps)
    a, b = runs["shared", "two"].steps, runs["plain", "two"].steps
    assert a.t_attn_decode_s.sum() < b.t_attn_decode_s.sum(), "the samples' shared prompt read for less"
    pd.testing.assert_frame_equal(stepped.steps, a)  # spans price as single steps do


def test_sharing_saves_an_uneven_step_what_it_saves_the_step_of_equal_rows(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(synthetic_profile(decode_step="longest", shared=0.9)))
    cm = model(path)
    shared = int(0.225 * 32 * 1000)
    saved_equal = cm.attn_decode(32 * 1000, 32, True, 1000) - cm.attn_decode(32 * 1000, 32, True, 1000, shared=shared)
    saved_uneven = cm.attn_decode(32 * 1000, 32, True, 4000) - cm.attn_decode(32 * 1000, 32, True, 4000,
                                                                             shared=shared)
    assert saved_equal > 0 and saved_uneven == pytest.approx(saved_equal, rel=1e-9)


# --- padding rows of a graph step -------------------------------------------------------------------
def test_padding_rows_scale_a_graph_step_by_the_measured_ratio_to_its_spread_twin(tmp_path):
    cm = model(write_profile(tmp_path / "p.json", decode_step="longest", padded=0.95))
    plain = model(write_profile(tmp_path / "l.json", decode_step="longest"))
    assert cm.prices_padding and not plain.prices_padding

    def whole(m, batch, ctx, longest):
        return m.linear(batch, batch, True) + m.attn_decode(ctx, batch, True, longest)
    # 12 and 9 real rows of a 16-row graph (fractions 0.75 and 0.5625, on and inside the grid)
    for batch in (12, 9):
        assert whole(cm, batch, 16 * 500, 1000) == pytest.approx(0.95 * whole(plain, batch, 16 * 500, 1000), rel=1e-9)
    # 28 of 32 rows (0.875): halfway from the grid's last fraction to a full batch
    assert whole(cm, 28, 32 * 500, 900) == pytest.approx(0.975 * whole(plain, 28, 32 * 500, 900), rel=1e-9)
    assert whole(cm, 32, 32 * 500, 900) == whole(plain, 32, 32 * 500, 900), "a full batch has no padding rows"
    # a context beyond the grid's last holds the ratio there, and the step is counted
    assert whole(cm, 12, 16 * 3000, 4000) == pytest.approx(0.95 * whole(plain, 12, 16 * 3000, 4000), rel=1e-9)
    steps = {"num_prefill_seqs": np.zeros(3, np.int64), "prefill_tokens": np.zeros(3, np.int64),
             "num_decode_seqs": np.array([12, 12, 16]), "decode_ctx_tokens": np.array([16 * 500, 16 * 3000, 16 * 3000]),
             "blocks_swapped_in": np.zeros(3, np.int64), "blocks_swapped_out": np.zeros(3, np.int64),
             "blocks_copied": np.zeros(3, np.int64)}
    assert cm.extrapolated(steps)["decode_step_padded.context"] == 1, "the padded step beyond the grid only"
    # a span prices each step as one step alone would; an eager step is not a graph's
    span = cm.attn_decode(np.array([16 * 500, 16 * 501]), 12, True, np.array([1000, 1001]))
    assert span.tolist() == [cm.attn_decode(16 * 500, 12, True, 1000), cm.attn_decode(16 * 501, 12, True, 1001)]
    assert cm.attn_decode(16 * 500, 12, False, 1000) == plain.attn_decode(16 * 500, 12, False, 1000)


def test_the_padded_ratio_is_read_from_its_own_cell_and_held_at_the_grids_edges(tmp_path):
    prof = synthetic_profile(decode_step="longest", padded=1.0)
    tab = prof["components"]["decode_step_padded"]
    sizes, real, ctx = tab["grid"]["batch"], tab["grid"]["real"], tab["grid"]["context"]

    def ratio(i, j, k):  # a different ratio in every cell
        return 0.9 + 0.01 * i + 0.03 * j + 0.002 * k
    tab["seconds"] = [[[ratio(i, j, k) * tab["spread_seconds"][i][j][k] for k in range(len(ctx))]
                       for j in range(len(real))] for i in range(len(sizes))]
    (tmp_path / "v.json").write_text(json.dumps(prof))
    cm = model(tmp_path / "v.json")
    plain = model(write_profile(tmp_path / "l.json", decode_step="longest"))

    for i, b in enumerate(sizes):
        for j, f in enumerate(real):
            for k, c in enumerate(ctx):
                assert cm._padding_factor(int(f * b), b, float(c)) == pytest.approx(ratio(i, j, k), rel=1e-12)
    # beyond the grid's contexts: the last context's ratio; between batches (24 rows, between 16
    # and 32), the ratio interpolated along the batch; above the grid's fractions, toward 1
    i = sizes.index(16)
    assert cm._padding_factor(12, 16, 5000.0) == pytest.approx(ratio(i, 1, len(ctx) - 1), rel=1e-12)
    assert cm._padding_factor(18, 24, 256.0) == pytest.approx(0.5 * (ratio(i, 1, 2) + ratio(i + 1, 1, 2)), rel=1e-12)
    assert cm._padding_factor(14, 16, 256.0) == pytest.approx(0.5 * (ratio(i, 1, 2) + 1.0), rel=1e-12)
    # and a whole graph step is its spread price times the factor
    rest = cm.linear(12, 12, True)
    whole, spread = (rest + m.attn_decode(16 * 1024, 12, True, 1400) for m in (cm, plain))
    assert whole == pytest.approx(spread * cm._padding_factor(12, 16, 1024.0), rel=1e-9)


def test_a_padded_table_without_the_longest_row_table_is_named_and_left_unread(tmp_path):
    prof = synthetic_profile(decode_step="longest", padded=0.95)
    del prof["components"]["decode_step_longest"]
    (tmp_path / "p.json").write_text(json.dumps(prof))
    with pytest.warns(ProfileWarning, match="decode_step_padded read only beside decode_step_longest"):
        cm = model(tmp_path / "p.json")
    assert not cm.prices_padding and cm.describe()["graph_step_tables"] == ["decode_step"]
    full = model(write_profile(tmp_path / "f.json", decode_step="longest", shared=0.9, padded=0.95))
    assert full.describe()["graph_step_tables"] == ["decode_step_longest", "decode_step_shared", "decode_step_padded"]
