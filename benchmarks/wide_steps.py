"""Eager prompt steps of more than 4096 tokens, timed whole and by component (on a GPU): whether the
profile's `linear` table, timed alone on one prompt, prices the linear layers of such a step as the
step runs them.

    PYTHONPATH=. python benchmarks/wide_steps.py --model llama-3-8b --out OUT.json
    python benchmarks/wide_steps.py --report OUT.json

Each case is one eager step of prompts without cached tokens (and decodes), timed as the profile
times a step (`validation.profile._Clock`: a warm-up, then the median of back-to-back repetitions,
each with the executor's `SegmentTimer`): whole; its linear layers, cache writes and sampling each
alone; its attention timed inside the whole step. `linear_in_step` is the whole step less the
attention in it, the writes and the sampling. The cases run twice, in order and then in reverse
(a drift between the passes shows the device's clock or power moving). Then the linear layers of
the widest case alone, once after the GPU idled `--idle-s` seconds and as ten back-to-back
repetitions. SM clock (MHz), power (W) and temperature from NVML around each. With `--sweep`, the
linear layers alone at 512, 2,048, 4,096 and 8,192 tokens after idle, within a sweep over the linear
table's token counts in rising order (as every committed profile's table is timed), after idle again,
and within the same counts interleaved (smallest and largest in turn): whether the sweep's own heat
or power state moves its larger points, and whether another order of the table's points avoids it. With `--offgrid`, the linear
layers at some of the linear table's grid points against token counts just below them, in turns.
With `--cases chunked`, `vllm-chunked`'s steps instead (`CHUNKED_CASES`: one 512-token chunk over
cached keys; a prompt's last chunk over about 4,000 cached keys beside the next prompt's first),
their cached keys written by the model first, as the profile's prefill table is measured.

`--report` (with `--profile FILE`, each case's price by that cost profile too) prints, per case, the whole step and `linear_in_step` against the one-prompt case of
half its tokens doubled, and the profile's way of pricing it (linear alone + attention in step +
writes + sampling) against the whole step.

Measured on an H100 with llama-3-8b (benchmarks/results/fidelity-h100-grid/wide-steps.json, on the
lease of that folder's runs, after them): up to 4,096 tokens the linear layers take the same time
inside a whole step as alone (within 0.6%) and the parts sum to the whole within 0.5%; at 8,191 and
8,192 tokens they take 1.1-2.2% less inside a whole step of one, two or four prompts, and the parts
sum to 0.9-1.7% more than the whole. The SM clock fell from 1,950 to 1,740-1,850 MHz over those
wide steps; the linear layers of 8,192 tokens alone, ten back to back, drew 693 W at 1,665 MHz by
the end (the H100's 700 W limit), 206.8 ms after 3 s idle, 207.6-212.9 ms after. One token fewer
(8,191) takes 1.1% less than 8,192 in the linear layers, alone or in a step.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: name -> (prompts as (new, cached) pairs, decode contexts)
CASES = {
    "1x2048": ([(2048, 0)], []),
    "1x4096": ([(4096, 0)], []),
    "2x2048": ([(2048, 0)] * 2, []),
    "1x8192": ([(8192, 0)], []),
    "2x4096": ([(4096, 0)] * 2, []),
    "2x4095+1": ([(4095, 0)] * 2, [4096]),
    "4x2048": ([(2048, 0)] * 4, []),
}
#: `--cases chunked`: steps of `vllm-chunked` (512-token budget) as the mooncake-prefix slice executes
#: them: one chunk over cached keys, and a prompt's last chunk beside the next prompt's first. The
#: executor's prefill kernel (its mma.sync configurations, `kernels.choose_prefill_config`) launches
#: a grid of (row blocks of the longest sequence, KV heads, sequences), a KV head's GQA group packed
#: into rows (llama-3-8b: 4 query heads, so a 512-token pair is 2,048 packed rows); the pairs differ
#: in where the chunk boundary falls and over how many cached keys the last chunk runs.
CHUNKED_CASES = {
    "512@1": ([(512, 1)], []),
    "512@2048": ([(512, 2048)], []),
    "512@3584": ([(512, 3584)], []),
    "128@3968+384": ([(128, 3968), (384, 0)], []),
    "127@3969+385": ([(127, 3969), (385, 0)], []),
    "183@3912+329": ([(183, 3912), (329, 0)], []),
    "183@3912": ([(183, 3912)], []),
    "275@3820+237": ([(275, 3820), (237, 0)], []),
    "511@3584+1": ([(511, 3584), (1, 0)], []),
    "256@3840+256": ([(256, 3840), (256, 0)], []),
    "183@1912+329": ([(183, 1912), (329, 0)], []),
    "329@0": ([(329, 0)], []),
}
#: `--cases placement`: two-chunk steps held out from `CHUNKED_CASES`, chosen by
#: `benchmarks/prefill_placement.py` before they were timed: at 2,900 cached keys it puts two of the
#: longest row blocks on one SM when the first chunk is 96, 127, 160, 192, 288 or 384 tokens, and
#: each on its own SM at 64, 128, 129 and 256; the single chunks are the pairs' first halves alone.
PLACEMENT_CASES = {
    f"{p}@{c}+{512 - p}": ([(p, c), (512 - p, 0)], []) for c, ps in ((2900, (64, 96, 127, 128, 129, 160, 192, 256, 288, 384)),
                                                                  (1500, (128, 160)))
    for p in ps
} | {"128@2900": ([(128, 2900)], []), "160@2900": ([(160, 2900)], [])}
#: `--cases placement2`: held out from both sets above, to check the profiled model's placement
#: (`blocksim.cost.placement`): single chunks of 257-511 tokens over cached keys (priced per key of
#: their busiest SM) and two-chunk steps over 1,000 and 6,000 cached keys.
PLACEMENT2_CASES = {
    f"{p}@{c}": ([(p, c)], []) for p, c in ((288, 3000), (320, 3000), (384, 3000), (448, 3000), (480, 1000),
                                            (300, 6000), (256, 3000), (512, 3000))
} | {
    f"{p}@{c}+{512 - p}": ([(p, c), (512 - p, 0)], []) for p, c in ((96, 1000), (256, 1000), (128, 6000),
                                                                  (160, 6000), (200, 6000), (300, 6000))
}


def measure(model: str, idle_s: float, sweep: bool = False, which: str = "wide", off: bool = False) -> dict:
    import torch

    from blocksim.catalog import MODELS
    from eager_gap import nvml  # SM clock, power and temperature from NVML (benchmarks/eager_gap.py)
    from validation.model import PARTS, SegmentTimer
    from validation.profile import Profiler
    from validation.sleeps import LEAD_S

    prof = Profiler(MODELS[model], progress=False)
    r, max_len = prof.runner, prof.dims.max_model_len
    table = {"chunked": CHUNKED_CASES, "placement": PLACEMENT_CASES, "placement2": PLACEMENT2_CASES}.get(which, CASES)
    cases = {k: v for k, v in table.items()
             if all(p + c <= max_len for p, c in v[0]) and all(c <= max_len for c in v[1])}
    res = {"model": model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "max_model_len": max_len, "cases": which, "prefills": {k: v[0] for k, v in cases.items()}, "passes": []}

    def one_case(pf, dec) -> dict:
        b = prof.batch(prefills=pf, decodes=dec)
        prof.write_cached(b)
        inp = r.prepare(b)
        r.prime(inp)
        c = {"tokens": int(sum(p for p, _ in pf) + len(dec)), "state_before": nvml()}
        c["whole"] = prof.clock.median(lambda t: r.forward(inp, PARTS, t))
        for p in ("linear", "write", "sample"):
            c[p] = prof.clock.median(lambda t, p=p: r.forward(inp, (p,), t))
        c["attn_in_step"] = prof._attention_in_step(b)
        c["linear_in_step"] = c["whole"] - c["attn_in_step"] - c["write"] - c["sample"]
        c["state_after"] = nvml()
        return c

    for order in (list(cases), list(reversed(cases))):
        one = {}
        for name in order:
            one[name] = one_case(*cases[name])
            print(name, {k: (round(v, 5) if isinstance(v, float) else v) for k, v in one[name].items()}, flush=True)
        res["passes"].append(one)
    widest = max(cases, key=lambda k: sum(p for p, _ in cases[k][0]) + len(cases[k][1]))
    inp = r.prepare(prof.batch(prefills=cases[widest][0], decodes=cases[widest][1]))

    def timed() -> float:
        t = SegmentTimer(LEAD_S)
        r.forward(inp, ("linear",), t)
        return t.seconds()
    torch.cuda.synchronize()
    time.sleep(idle_s)
    state = nvml()
    after_idle = timed()
    series = [timed() for _ in range(10)]
    res["linear_widest"] = {"case": widest, "idle_s": idle_s, "state_after_idle": state, "after_idle": after_idle,
                            "series": series, "state_after_series": nvml()}
    print("linear", widest, "after idle", round(after_idle, 5), "series", [round(x, 5) for x in series], flush=True)
    if sweep:
        res["sweep"] = linear_sweep(prof, idle_s, nvml)
    if off:
        res["offgrid"] = offgrid(prof, max_len)
    return res


def linear_sweep(prof, idle_s: float, nvml) -> dict:
    """The linear layers alone at 512, 2,048, 4,096 and 8,192 tokens (those within the model's length),
    each after `idle_s` of idle, then within a sweep over the profile's linear token counts up to
    8,192 in rising order, back to back, as every committed profile's linear table is timed (alone: its
    points above 4,096 tokens here too), then after idle again, then within the same counts interleaved
    (smallest and largest in turn, as `blocksim profile` times it)."""
    import torch

    from validation.profile import LINEAR_TOKENS, interleaved
    top = prof.dims.max_model_len
    points = [n for n in (512, 2048, 4096, 8192) if n <= top]

    def alone(n: int) -> float:
        torch.cuda.synchronize()
        time.sleep(idle_s)
        return prof.linear_alone(n)

    def swept_in(order) -> tuple[dict, dict]:
        """Every count of `order` timed back to back; the times and NVML states at `points`."""
        got, states, t0 = {}, {}, time.perf_counter()
        for n in order:
            v = prof.linear_alone(n)
            if n in points:
                got[n], states[n] = v, {**nvml(), "since_start_s": round(time.perf_counter() - t0, 1)}
        return got, states
    counts = [n for n in LINEAR_TOKENS if n <= max(points)]
    before = {n: alone(n) for n in points}
    swept, states = swept_in(counts)
    after = {n: alone(n) for n in points}
    # the same counts interleaved, smallest and largest in turn (the mean power of the rising sweep,
    # spread over it): whether an order of the table's points keeps its large ones off the sweep's heat
    inter, inter_states = swept_in(interleaved(counts))
    out = {"idle_s": idle_s, "points": points, "before": before, "swept": swept, "after": after, "states": states,
           "interleaved": inter, "interleaved_states": inter_states}
    print("sweep", {n: (round(before[n] * 1e3, 2), round(swept[n] * 1e3, 2), round(after[n] * 1e3, 2),
                        round(inter[n] * 1e3, 2)) for n in points}, flush=True)
    return out


def prices(res: dict, profile: str) -> dict:
    """Each case priced by the profiled cost model with `profile`, as the engine prices a step
    (`blocksim/engine/engine.py`): the linear part with its writes and sampling (every prompt
    samples here), prefill and decode attention, the eager overhead."""
    import numpy as np

    from blocksim.cost import ProfiledCostModel, load_profile
    from blocksim.cost.step import step_times
    from blocksim.experiments.runner import build_config
    prof = load_profile(profile)
    cm = ProfiledCostModel(build_config("vllm", model=res["model"], gpu=prof.gpu), prof)
    out = {}
    for name, c in res["passes"][0].items():
        pf, dec = (CHUNKED_CASES.get(name) or CASES.get(name) or (res.get("prefills", {}).get(name), []))
        new = np.asarray([n for n, _ in pf], np.int64)
        cached = np.asarray([k for _, k in pf], np.int64)
        longest = max(dec) if dec and cm.prices_longest_row else None
        out[name] = sum(step_times(cm, new, cached, len(dec), int(sum(dec)), decode_only=False,
                                   sampled=len(pf) + len(dec), active=True, longest=longest).values())
    return out


#: `--offgrid`: the linear table's grid points (multiples of 64 up to 4,096, of 512 above) against
#: token counts just off them, as most steps have
OFFGRID = ((512, (511, 500, 480)), (2048, (2047, 2040, 2000)), (4096, (4095, 4090, 4000)),
           (6144, (6143, 6100)), (8192, (8191, 8190, 8100)))


def offgrid(prof, top: int, rounds: int = 3) -> list[dict]:
    """The linear layers alone at each grid point and at the counts just below it, timed in turns
    (`rounds` alternations, the order reversed each round) so that heat and power touch both alike."""
    out = []
    for grid, near in OFFGRID:
        if grid > top:
            continue
        counts = [grid, *near]
        times = {n: [] for n in counts}
        for i in range(rounds):
            for n in (counts if i % 2 == 0 else counts[::-1]):
                times[n].append(prof.linear_alone(n))
        row = {"grid": grid, "seconds": {n: float(sorted(v)[len(v) // 2]) for n, v in times.items()}}
        out.append(row)
        print("offgrid", grid, {n: f"{v / row['seconds'][grid] - 1:+.2%}" for n, v in row["seconds"].items()},
              flush=True)
    return out


def report(res: dict, profile: str | None = None) -> None:
    print(f"{res['model']} on {res['device']}")
    priced = prices(res, profile) if profile else {}
    print("pass  case        tokens   whole ms  profile's sum  lin alone  lin in step  whole / 2x half  MHz before/after")
    for i, one in enumerate(res["passes"]):
        for name, c in one.items():
            m = re.fullmatch(r"(\d+)x(\d+)(\+\d+)?", name)
            n_prompts, per = (int(m.group(1)), int(m.group(2))) if m else (1, 0)
            half = f"1x{per * n_prompts // 2}" if n_prompts > 1 else None
            ref = one.get(half) if half else None
            ratio = f"{c['whole'] / (2 * ref['whole']):.4f}" if ref and "+" not in name else "-"
            summed = c["linear"] + c["attn_in_step"] + c["write"] + c["sample"]
            price = f"  price {priced[name] / c['whole'] - 1:+.2%}" if name in priced else ""
            print(f"{i}     {name:12s} {c['tokens']:6d} {c['whole'] * 1e3:10.2f} {summed / c['whole'] - 1:+13.2%} "
                  f"{c['linear'] * 1e3:10.2f} {c['linear_in_step'] * 1e3:12.2f} {ratio:>16s}  "
                  f"{c['state_before'].get('sm_clock_mhz')}/{c['state_after'].get('sm_clock_mhz')}{price}  "
                  f"attn in step {c['attn_in_step'] * 1e3:.3f} ms")
    sw = res.get("sweep")
    if sw:
        print("linear alone, ms: after idle before the sweep / within the sweep / after idle after it")
        for n in sw["points"]:
            b, w_, a = (sw[k][str(n)] if str(n) in sw[k] else sw[k][n] for k in ("before", "swept", "after"))
            st = sw["states"].get(str(n), sw["states"].get(n, {}))
            inter = sw.get("interleaved", {})
            iv = inter.get(str(n), inter.get(n))
            tail = f"; interleaved {iv / b - 1:+.2%}" if iv else ""
            print(f"  {n:5d} tokens  {b * 1e3:8.2f} / {w_ * 1e3:8.2f} / {a * 1e3:8.2f}  (sweep {w_ / b - 1:+.2%}; "
                  f"{st.get('since_start_s')} s into it, {st.get('sm_clock_mhz')} MHz, {st.get('power_w')} W, "
                  f"{st.get('temp_c')} C{tail})")
    for row in res.get("offgrid", []):
        sec = {int(k): v for k, v in row["seconds"].items()}
        g = sec[row["grid"]]
        print(f"linear alone off the grid point {row['grid']}: " + ", ".join(
            f"{n} {(v / g - 1) * 100:+.2f}%" for n, v in sec.items() if n != row["grid"]) + f" (grid {g * 1e3:.2f} ms)")
    w = res["linear_widest"]
    print(f"linear of {w['case']} alone: after {w['idle_s']} s idle {w['after_idle'] * 1e3:.2f} ms, then "
          f"{', '.join('%.2f' % (x * 1e3) for x in w['series'])} ms "
          f"(MHz {w['state_after_idle'].get('sm_clock_mhz')} -> {w['state_after_series'].get('sm_clock_mhz')}, "
          f"W {w['state_after_idle'].get('power_w')} -> {w['state_after_series'].get('power_w')})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--out", help="write the measurements here (JSON)")
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--sweep", action="store_true",
                    help="also the linear layers within a sweep like the profile's linear table against the same "
                         "points after idle (about a minute more)")
    ap.add_argument("--offgrid", action="store_true",
                    help="also the linear layers at the linear table's grid points against counts just below them, "
                         "in turns (about half a minute more)")
    ap.add_argument("--cases", choices=("wide", "chunked", "placement", "placement2"), default="wide",
                    help="wide: prompt steps of 2,048-8,192 tokens (default); chunked: vllm-chunked's steps of one "
                         "chunk over cached keys and of two chunks; placement: two-chunk steps held out from chunked, chosen by "
                         "benchmarks/prefill_placement.py; placement2: single chunks of 257-511 tokens over cached keys and two-chunk "
                         "steps over 1,000 and 6,000 cached keys, held out from both")
    ap.add_argument("--report", metavar="JSON", help="print a measured file's table instead of measuring")
    ap.add_argument("--profile", metavar="FILE", help="with --report: each case's price by this cost profile "
                                                      "against the whole step measured")
    a = ap.parse_args()
    if a.report:
        report(json.loads(Path(a.report).read_text()), a.profile)
        return 0
    if not a.out:
        ap.error("--out is required when measuring")
    res = measure(a.model, a.idle_s, a.sweep, a.cases, a.offgrid)
    Path(a.out).write_text(json.dumps(res, indent=1, default=float))
    report(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
