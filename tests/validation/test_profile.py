"""validation.profile: `blocksim profile` on the CPU with a tiny model and a tiny grid writes a
"blocksim-profile/1" file that the profiled cost model's loader reads."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from blocksim.cli import main  # noqa: E402
from validation import profile  # noqa: E402
import numpy as np  # noqa: E402
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TINY = """models:
  tiny: {num_layers: 2, hidden_size: 256, num_heads: 4, num_kv_heads: 2, head_size: 64, num_params: 1.0e6,
         max_model_len: 256, intermediate_size: 256, vocab_size: 512}
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("profile")
    (d / "tiny.yaml").write_text(TINY)
    out = d / "tiny.json"
    rc = main(["profile", "--model", "tiny", "--catalog", str(d / "tiny.yaml"), "--device", "cpu", "--quick",
               "--gpu-name", "h200-141gb", "--out", str(out), "--quiet"])
    assert rc == 0
    return json.loads(out.read_text()), out


def test_profile_has_every_component_on_its_grid(written):
    prof, _ = written
    assert prof["format"] == "blocksim-profile/1" and prof["model"] == "tiny" and prof["gpu"] == "h200-141gb"
    comps = prof["components"]
    for name in ("linear", "attn_prefill", "attn_decode", "cache_write", "sample", "swap_out", "swap_in", "copy"):
        table = comps[name]
        shape = tuple(len(table["grid"][axis]) for axis in table["axes"])
        import numpy as np
        secs = np.asarray(table["seconds"])
        assert secs.shape == shape and (secs > 0).all(), name
    assert comps["overhead"]["eager_s"] >= 0 and comps["overhead"]["graph_s"] == 0.0
    assert prof["command"].startswith("blocksim profile")
    # what each table took to measure: every table measured is named once, in seconds
    named = [n.strip() for key in prof["measure_s"] for n in key.split(",")]
    assert sorted(named) == sorted(comps) and all(v >= 0 for v in prof["measure_s"].values())


def test_profile_reads_back_through_the_cost_models_loader(written):
    load = pytest.importorskip("blocksim.cost.profile_file").load_profile
    _, path = written
    p = load(path)
    assert p.model == "tiny" and set(p.tables) >= {"linear", "attn_prefill", "attn_decode"}


def test_unknown_device_is_refused_with_the_known_ones():
    assert profile.catalog_gpu("NVIDIA H200") == "h200-141gb"
    assert profile.catalog_gpu("NVIDIA H100 80GB HBM3") == "h100-80gb"
    assert profile.catalog_gpu("Some Other GPU") is None


def test_a_tensor_parallel_profile_adds_the_allreduce_table_by_message_bytes(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "tp2.json"
    assert main(["profile", "--model", "tiny", "--catalog", str(tmp_path / "tiny.yaml"), "--device", "cpu", "--quick",
                 "--gpu-name", "h200-141gb", "--tensor-parallel", "2", "--out", str(out), "--quiet"]) == 0
    prof = json.loads(out.read_text())
    table = prof["components"]["allreduce"]
    assert prof["tensor_parallel"] == 2 and table["axes"] == ["bytes"]
    assert len(table["seconds"]) == len(table["grid"]["bytes"]) and min(table["seconds"]) > 0
    load = pytest.importorskip("blocksim.cost.profile_file").load_profile
    assert "allreduce" in load(out).tables


def test_a_tensor_parallel_degree_that_does_not_divide_the_heads_is_refused(capsys):
    assert main(["profile", "--model", "llama-2-7b", "--tensor-parallel", "3", "--device", "cpu",
                 "--gpu-name", "h200-141gb"]) == 2
    assert "must divide by tensor_parallel 3" in capsys.readouterr().err


@pytest.mark.parametrize("batch,context,longest,max_len", [
    (1, 100, 8.0, 4096), (8, 100, 1.0, 4096), (8, 100, 3.0, 4096), (8, 1000, 8.0, 4096), (5, 33, 1.5, 4096),
    (2, 4096, 2.0, 4096), (4, 10, 5.0, 4096)])
def test_uneven_contexts_keep_the_total_and_put_the_longest_row_first(batch, context, longest, max_len):
    rows = profile.uneven_contexts(batch, context, longest, max_len)
    assert len(rows) == batch and sum(rows) == batch * context, "the same tokens in all"
    assert rows[0] == max(rows) and min(rows) >= 1 and max(rows) <= max_len
    assert max(rows[1:], default=0) - min(rows[1:], default=0) <= 1, "the other rows share the rest evenly"
    want = min(round(longest * context), max_len, batch * context - (batch - 1)) if batch > 1 else context
    assert rows[0] == max(context, want), "the longest row the point asks for, or the longest it can hold"


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 256), context=st.integers(1, 8192), longest=st.sampled_from(profile.LONGEST),
       max_len=st.sampled_from([4096, 8192, 32768]))
