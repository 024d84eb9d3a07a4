"""Diagnose the gap between an eager prompt step timed as the profile times it and as the executor
does (on a GPU): the same step, timed in different contexts.

    PYTHONPATH=. python benchmarks/eager_gap.py --model llama-2-7b --out OUT.json

Contexts, each timed with `SegmentTimer` as the executor times an eager step:
  profile   the profile's clock: one warm-up, then the median of back-to-back repetitions;
  parts     the sum of the components timed alone (linear, write, attn, sample);
  parts_in_step  the same with the attention timed inside the whole step (as the profile times it);
  combos    pairs and triples of components run together;
  after_graphs  once after 30 replays of a decode CUDA graph (an executor's run between prompts);
  after_idle    once after the host idled 50 ms with the GPU drained;
  series    ten back-to-back repetitions (a trend shows clock or power throttling);
  lead      the step with 0.3 ms, 1.2 ms and 5 ms sleeps before each segment.
SM clock (MHz) and power (W) from NVML are read before each timed context where torch exposes them.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from blocksim.catalog import MODELS
from validation.model import SegmentTimer
from validation.profile import Profiler
from validation.sleeps import LEAD_S

PARTS = ("linear", "write", "attn", "sample")


def nvml():
    out = {}
    for name, fn in (("sm_clock_mhz", "clock_rate"), ("power_w", "power_draw"), ("temp_c", "temperature")):
        try:
            v = getattr(torch.cuda, fn)()
            out[name] = v / 1000 if name == "power_w" else v
        except Exception as e:  # noqa: BLE001 (not all builds expose NVML)
            out[name] = repr(e)[:60]
    return out


def timed(fn, lead=LEAD_S):
    t = SegmentTimer(lead)
    fn(t)
    return t.seconds()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    prof = Profiler(MODELS[a.model], progress=False)
    r = prof.runner
    res = {"model": a.model, "device": torch.cuda.get_device_name(), "lead_s": LEAD_S, "cases": {}}
    r.capture_decode_graphs(8, sizes=[8])
    dec = prof.batch(decodes=[1024] * 8)
    for name, pf, decodes in (("p4096_d6", [(4096, 0)], [1024] * 6), ("p1024+512", [(1024, 0), (512, 0)], []),
                              ("p512_d8", [(512, 0)], [1024] * 8)):
        b = prof.batch(prefills=pf, decodes=decodes)
        inp = r.prepare(b)
        whole = lambda t, parts=PARTS: r.forward(inp, parts, t)  # noqa: E731
        c = {"state_before": nvml()}
        c["profile"] = prof.clock.median(whole)
        c["parts"] = {p: prof.clock.median(lambda t, p=p: r.forward(inp, (p,), t)) for p in PARTS}
        c["parts_sum"] = sum(c["parts"].values())
        c["attn_in_step"] = prof._attention_in_step(b)
        c["parts_in_step_sum"] = c["parts_sum"] - c["parts"]["attn"] + c["attn_in_step"]
        c["combos"] = {"+".join(ps): prof.clock.median(lambda t, ps=ps: r.forward(inp, ps, t))
                       for ps in (("linear", "write"), ("linear", "attn"), ("linear", "write", "attn"),
                                  ("write", "attn"))}
        ag = []
        for _ in range(5):
            r.load_decode(dec, 8)
            for _ in range(30):
                r.replay_decode(8)
            inp = r.prepare(b)
            ag.append(timed(whole))
        c["after_graphs"] = ag
        ai = []
        for _ in range(5):
            torch.cuda.synchronize()
            time.sleep(0.05)
            ai.append(timed(whole))
        c["after_idle"] = ai
        c["state_mid"] = nvml()
        torch.cuda.synchronize()
        c["series"] = [timed(whole) for _ in range(10)]
        c["state_after_series"] = nvml()
        c["lead"] = {str(s): float(np.median([timed(whole, s) for _ in range(3)])) for s in (3e-4, 1.2e-3, 5e-3)}
        res["cases"][name] = c
        print(name, json.dumps({k: v for k, v in c.items() if k != "parts"}, default=float)[:900], flush=True)
    # New shapes: each token count timed on its first call, bare or after `prime`, and again warm.
    shapes = {"first": [], "primed": [], "warm_first": [], "warm_primed": []}
    for i, n in enumerate((300, 700, 1500, 2900, 5000, 333, 777, 1555, 2999, 5111)):
        b = prof.batch(prefills=[(n, 0)], decodes=[1024] * 4)
        inp = r.prepare(b)
        whole = lambda t, inp=inp: r.forward(inp, PARTS, t)  # noqa: E731
        torch.cuda.synchronize()
        key = "first" if i % 2 == 0 else "primed"
        if key == "primed":
            r.prime(inp)
        shapes[key].append((n, timed(whole)))
        shapes["warm_" + key].append((n, float(np.median([timed(whole) for _ in range(3)]))))
    res["new_shapes"] = shapes
    print("new shapes", json.dumps(shapes), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
