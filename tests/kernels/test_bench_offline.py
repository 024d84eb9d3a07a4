"""kernels.bench's offline parts (no GPU): the sweep plot redrawn from a results file, the paired
statistics, the alternating order of measurements, the SDPA backend names, the command line and the
per-item cost fit (`kernels/bench/item_costs.py`)."""
from __future__ import annotations

import json

import pytest

from kernels.bench import cli, stats, timing


def results(**over):
    row = {"shape": [8, 32, 8, 16384], "kv_bytes": 537_000_000, "fast": 0.130, "fast_default": 0.125,
           "copy_gbs": 4250.0}
    res = {"device": "NVIDIA H200 (132 SMs)", "torch": "2.11.0", "copy_gbs": 4250.0, "headline": [row, dict(row)]}
    res.update(over)
    return res


def test_plot_from_a_saved_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    rows = []
    for b in (1, 4):
        for ctx in (512, 2048):
            kv = 2 * b * ctx * 8 * 128 * 2
            rows.append({"shape": [b, 32, 8, ctx], "kv_bytes": kv, "copy_gbs": 4250.0, "fast": 0.01 * b,
                         "v1": 0.02 * b, "v2": 0.03 * b, "auto": "v1" if ctx == 512 else "v2", "sdpa": 0.012 * b,
                         "gather_sdpa": 0.05 * b})
    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps(results(sweep=rows)))
    png = tmp_path / "sweep.png"
    assert cli.main(["--plot-from", str(saved), "--plot", str(png)]) == 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_ratio_interval_takes_order_statistics_of_the_paired_ratios():
    sdpa = [1.0] * 9
    fast = [1.04, 0.97, 1.01, 0.99, 1.00, 1.02, 0.98, 1.03, 0.96]
    iv = stats.ratio_interval(fast, sdpa)
    # 9 pairs: (2nd smallest, 2nd largest) covers the median with 1 - 2 * 10 / 512 = 96.1%
    assert (iv["low"], iv["median"], iv["high"]) == pytest.approx((0.97, 1.00, 1.03))
    assert iv["coverage"] == pytest.approx(1 - 20 / 512) and iv["pairs"] == 9
    assert stats.interval_label(iv) == "1.000 [0.970, 1.030] same"


def test_ratio_interval_pairs_the_runs_and_says_faster_or_slower():
    # each fast run is paired with the SDPA run measured next to it: a drift of the device's
    # speed moves both, and the ratios stay below 1
    sdpa = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    fast = [0.99 * s for s in sdpa]
    iv = stats.ratio_interval(fast, sdpa)
    assert iv["high"] == pytest.approx(0.99) and stats.interval_label(iv).endswith("faster")
    assert stats.interval_label(stats.ratio_interval([1.02] * 7, [1.0] * 7)).endswith("slower")


def test_ratio_interval_with_few_pairs_reports_its_lower_coverage():
    iv = stats.ratio_interval([1.0, 1.1, 0.9, 1.05, 0.95], [1.0] * 5)
    assert (iv["low"], iv["high"]) == pytest.approx((0.9, 1.1))
    assert iv["coverage"] == pytest.approx(1 - 2 / 32)
    assert stats.interval_label(iv) == "1.000 [0.900, 1.100] same (94% interval)"
    with pytest.raises(ValueError, match="at least one pair"):
        stats.ratio_interval([], [])
    with pytest.raises(ValueError, match="pairs the runs"):
        stats.ratio_interval([1.0, 1.0], [1.0])


def test_alternate_puts_each_function_first_on_every_other_repeat():
    order = []

    def measure(name, value):
        return lambda: order.append(name) or value + len(order)

    runs_a, runs_b = stats.alternate(measure("a", 0.0), measure("b", 10.0), 5)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"], "a first on even repeats, b on odd"
    # each list holds its own function's results, one a repeat, in the order taken
    assert runs_a == [1.0, 4.0, 5.0, 8.0, 9.0] and runs_b == [12.0, 13.0, 16.0, 17.0, 20.0]
    assert stats.alternate(measure("a", 0.0), measure("b", 0.0), 0) == ([], [])


