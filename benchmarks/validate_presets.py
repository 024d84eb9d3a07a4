"""Record plans of the engines' presets and validate them with the kernels (cuda on a GPU).

    python benchmarks/validate_presets.py OUT_DIR [--backend cuda|reference]

Three plans: vllm-v1 on 120 bundled Azure conversation requests (600 GPU blocks: preemptions);
vllm-v1 on 300 bundled Mooncake requests at 4x their rate (llama-3-8b, 1,200 blocks: prefix hits,
hits on blocks scheduled in the same step); vllm-0.6 with prefix caching and swap preemption on the
same Mooncake slice (700 blocks: swap-ins that reuse cached GPU copies). Prints one line per plan
with the validation summary; exits 1 when a plan fails its checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import traces
from blocksim.engine import Engine
from blocksim.experiments.runner import build_config
from validation.validate import validate_run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--backend", default="cuda", choices=("cuda", "reference"))
    a = p.parse_args()
    conv = traces.head(traces.read_trace(traces.bundled("azure-conv")), 120)
    moon = traces.head(traces.read_trace(traces.bundled("mooncake")), 300)
    moon, _ = traces.clip_to_max_len(moon, 8192)
    moon = traces.scale_rate(moon, 4)
    cases = [("v1-conv", "vllm-v1", conv, {"num_gpu_blocks": 600}),
             ("v1-mooncake", "vllm-v1", moon, {"model": "llama-3-8b", "num_gpu_blocks": 1200}),
             ("v06-mooncake-swap", "vllm-0.6", moon, {"model": "llama-3-8b", "prefix_caching": True,
                                                       "num_gpu_blocks": 700, "preemption": "swap"})]
    ok = True
    for name, policy, trace, options in cases:
        run_dir = f"{a.out}/{name}"
        r = Engine(build_config(policy, **options), trace, plan_dir=run_dir).run()
        t = time.perf_counter()
        s = validate_run(run_dir, a.backend)
        ok &= bool(s["ok"])
        print(name, policy, json.dumps(options), f"preemptions={r.summary['preemptions']}",
              f"prefix_cache_hits={r.summary.get('prefix_cache_hits')}",
              json.dumps({k: s.get(k) for k in ("ok", "steps_checked", "steps_in_plan", "error")}),
              f"{time.perf_counter() - t:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