def test_spread_contexts_keep_the_total_and_fall_from_the_longest_row(batch, context, longest, max_len):
    assume(context <= max_len)
    rows = profile.spread_contexts(batch, context, longest, max_len)
    assert len(rows) == batch and sum(rows) == batch * context, "the same tokens in all"
    assert rows[0] == max(rows) and min(rows) >= 1 and max(rows) <= max_len
    want = min(round(longest * context), max_len, batch * context - (batch - 1)) if batch > 1 else context
    assert rows[0] == max(context, want), "the longest row the point asks for, or the longest it can hold"
    steps = np.diff(rows[1:])
    assert (steps <= 1).all(), "the other rows fall from the longest (one token of rounding at most)"
    if batch > 2 and longest > 1 and rows[-1] > 1:
        assert np.ptp(np.diff(rows)[1:]) <= 2, "in equal steps, down to the floor of one token"


@pytest.mark.parametrize("batch, real, context", [(16, 0.5, 100), (16, 0.75, 7), (4, 0.75, 2048), (24, 0.75, 33)])
def test_padded_rows_hold_the_batchs_tokens_on_the_fraction_of_real_rows(batch, real, context):
    rows = profile.padded_rows(batch, real, context)
    assert len(rows) == round(real * batch) and sum(rows) == batch * context, "the same tokens as the spread twin"
    assert max(rows) - min(rows) <= 1, "equal rows, but for a token of rounding"
    top = profile.spread_contexts(batch, context, max(rows) / context, 1 << 20)
    assert top[0] == max(rows) and sum(top) == batch * context, "its twin's longest row as long as a real row"


def test_a_capped_cell_carries_the_line_through_the_two_longest_rows_measured():
    assert profile.capped_cell([(1.0, 5.0), (2.0, 6.0), (3.0, 7.0)], 5.0) == pytest.approx(9.0)
    assert profile.capped_cell([(1.0, 5.0)], 8.0) == 5.0, "one reachable ratio: its own seconds"
    assert profile.capped_cell([(1.0, 6.0), (2.0, 5.0)], 3.0) == 5.0, "a falling line is not carried"