def test_alternating_runs_swap_the_order_within_each_pair(monkeypatch):
    order = []

    class FakeCase:
        sets = [(None, None, None)]

        def contiguous(self):
            return None, None

        def fast_ms(self, warmup, iters):
            order.append("fast")
            return 1.0

    class FakeQuery:
        def unsqueeze(self, dim):
            return self

    FakeCase.sets = [(FakeQuery(), None, None)]
    monkeypatch.setattr(stats, "graph_ms", lambda fns, warmup, iters: order.append("sdpa") or 2.0)
    args = type("Args", (), {"repeats": 3, "warmup": 1, "iters": 1})()
    fast_runs, sdpa_runs = stats.alternating_runs(FakeCase(), None, args)
    assert order == ["fast", "sdpa", "sdpa", "fast", "fast", "sdpa"]
    assert fast_runs == [1.0] * 3 and sdpa_runs == [2.0] * 3


def test_default_sdpa_backend_names_what_torch_dispatches_to():
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 8, 1, 64)
    k = torch.randn(2, 2, 100, 64)
    name = timing.default_sdpa_backend(q, k, k)
    assert name in {"flash", "cudnn", "efficient", "math", "unknown"}
    from torch.nn.attention import SDPBackend
    if hasattr(torch, "_fused_sdp_choice"):
        want = SDPBackend(torch._fused_sdp_choice(q, k, k, enable_gqa=True)).name.split("_")[0].lower()
        assert name == want


def test_unknown_bench_section_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--sections", "headline,nope"])
    err = capsys.readouterr().err
    assert "unknown 'nope'" in err and "backends" in err


def test_tables_reads_a_printed_run_back_into_numbers():
    from kernels.bench import tables

    printed = """device: NVIDIA H200 (132 SMs), torch 2.11.0+cu130, CUDA 13.0
device copy bandwidth (read + write): 4279 GB/s

## Headline shapes (block size 16)

fast ms: NHD storage

| batch, heads, kv heads, context | fast ms | load path | paired fast / SDPA [interval] |
|---|---:|---|---|
| 64, 32, 32, 1024 | 0.2417 | ring 2 | 0.999 [0.998, 1.000] faster |
| 1, 32, 8, 32768 | 0.0428 | ring 2, <= 2/SM | 0.973 [0.972, 0.974] faster |

device copy bandwidth after the run: 4270 GB/s
"""
    got = tables.parse(printed)
    assert (got["device"], got["torch"], got["cuda"]) == ("NVIDIA H200 (132 SMs)", "2.11.0+cu130", "13.0")
    assert (got["copy_gbs"], got["copy_gbs_after"]) == (4279.0, 4270.0)
    section = got["sections"]["Headline shapes (block size 16)"]
    assert section["notes"] == ["fast ms: NHD storage"]
    assert [r["fast ms"] for r in section["rows"]] == [0.2417, 0.0428]
    assert section["rows"][1]["load path"] == "ring 2, <= 2/SM"
    assert section["rows"][0]["batch, heads, kv heads, context"] == "64, 32, 32, 1024"


