"""CPU seconds of the Mooncake synthetic trace under vllm-v1 without tiers and with host + disk tiers
(one-block chunks, wait), the engine's run five times each in one process, best of each; appends a
row to a JSON list. Run it on two trees in turn to compare them:

    python benchmarks/block_keys_speed.py TREE [--json OUT]

TREE: the repository tree whose code runs (its benchmarks/tiers_speed.py configuration: llama-2-7b on
h100-80gb, the built-in roofline, prompts clipped to the model). Needs ../shared/traces beside TREE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tree")
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    sys.path.insert(0, str(Path(a.tree).resolve()))
    from benchmarks.tiers_speed import PROFILE, THREE, TRACE, Engine, build_config, load_trace, make_cost_model

    base = build_config("vllm-v1", cost_profile=PROFILE)
    trace = load_trace(str(TRACE), clip_max_len=base.model.max_model_len)
    configs = {"gpu_only_cpu_s": base, "three_tiers_one_block_wait_cpu_s": build_config("vllm-v1", cost_profile=PROFILE,
                                                                                        **THREE)}
    best = dict.fromkeys(configs, float("inf"))
    for _ in range(a.repeats):
        for name, cfg in configs.items():
            engine = Engine(cfg, trace, make_cost_model(cfg, PROFILE))
            t0 = time.process_time()
            engine.run()
            best[name] = min(best[name], time.process_time() - t0)
    row = {"code": str(a.tree), **best, "ratio": best["three_tiers_one_block_wait_cpu_s"] / best["gpu_only_cpu_s"],
           "load_average": os.getloadavg()}
    print(json.dumps(row))
    if a.json:
        rows = json.loads(Path(a.json).read_text()) if Path(a.json).exists() else []
        Path(a.json).write_text(json.dumps(rows + [row], indent=1) + "\n")


if __name__ == "__main__":
    main()
