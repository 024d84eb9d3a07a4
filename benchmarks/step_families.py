"""Which synthetic steps stand for a serving engine's real ones: three measurements on the GPU.

* ``decode``: graph-replayed decode steps whose rows hold contexts drawn from executed runs
  (``--batches``, a JSON of real compositions) against two synthetic families at the same padded
  batch, total context and longest row: ``one_long`` (`validation.profile.uneven_contexts`: one
  long row, the rest even) and ``spread`` (`validation.profile.spread_contexts`: rows falling in
  equal steps from the longest).
* ``eager``: whole eager steps against the sum of their parts (linear layers, cache writes and
  sampling timed alone, attention timed inside the step), from small to the largest prompt steps:
  whether the parts' sum misses the whole by a fixed amount or by a share.
* ``prefill_mix``: the attention of prompts run together in one step against each prompt alone, and
  a short chunk over a long cached prefix repeated in a batch: how the paged prefill kernel's time
  of a varlen batch follows from its members'. The cached keys are written by the model first
  (`Profiler.write_cached`), as the profile's prefill table has them; the committed results
  (`benchmarks/results/step_families/`, `fidelity-h100-lease4/step-families-prefill-mix.json`)
  were measured over cached keys left as the cache held them.

    PYTHONPATH=. python benchmarks/step_families.py --models llama-2-7b llama-3-8b \\
        --batches benchmarks/results/step_families/real_batches.json --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def decode_rows(prof, model: str, batches: list[dict]) -> list[dict]:
    from validation.profile import _graph, spread_contexts, uneven_contexts
    r, top = prof.runner, prof.dims.max_model_len
    r.capture_decode_graphs(max(b["padded_batch"] for b in batches))
    out = []
    for b in batches:
        pad, ctx = b["padded_batch"], [min(int(c), top) for c in b["contexts"]]
        total, longest = sum(ctx), max(ctx)
        mean = total / pad
        times = {}
        for name, rows in (("real", ctx),
                           ("one_long", uneven_contexts(pad, max(1, round(mean)), longest / mean, top)),
                           ("spread", spread_contexts(pad, max(1, round(mean)), longest / mean, top))):
            r.load_decode(prof.batch(decodes=rows), pad)
            times[name] = prof.clock.median(_graph(r, pad))
        out.append({"model": model, "padded_batch": pad, "rows": len(ctx), "context_tokens": total,
                    "longest": longest, "run": b.get("run"), "step": b.get("step"),
                    **{f"{k}_s": v for k, v in times.items()}})
        print(f"decode {model} B={pad} rows={len(ctx)} mean={mean:.0f} x{longest / mean:.2f} real "
              f"{times['real'] * 1e3:.3f} one_long {times['one_long'] / times['real']:.3f} "
              f"spread {times['spread'] / times['real']:.3f}", flush=True)
    return out


def eager_cases(top: int) -> list[tuple[str, list, list]]:
    half = top // 2
    return [("256 prompt", [(256, 0)], []), ("1024 prompt", [(1024, 0)], []), ("2048 prompt", [(2048, 0)], []),
            ("4096 prompt", [(4096, 0)], []), ("4094 prompt + 2 decodes", [(4094, 0)], [1024, 2048]),
            (f"{half} chunk after {half}", [(half, half)], []),
            ("1024 prompt + 32 decodes", [(1024, 0)], [1024] * 32),
            ("2 x 2048 prompts", [(2048, 0), (2048, 0)], []),
            ("64 decodes (eager)", [], [1024] * 64)]


def eager_rows(prof, model: str) -> list[dict]:
    out = []
    for name, pf, dec in eager_cases(prof.dims.max_model_len):
        b = prof.batch(prefills=pf, decodes=dec)
        whole = prof.clock.median(prof._forward(b, ("linear", "write", "attn", "sample")))
        parts = {p: prof.clock.median(prof._forward(b, (p,))) for p in ("linear", "write", "sample")}
        parts["attn"] = prof._attention_in_step(b)
        s = sum(parts.values())
        out.append({"model": model, "case": name, "whole_s": whole, **{f"{k}_s": v for k, v in parts.items()},
                    "parts_s": s, "whole_over_parts": whole / s})
        print(f"eager {model} {name}: whole {whole * 1e3:.3f} parts {s * 1e3:.3f} ms ({whole / s:.4f}, "
              f"{(whole - s) * 1e3:+.3f} ms)", flush=True)
    return out


def prefill_mix_rows(prof, model: str) -> list[dict]:
    top = prof.dims.max_model_len
    big = top // 2 - 16
    mixes = [("short chunk over a long prefix + a prompt", [(16, top - 17), (big, 0)]),
             ("two chunks, one over a prefix", [(big // 2, big), (big, 0)]),
             ("prompt + short chunk over a half prefix", [(big, 0), (64, top // 2)]),
             ("four unequal prompts", [(big, 0), (big // 4, 0), (64, 0), (16, 0)]),
             # chunked prefill's usual pair: a prompt's last chunk and the next prompt's first, 512 tokens
             ("last chunk over a prefix + a first chunk", [(128, min(3968, top - 129)), (384, 0)]),
             ("last chunk over a prefix + a short first chunk", [(256, min(3840, top - 257)), (256, 0)])]
    def in_step(pf, write: bool = True) -> float:  # cached keys written first, as the profile's table has them
        b = prof.batch(prefills=pf)
        if write:
            prof.write_cached(b)
        return prof._attention_in_step(b)
    out = []
    for name, pf in mixes:
        together = in_step(pf)
        alone = [in_step([p]) for p in pf]
        out.append({"model": model, "case": name, "prefills": pf, "together_s": together, "alone_s": alone})
        print(f"prefill_mix {model} {name}: together {together * 1e3:.3f} ms, alone "
              f"{[round(a * 1e3, 3) for a in alone]} (sum {sum(alone) * 1e3:.3f}, max {max(alone) * 1e3:.3f})",
              flush=True)
    for new, cached in ((16, top - 17), (64, top // 2), (256, top // 4)):
        # largest first: `prof.batch` gives the first n sequences the same blocks at every n, so the
        # keys written for 64 serve the smaller batches
        for n in (64, 32, 8, 1):
            t = in_step([(new, cached)] * n, write=n == 64)
            out.append({"model": model, "case": f"{n} x ({new} new, {cached} cached)", "prefills": [(new, cached)] * n,
                        "together_s": t, "per_sequence_s": t / n})
            print(f"prefill_mix {model} {n} x ({new}, {cached}): {t * 1e3:.3f} ms, {t / n * 1e3:.3f} per sequence",
                  flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/step_families.py", description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["llama-2-7b", "llama-3-8b"])
    ap.add_argument("--batches", required=True, help="JSON of real decode compositions by model")
    ap.add_argument("--parts", nargs="+", default=["decode", "eager", "prefill_mix"],
                    choices=["decode", "eager", "prefill_mix"])
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    try:
        batches = json.loads(open(a.batches).read())["batches"]
    except (OSError, ValueError, KeyError) as e:
        print(f"step_families.py: --batches {a.batches}: {e}; give the real_batches.json this benchmark reads",
              file=sys.stderr)
        return 2
    import torch

    from blocksim.catalog import Catalog
    from validation.profile import Profiler
    rows = {"decode": [], "eager": [], "prefill_mix": []}
    for m in a.models:
        prof = Profiler(Catalog([]).model(m), progress=False)
        if "eager" in a.parts:
            rows["eager"] += eager_rows(prof, m)
        if "prefill_mix" in a.parts:
            rows["prefill_mix"] += prefill_mix_rows(prof, m)
        if "decode" in a.parts and m in batches:
            rows["decode"] += decode_rows(prof, m, batches[m])
        del prof
        torch.cuda.empty_cache()
    with open(a.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
                   **rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