def test_paired_rows_read_their_first_rows_blocks_but_the_last(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    from blocksim.catalog import Catalog
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cpu", quick=True,
                         progress=False)
    plain = p.batch(decodes=[40, 40, 33, 33, 16])
    pairs, shared = profile.paired(plain, p.bs)
    t = pairs.decode_tables
    for first, second in ((0, 1), (2, 3)):
        assert (t[second][:-1] == t[first][:-1]).all() and t[second][-1] == plain.decode_tables[second][-1]
        pos = int(pairs.positions[second])
        assert pairs.slots[second] == t[second][pos // p.bs] * p.bs + pos % p.bs, "the new token in its own block"
    assert (t[4] == plain.decode_tables[4]).all(), "an odd row out keeps its blocks"
    assert shared == 2 * p.bs + 2 * p.bs, "the second rows' tokens in shared blocks (40 and 33 tokens: 2 full blocks)"
    assert (pairs.slots[[0, 2, 4]] == plain.slots[[0, 2, 4]]).all()


def test_a_step_beyond_the_cache_reads_each_later_pass_in_a_shuffled_order(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    from blocksim.catalog import Catalog
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cpu", quick=True,
                         progress=False, cache_bytes=1)
    n, per_row = p.num_blocks, 256 // p.bs
    fits = p.batch(decodes=[256] * (n // per_row)).decode_tables
    assert (np.concatenate(fits) == np.arange(n)).all(), "a step the cache holds reads its blocks in order"
    rows = n // per_row * 3 + 1
    tables = p.batch(decodes=[256] * rows).decode_tables
    flat = np.concatenate(tables)
    assert (flat[:n] == np.arange(n)).all()
    for k in (1, 2):
        later = flat[k * n:(k + 1) * n]
        assert sorted(later) == list(range(n)) and (later != np.arange(n)).any(), f"pass {k}: every block once"
    assert not (flat[n:2 * n] == flat[2 * n:3 * n]).all(), "each pass in an order of its own"
    wrap = n // per_row  # rows a cache's length apart: in order on every pass, they would read one block at once
    same = sum(int((tables[i] == tables[i - wrap]).sum()) for i in range(wrap, rows))
    assert same <= 0.1 * per_row * (rows - wrap), "rows a cache's length apart seldom meet at one position"
    prefix = p._prefix_tables(n // per_row + 2, 256)
    assert (np.concatenate(prefix)[:n] == np.arange(n)).all()
    assert (np.concatenate(prefix)[n:] == p._orders[1][:2 * per_row]).all()


def test_a_whole_profile_names_the_cache_it_was_measured_on(written):
    prof, _ = written
    assert isinstance(prof["cache_blocks"], int) and prof["cache_blocks"] >= 64


@pytest.mark.parametrize("tables", [["attn_decode"], ["decode_step"], ["decode_step_shared"], ["decode_step_padded"],
                                    ["decode_step", "decode_step_padded"]])
def test_adding_a_table_needs_a_profile_and_a_gpu(written, tmp_path, capsys, tables):
    _, path = written
    before = path.read_text()
    args = ["profile", "--model", "tiny", "--catalog", str(path.parent / "tiny.yaml"), "--device", "cpu", "--quiet",
            *[a for t in tables for a in ("--add-table", t)]]
    assert main(args) == 2 and "--out" in capsys.readouterr().err
    assert main([*args, "--out", str(path)]) == 2 and "on a GPU only" in capsys.readouterr().err
    assert path.read_text() == before, "the profile is left as it was"
    assert main([*args, "--out", str(tmp_path / "none.json")]) == 2 and "cannot read" in capsys.readouterr().err
    other = [*args, "--out", str(path)]
    other[other.index("tiny")] = "llama-2-7b"
    assert main(other) == 2 and "is a profile of 'tiny', --model names 'llama-2-7b'" in capsys.readouterr().err
    assert path.read_text() == before


def test_adding_a_table_to_an_incomplete_profile_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "blocksim-profile/1", "components": {}}')
    assert main(["profile", "--model", "llama-2-7b", "--add-table", "decode_step", "--out", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "lacks model, device, dtype, block_size, cuda_graph_batch_sizes" in err


def test_only_the_addable_tables_can_be_added(written):
    _, path = written
    with pytest.raises(profile.ProfileError, match="attn_prefill cannot be added"):
        profile.add_table(path, ["decode_step", "attn_prefill"], device="cpu")


def test_an_interrupted_write_leaves_the_profile_as_it_was(written, tmp_path, monkeypatch):
    out = tmp_path / "p.json"
    out.write_text('{"before": true}\n')

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(out), "replace", interrupted)  # after the new text is written beside it
    with pytest.raises(KeyboardInterrupt):
        profile._write_whole(out, written[0])
    assert out.read_text() == '{"before": true}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_a_profile_its_loader_would_refuse_is_kept_aside_and_named_not_put_in_place(written, tmp_path):
    out = tmp_path / "p.json"
    out.write_text('{"before": true}\n')
    bad = json.loads(json.dumps(written[0]))
    bad["components"]["attn_decode"]["seconds"][0][0] = 0.0
    with pytest.raises(profile.ProfileError, match=r"components\.attn_decode.*> 0 seconds.*p\.json\.rejected"):
        profile._write_whole(out, bad)
    assert out.read_text() == '{"before": true}\n'
    assert json.loads((tmp_path / "p.json.rejected").read_text()) == bad, "the measurements are kept"


@pytest.mark.gpu
@pytest.mark.parametrize("table", ["decode_step_shared", "decode_step_padded"])
def test_graph_step_tables_measure_on_a_gpu_whole_and_load(tmp_path, table):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from blocksim.catalog import Catalog
    from blocksim.cost.profile_file import COMPONENT_AXES, _table
    (tmp_path / "tiny.yaml").write_text(TINY)
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cuda", quick=True,
                         progress=False)
    t = getattr(p, table)()
    grid = _table("gpu", table, t, COMPONENT_AXES[table])
    twin = np.asarray(t["own_seconds" if table == "decode_step_shared" else "spread_seconds"])
    assert twin.shape == grid.seconds.shape and (twin > 0).all() and (grid.seconds > 0).all()
    if table == "decode_step_shared":  # every context spans a shared block
        assert (np.asarray(t["shared_fraction"]) > 0).all()


@pytest.mark.gpu
def test_added_tables_replace_the_profiles_own_and_name_their_lease(tmp_path):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "tiny.json"
    base = ["profile", "--model", "tiny", "--catalog", str(tmp_path / "tiny.yaml"), "--quick", "--quiet",
            "--gpu-name", "h100-80gb", "--out", str(out)]
    assert main(base) == 0
    before = json.loads(out.read_text())
    assert main([*base, "--add-table", "attn_decode", "--add-table", "decode_step"]) == 0
    after = json.loads(out.read_text())
    for key in ("attn_decode", "decode_step", "decode_step_longest"):
        m = after["components"][key]["measured"]
        # the cache its own lease had room for, which free memory bounds for a tiny model (on an H100,
        # 1,838,347 blocks here against the profile's 1,848,587, the process holding the first run's)
        assert isinstance(m["cache_blocks"], int) and m["cache_blocks"] >= 64 and m["device"] == before["device"], key
        assert np.shape(after["components"][key]["seconds"]) == np.shape(before["components"][key]["seconds"])
    assert after["components"]["linear"] == before["components"]["linear"], "the other tables are left as they were"
    from blocksim.cost.profile_file import load_profile
    assert {"attn_decode", "decode_step_longest"} <= set(load_profile(out).tables)


@pytest.mark.parametrize("table", ["decode_step_padded", "decode_step_shared"])
def test_twin_tables_time_each_cell_in_pairs_of_alternating_order(tmp_path, monkeypatch, table):
    """The padded and shared tables' loops (a GPU's), the runner and clock stood in for: each cell
    loads its step and its twin in pairs whose order alternates and keeps each one's median."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    from blocksim.catalog import Catalog
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cpu", quick=True,
                         progress=False)
    p.cuda, p.graph_sizes = True, [1, 2, 4]
    p.grid = {**p.grid, "PADDED_PAIRS": 3, "SHARED_PAIRS": 3, "SHARED_CONTEXT": (16, 64)}  # 1 and 4 blocks
    loaded = []
    first_kind = "padded" if table == "decode_step_padded" else "own"

    class Runner:
        def capture_decode_graphs(self, b):
            pass

        def load_decode(self, step, b):
            if table == "decode_step_padded":
                kind = "twin" if len(step.decode_context) == b else "padded"
            else:  # the paired step's second row reads its first row's first block
                kind = "paired" if (step.decode_tables[1][0] == step.decode_tables[0][0]) else "own"
            loaded.append((kind, len(loaded)))

    p.runner = Runner()
    monkeypatch.setattr(profile, "_graph", lambda runner, b, parts=None: None)
    monkeypatch.setattr(p.clock, "median", lambda fn: float(loaded[-1][1]) + (0 if loaded[-1][0] == first_kind else 100))
    t = getattr(p, table)()
    cells = int(np.prod([len(v) for v in t["grid"].values()]))
    assert t["pairs"] == 3 and len(loaded) == 6 * cells
    other = "twin" if table == "decode_step_padded" else "paired"
    assert [k for k, _ in loaded[:6]] == [first_kind, other, other, first_kind, first_kind, other], "order alternates"
    mine, twin = (t["seconds"], t["spread_seconds"]) if table == "decode_step_padded" else (t["own_seconds"], t["seconds"])
    assert np.ravel(mine)[0] == 3.0 and np.ravel(twin)[0] == 102.0, "each one's median"
    if table == "decode_step_shared":  # a row of one block shares nothing: that context is left out
        assert t["grid"]["context"] == [64] and (np.asarray(t["shared_fraction"]) > 0).all()


def test_a_table_measured_again_says_how_far_it_moved():
    grid = {"batch": [1, 2], "context": [16, 64]}
    before = {"axes": ["batch", "context"], "grid": grid, "seconds": [[1.0, 2.0], [4.0, 8.0]]}
    after = {**before, "seconds": [[1.1, 2.2], [4.4, 8.0]]}
    text = profile.table_change(before, after)
    assert "median 1.100" in text and "1.030-1.100" in text and "over 4 cells" in text
    assert profile.table_change(None, after) is None
    assert "grid differs" in profile.table_change({**before, "grid": {"batch": [1], "context": [16]}}, after)
    # cells without a finite, positive old time (or a finite new one) are left out, not the table
    holes = {**before, "seconds": [[0.0, 2.0], [float("nan"), 8.0]]}
    assert "median 1.050" in profile.table_change(holes, after) and "over 2 cells" in profile.table_change(holes, after)
    assert profile.table_change({**before, "seconds": [[0.0, 0.0], [0.0, 0.0]]}, after) is None
    empty = {"axes": ["tokens"], "grid": {"tokens": []}, "seconds": []}
    assert profile.table_change(empty, empty) is None
    assert profile.table_change({"eager_s": 0.0}, {"eager_s": 0.1}) is None, "not a table"


def test_profile_over_an_existing_one_prints_each_tables_change_unless_quiet(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "tiny.json"
    args = ["profile", "--model", "tiny", "--catalog", str(tmp_path / "tiny.yaml"), "--device", "cpu", "--quick",
            "--gpu-name", "h200-141gb", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    capsys.readouterr()
    assert main([*args, "--quiet"]) == 0 and "replaces" not in capsys.readouterr().err
    assert main(args) == 0
    assert "profile tiny: linear against the profile it replaces: after / before, by cell: median" \
        in capsys.readouterr().err


def test_a_profile_written_over_another_of_its_model_says_how_each_table_moved(written, tmp_path):
    prof, path = written
    again = json.loads(json.dumps(prof))
    again["components"]["linear"]["seconds"] = [2 * x for x in prof["components"]["linear"]["seconds"]]
    lines = profile.replaced_changes(path, again)
    assert any(ln.startswith("linear against the profile it replaces: after / before, by cell: median 2.000")
               for ln in lines)
    assert any(ln.startswith("attn_decode against") and "median 1.000" in ln for ln in lines)
    assert profile.replaced_changes(path, {**again, "model": "other"}) == []
    assert profile.replaced_changes(path, {**again, "block_size": 32}) == [], "other settings: no comparison"
    assert profile.replaced_changes(tmp_path / "none.json", again) == []


def test_the_shared_table_is_left_out_where_no_context_spans_two_blocks(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    from blocksim.catalog import Catalog
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cpu", quick=True,
                         progress=False)
    p.cuda = True
    p.grid = {**p.grid, "SHARED_CONTEXT": (8, 16)}  # blocks of 16: one block each
    assert p.decode_step_shared() is None


def test_a_measured_profile_its_loader_refuses_exits_2_in_one_line(written, tmp_path, monkeypatch, capsys):
    bad = json.loads(json.dumps(written[0]))
    bad["components"]["linear"]["seconds"][0] = -1.0
    monkeypatch.setattr(profile, "profile", lambda *a, **k: bad)
    out = tmp_path / "p.json"
    rc = main(["profile", "--model", "tiny", "--device", "cpu", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "components.linear" in err[0] and "p.json.rejected" in err[0]
    assert not out.exists() and (tmp_path / "p.json.rejected").exists()


def test_linear_points_above_the_in_step_bound_are_whole_steps_less_their_other_parts(tmp_path, monkeypatch):
    """On CUDA (stood in for: the clock and the step's parts), a linear point above
    LINEAR_IN_STEP_ABOVE tokens is its whole step less the attention timed inside it, the cache
    writes and the sampling; a point at or below it is the linear layers timed alone."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    from blocksim.catalog import Catalog
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cpu", quick=True,
                         progress=False)
    monkeypatch.setattr(profile, "LINEAR_IN_STEP_ABOVE", 16)
    seconds = {("linear",): 5.0, ("write",): 0.25, ("sample",): 0.5}
    monkeypatch.setattr(p, "_forward", lambda batch, parts: (batch.num_tokens, tuple(parts)))
    monkeypatch.setattr(p.clock, "median", lambda fn: seconds.get(fn[1], 10.0) * fn[0])  # whole step: 10 s a token
    monkeypatch.setattr(p, "_attention_in_step", lambda batch: 2.0 * batch.num_tokens)
    assert p._linear_point(16) == 5.0 * 16, "on the CPU (and at the bound) the linear layers alone"
    assert p._linear_point(256) == 5.0 * 256
    p.cuda = True
    assert p._linear_point(16) == 5.0 * 16
    assert p._linear_point(256) == pytest.approx((10.0 - 2.0 - 0.25 - 0.5) * 256)


@pytest.mark.parametrize("leave_out", [(), ("decode_step_shared",), ("decode_step_shared", "decode_step_padded"),
                                       ("decode_step", "decode_step_shared", "decode_step_padded")])
def test_left_out_tables_are_not_measured(tmp_path, monkeypatch, leave_out):
    """`--leave-out` (the tables stood in for, on a GPU's path): the tables named are neither
    measured nor written, the others are."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    from blocksim.catalog import Catalog
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cpu", quick=True,
                         progress=False, leave_out=leave_out)
    p.cuda = True
    measured = []
    for name in ("linear", "attn_prefill", "attn_decode", "cache_write", "sample", "overhead",
                 "decode_step_shared", "decode_step_padded"):
        monkeypatch.setattr(p, name, lambda name=name: measured.append(name) or {"table": name})
    monkeypatch.setattr(p, "moves", lambda: {"swap_out": {}, "swap_in": {}, "copy": {}})
    monkeypatch.setattr(p, "decode_step", lambda: measured.append("decode_step") or (
        {"table": "decode_step"}, {"table": "decode_step_longest"}))
    comps = p.run()
    for name in profile.OPTIONAL:
        assert (name in comps) == (name not in leave_out) == (name in measured)
    assert ("decode_step_longest" in comps) == ("decode_step" in comps)  # measured with decode_step
    assert {"linear", "attn_prefill", "attn_decode"} <= set(comps)


def test_leave_out_names_only_optional_tables(capsys):
    with pytest.raises(SystemExit) as e:
        profile.main(["profile", "--model", "llama-2-7b", "--leave-out", "linear"])
    assert e.value.code == 2 and "--leave-out" in capsys.readouterr().err


def test_write_cached_fills_the_cached_positions_of_each_prompt_and_nothing_else(tmp_path):
    """Profiler.write_cached: the keys and values of each prompt's cached positions, written by the
    model through the prompt's own block table; its new positions and other blocks left alone."""
    from blocksim.catalog import Catalog
    (tmp_path / "tiny.yaml").write_text(TINY)
    spec = Catalog([str(tmp_path / "tiny.yaml")]).model("tiny")
    prof = profile.Profiler(spec, device="cpu", dtype="float32", quick=True, progress=False)
    b = prof.batch(prefills=[(8, 40), (8, 0), (4, 20)])
    for k, v in zip(prof.runner.k_caches, prof.runner.v_caches):
        k.zero_()
        v.zero_()
    prof.write_cached(b)
    bs = prof.bs
    written = set()
    for s in b.prefills:
        pos = np.arange(s.start)
        written.update(zip(s.block_table[pos // bs].tolist(), (pos % bs).tolist()))
    for cache in (*prof.runner.k_caches, *prof.runner.v_caches):
        filled = cache.abs().flatten(2).sum(-1) > 0  # [blocks, block_size]
        got = {tuple(x) for x in filled.nonzero().tolist()}
        assert got == written
    assert len(written) == 40 + 20


def test_the_linear_table_is_timed_smallest_and_largest_in_turn_and_kept_in_grid_order(tmp_path, monkeypatch):
    """The profiler times the linear points interleaved (the rising sweep's heat would land on its
    largest points) and writes each time against its own token count."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    from blocksim.catalog import Catalog
    p = profile.Profiler(Catalog([str(tmp_path / "tiny.yaml")]).model("tiny"), device="cpu", quick=True,
                         progress=False)
    order = []
    monkeypatch.setattr(p, "_linear_point", lambda n: order.append(n) or 1e-3 * n)
    table = p.linear()
    grid = table["grid"]["tokens"]
    assert order == profile.interleaved(grid) and sorted(order) == sorted(grid)
    assert len(grid) >= 3 and order[:3] == [grid[0], grid[-1], grid[1]]
    assert table["seconds"] == [1e-3 * n for n in grid]


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_interleaved_takes_each_value_once(n):
    v = list(range(10, 10 + n))
    got = profile.interleaved(v)
    assert sorted(got) == v and (n < 2 or got[:2] == [v[0], v[-1]])


def test_passes_alternate_direction_and_average():
    """Each cell is measured once a pass, every other pass in reverse order, and holds the mean."""
    order = []

    def measure(cell):
        order.append(cell)
        return float(len(order))

    got = profile.in_passes(["a", "b", "c"], 3, measure)
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    # a: measured 1st, 6th and 7th; b: 2nd, 5th, 8th; c: 3rd, 4th, 9th
    assert got == {"a": pytest.approx(14 / 3), "b": pytest.approx(5.0), "c": pytest.approx(16 / 3)}
    assert profile.in_passes(["a"], 1, lambda c: 2.5) == {"a": 2.5}
    with pytest.raises(ValueError, match="passes must be at least 1"):
        profile.in_passes(["a"], 0, measure)
    assert profile.DECODE_PASSES >= 2 and profile.QUICK["DECODE_PASSES"] == 1
