"""What a graph-replayed decode step costs beyond its padded batch size and mean context.

The profiled cost model prices a pure-decode step by the profile's ``decode_step`` table: a whole
step replayed as the CUDA graph of the padded batch size, measured with every row real and every
context equal. An executed step differs in three ways, and this benchmark times each alone on the
GPU, at the same total context tokens:

* ``padded``: fewer real rows than the graph's size; the padding rows hold a one-token context;
* ``uneven``: contexts of unequal length (log-normal, the same total);
* ``scattered``: block tables of random blocks instead of each row's own run of blocks;
* ``shared``: rows in pairs whose first blocks are the same (the prompt of ``n = 2`` sampling).

    PYTHONPATH=. python benchmarks/decode_step_shapes.py --models llama-2-7b llama-3-8b --json OUT.json

Writes one row per (model, padded size, case): real rows, total context tokens, the median step
time and its ratio to the uniform step of the same total.

Offline, ``--priced RESULTS.json`` prices the padded and uneven cases of a results file with the
shipped profiles of its device (the profiled cost model's graph-step rule, by the longest row, and
the rule by the mean context over the real rows alone) against the measured ratios:

    python benchmarks/decode_step_shapes.py --priced benchmarks/results/decode_step_shapes-h200.json \
        --gpu h200-141gb --json benchmarks/results/decode_step_shapes-h200-priced.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def _contexts(kind: str, rows: int, total: int, rng) -> list[int]:
    if kind == "uneven":
        w = rng.lognormal(0.0, 0.8, rows)
        c = np.maximum(16, np.round(w / w.sum() * total)).astype(int)
        return c.tolist()
    return [total // rows] * rows


def measure(model: str, sizes: list[int], fill: float, per_row: int, seed: int = 0) -> list[dict]:
    from blocksim.catalog import Catalog
    from validation.profile import Profiler, _graph, paired, retable

    prof = Profiler(Catalog([]).model(model))
    r = prof.runner
    r.capture_decode_graphs(max(sizes))
    rng = np.random.default_rng(seed)
    rows_out = []
    for size in sizes:
        total = size * per_row
        real = max(1, int(round(size * fill)))
        cases = {"uniform": (size, "even", "own"), "padded": (real, "even", "own"),
                 "uneven": (size, "uneven", "own"), "uneven+padded": (real, "uneven", "own"),
                 "scattered": (size, "even", "random"), "shared": (size, "even", "pairs")}
        base = None
        for name, (n, spread, tables) in cases.items():
            ctx = _contexts(spread, n, total, rng)
            b = prof.batch(decodes=ctx)
            if tables == "random":  # every row's blocks drawn at random from the cache
                perm = rng.permutation(prof.num_blocks)
                at = 0
                new = []
                for t in b.decode_tables:
                    new.append(perm[at:at + len(t)].astype(np.int64))
                    at += len(t)
                b = retable(b, new, prof.bs)
            elif tables == "pairs":  # the second row of each pair reads the first's blocks but its last
                b = paired(b, prof.bs)[0]
            r.load_decode(b, size)
            secs = prof.clock.median(_graph(r, size))
            if name == "uniform":
                base = secs
            rows_out.append({"model": model, "padded_batch": size, "case": name, "rows": n,
                             "context_tokens": int(sum(ctx)), "max_context": int(max(ctx)), "seconds": secs,
                             "vs_uniform": secs / base})
            print(f"{model} B={size} {name:14s} rows={n:3d} ctx={sum(ctx):6d} max={max(ctx):5d} "
                  f"{secs * 1e3:.3f} ms  {secs / base:.3f}", flush=True)
    del prof, r
    return rows_out


PRICED_CASES = ("padded", "uneven", "uneven+padded")


def priced(results: dict, gpu: str) -> list[dict]:
    """Each padded or uneven row of `results` priced against its uniform step, by the shipped profile
    of its model on `gpu`: with the longest row (``by_longest``) and by the mean context over the
    real rows alone (``by_mean``), as ratios like the measured ``vs_uniform``. Rows whose real rows
    a run would replay at a smaller captured size than the one timed are left out."""
    import warnings

    from blocksim.cost import ProfiledCostModel, load_profile, shipped_profile
    from blocksim.experiments.runner import build_config
    out, models = [], {}
    for r in results["rows"]:
        if r["case"] not in PRICED_CASES:
            continue
        m = r["model"]
        if m not in models:
            cfg = build_config(model=m, gpu=gpu)
            path = shipped_profile(cfg)
            if path is None:
                raise ValueError(f"--gpu {gpu}: no shipped profile of {m}; choose a GPU of blocksim/profiles/")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                models[m] = ProfiledCostModel(cfg, load_profile(path))
        cm = models[m]
        b, n, total, top = r["padded_batch"], r["rows"], r["context_tokens"], r["max_context"]
        if cm.padded(n) != b:  # a run replays these rows at a smaller captured size, not the one timed
            continue

        def step(rows: int, longest: int | None) -> float:
            args = (total, rows, True) if longest is None else (total, rows, True, longest)
            return cm.linear(rows, rows, True) + cm.attn_decode(*args)
        uniform = step(b, total // b)
        out.append({"model": m, "padded_batch": b, "case": r["case"], "rows": n, "max_context": top,
                    "measured": r["vs_uniform"], "by_longest": step(n, top) / uniform,
                    "by_mean": step(n, None) / step(b, None)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/decode_step_shapes.py", description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["llama-2-7b", "llama-3-8b"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[8, 16, 24])
    ap.add_argument("--fill", type=float, default=0.65, help="real rows / padded size for the padded cases (default 0.65)")
    ap.add_argument("--per-row", type=int, default=800, help="mean context tokens per padded row (default 800)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--priced", default=None, metavar="RESULTS",
                    help="price a results file's padded and uneven cases with the shipped profiles (no GPU)")
    ap.add_argument("--gpu", default="h200-141gb", help="with --priced: the catalog GPU of the profiles")
    a = ap.parse_args(argv)
    if a.priced:
        from blocksim.config import ConfigError
        try:
            data = json.loads(open(a.priced).read())
            if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
                raise ValueError("no list of rows; give a results file this benchmark wrote")
            rows = priced(data, a.gpu)
        except json.JSONDecodeError:
            print(f"decode_step_shapes: --priced {a.priced}: not JSON; give a results file this benchmark wrote",
                  file=sys.stderr)
            return 2
        except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
            print(f"decode_step_shapes: --priced {a.priced}: {e}", file=sys.stderr)
            return 2
        for r in rows:
            print(f"{r['model']} {r['padded_batch']:3d} {r['case']:14s} measured {r['measured']:.3f}  "
                  f"by longest row {r['by_longest']:.3f}  by mean {r['by_mean']:.3f}")
        for key in ("by_longest", "by_mean"):
            err = [r[key] / r["measured"] - 1 for r in rows]
            print(f"{key}: mean error {100 * np.mean(err):+.1f}%, mean absolute {100 * np.mean(np.abs(err)):.1f}%")
        try:
            with open(a.json, "w") as f:
                json.dump({"priced": a.priced, "gpu": a.gpu, "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
        except OSError as e:
            print(f"decode_step_shapes: --json {a.json}: cannot write ({e.strerror}); give a writable path",
                  file=sys.stderr)
            return 2
        return 0
    import torch
    rows = []
    for m in a.models:
        rows += measure(m, a.sizes, a.fill, a.per_row)
        torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "command": " ".join(sys.argv),
           "rows": rows}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