@pytest.mark.parametrize("bad", ["1,0", "1,0,x", "0,0,512", "1,0,0", "1,-1,512"])
def test_prefill_shapes_must_be_batch_cached_new_triples(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--sections", "prefill", "--prefill-shapes", bad])
    assert exc.value.code == 2
    assert "--prefill-shapes" in capsys.readouterr().err


def test_prefill_shapes_select_the_sections_shapes():
    from kernels.bench import prefill

    args = type("Args", (), {"prefill_shapes": [(1, 0, 2048), (4, 4096, 1024)]})()
    assert prefill.shapes(args) == [(1, 0, 2048), (4, 4096, 1024)]
    args.prefill_shapes = None
    assert prefill.shapes(args) == prefill.PREFILL_SHAPES


def test_stall_summary_reads_a_saved_source_page(tmp_path, capsys):
    """ws_stalls.py on a small source page: samples by reason, the producer's share (the SASS from
    its first to its last LDGSTS) and the instructions with the most samples."""
    import csv
    import gzip

    from kernels.bench import ws_stalls
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
           "stall_wait", "stall_barrier (Not Issued)"]
    rows = [["0x0", "HGMMA.64x128x16.F32 R88", "60", "10", "50", "10", "5"],
            ["0x10", "LDGSTS.E.BYPASS [R2]", "20", "30", "0", "20", "0"],
            ["0x20", "IADD3 R4, R4, R5", "10", "50", "0", "10", "0"],
            ["0x30", "LDGSTS.E.BYPASS [R4]", "10", "10", "0", "10", "0"]]
    page = tmp_path / "src.csv.gz"
    with gzip.open(page, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel name line"])
        w.writerow(hdr)
        w.writerows(rows)
    ws_stalls.summary(str(page), top=2)
    out = capsys.readouterr().out
    assert "100 samples" in out and "barrier 50.0%" in out and "wait 50.0%" in out
    assert "producer's copy code (SASS rows 1-3): 40.0% of samples, 90.0% of instructions" in out
    lines = out.strip().splitlines()
    assert "HGMMA" in lines[-2] and "LDGSTS" in lines[-1]


def _item_costs():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "kernels" / "bench" / "item_costs.py"
    spec = importlib.util.spec_from_file_location("item_costs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_item_costs_count_the_causal_band():
    ic = _item_costs()
    # one sequence of 256 tokens, MHA: 2 row blocks of 128, the first sees 1 key tile, the second 2
    assert ic.counts(1, 256, 8, 8) == (2 * 8, 3 * 8)
    # GQA 4: 128 packed rows are 32 tokens; 512 tokens -> 16 row blocks, row block r sees r // 4 + 1 tiles
    items, steps = ic.counts(1, 512, 32, 8)
    assert items == 16 * 8 and steps == sum(r // 4 + 1 for r in range(16)) * 8


def test_item_costs_recover_the_costs_from_either_input(tmp_path, capsys, monkeypatch):
    ic = _item_costs()
    shapes = [(1, 0, 2048), (1, 0, 8192), (8, 0, 1024), (32, 0, 512)]
    a_step, b_item = 2.2e-3, 1.5e-3  # ms per tile step and per item, per SM
    ab, section = [], []
    for model, (h, kv) in ic.HEADS.items():
        for s in shapes:
            items, steps = ic.counts(s[0], s[2], h, kv)
            ms = (a_step * steps + b_item * items) / 132
            ab.append({"tag": "x1", "model": model, "shape": list(s), "ms7": ms, "ms_sdpa": 2 * ms})
            section.append({"model": model, "shape": list(s), "paged": ms, "sdpa": 2 * ms, "heads": h,
                            "kv_heads": kv})
    rows, what = ic.section_rows(ab)
    assert what == "ab_c0 build x1" and rows == section
    for f in ic.fit(rows, 132):
        k = 2 if f["kernel"] == "sdpa" else 1
        assert f["us_per_tile_step"] == pytest.approx(k * 2.2) and f["us_per_item"] == pytest.approx(k * 1.5)
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    monkeypatch.setattr("sys.argv", ["item_costs.py", str(tmp_path / "ab.json")])
    assert ic.main() == 0
    assert "2.20 us per tile step + 1.50 us per item" in capsys.readouterr().out
    # --new-kv fits the times given the new tokens' keys and values, from either input
    for r in ab:
        r["ms7_new_kv"] = r.pop("ms7") / 2
    for r in section:
        r["paged_new_kv"] = r["paged"] / 2
        r["paged"] = -1.0  # not read
    new_rows, _ = ic.section_rows(ab, new_kv=True)
    assert [r["paged"] for r in new_rows] == [r["paged_new_kv"] for r in section]
    rows, _ = ic.section_rows({"prefill": section, "device": "d"}, new_kv=True)
    assert rows == new_rows
    with pytest.raises(ValueError, match="ms7 and ms_sdpa must be positive"):
        ic.section_rows(ab)


@pytest.mark.parametrize("bad, says", [
    ([], "two c = 0 shapes"),
    ({"prefill": []}, "two c = 0 shapes"),
    ({"device": "x"}, "no 'prefill' list"),
    ({"prefill": 5}, "no 'prefill' list"),
    ("x", "neither a prefill section"),
    ([1, 2], "row 0 is not an object"),
    ([{"model": "gpt-2", "shape": [1, 0, 8], "ms7": 1.0, "ms_sdpa": 1.0}], "model must be one of"),
    ([{"model": "llama-2-7b", "shape": "x", "ms7": 1.0, "ms_sdpa": 1.0}], "shape must be"),
    ([{"model": "llama-2-7b", "shape": [1, 0, 512], "ms7": None, "ms_sdpa": 1.0}], "positive times"),
    ([{"model": "llama-2-7b", "shape": [1, 0, 512], "ms7": 1.0}], "positive times"),
    ({"prefill": [{"model": "m", "shape": [1, 0, 512], "paged": 1.0, "sdpa": 1.0, "heads": 32, "kv_heads": 5}]},
     "heads a multiple of kv_heads"),
])
def test_item_costs_refuse_what_they_cannot_fit_in_one_line(bad, says, tmp_path, capsys, monkeypatch):
    ic = _item_costs()
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    monkeypatch.setattr("sys.argv", ["item_costs.py", str(tmp_path / "bad.json")])
    assert ic.main() == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and says in err and err.count("\n") == 1


def test_item_costs_heads_are_the_prefill_sections():
    from kernels.bench.prefill import PREFILL_HEADS
    assert _item_costs().HEADS == {m: (h, kv) for m, h, kv in PREFILL_HEADS}


@pytest.mark.parametrize("args,says", [
    (["--rounds", "0"], "--rounds 0: give at least 1"),
    (["--rows", "6"], "--rows 6: give multiples of 4"),
    (["--batch-cached", "4:x"], "--batch-cached 4:x: give SEQUENCES:CACHED pairs"),
    ([], "needs a Hopper GPU"),  # no GPU here (or not a Hopper)
])
def test_dispatch_rows_refuses_in_one_line_before_measuring(args, says, tmp_path, capsys):
    import importlib
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and not args:
        pytest.skip("a Hopper GPU measures")
    dispatch_rows = importlib.import_module("kernels.bench.dispatch_rows")
    out = tmp_path / "rows.json"
    assert dispatch_rows.main(["--json", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and not out.exists()


def test_result_files_are_checked_without_being_created_and_written_whole(tmp_path, capsys, monkeypatch):
    from kernels.bench.output import refuse_unwritable, write_json
    assert refuse_unwritable(str(tmp_path / "no-such-folder" / "r.json"), "x.py: --json")
    assert refuse_unwritable(str(tmp_path), "x.py: --json")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"x.py: --json {tmp_path / 'no-such-folder' / 'r.json'}: its folder does not exist; name a "
                   "writable file", f"x.py: --json {tmp_path}: is a folder; name a writable file"]
    out = tmp_path / "r.json"
    assert not refuse_unwritable(str(out), "x.py: --json") and not out.exists()
    write_json(str(out), {"rows": [1]})
    assert json.loads(out.read_text()) == {"rows": [1]} and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(out), "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json(str(out), {"rows": [2]})
    assert json.loads(out.read_text()) == {"rows": [1]} and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_rotate_starts_each_round_one_measure_later():
    order = []

    def measure(name):
        return lambda: order.append(name) or len(order)

    runs = stats.rotate([measure("a"), measure("b"), measure("c")], 3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # each list holds its own measure's results, one a round
    assert runs == [[1, 6, 8], [2, 4, 9], [3, 5, 7]]
    two = []
    stats.rotate([lambda: two.append("a"), lambda: two.append("b")], 3)
    assert two == ["a", "b", "b", "a", "a", "b"], "two measures: alternate's order"
