"""Adds the tier tables of a `benchmarks/tier_bandwidth.py` result to a cost profile.

    PYTHONPATH=. python benchmarks/tier_bandwidth_merge.py benchmarks/results/tier-h200.json \
        blocksim/profiles/llama-3-8b__h200-141gb__float16__tp1.json

The result must be for the profile's model, GPU, dtype and block size; its five ``tier_*``
components replace any the profile has, and ``tier_disk_io`` / ``tier_command`` record how they
were measured. The merged profile is read back with the profile loader before it is written.
Bad input: one line, exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(result: dict, profile: dict) -> dict:
    for key in ("model", "gpu", "dtype", "block_size"):
        if result.get(key) != profile.get(key):
            raise ValueError(f"the result is for {key} {result.get(key)!r}, the profile for {profile.get(key)!r}; "
                             f"measure the tiers for the profile's {key}")
    comps = {k: v for k, v in result["components"].items() if k.startswith("tier_")}
    out = dict(profile)
    out["components"] = {**profile["components"], **comps}
    out["tier_disk_io"] = f"{result['disk_mode']} ({result['disk_reason']})"
    out["tier_command"] = result["command"]
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: tier_bandwidth_merge.py RESULT.json PROFILE.json", file=sys.stderr)
        return 2
    from blocksim.config import ConfigError
    from blocksim.cost.profile_file import TIER_COMPONENTS, parse_profile
    res_path, prof_path = Path(args[0]), Path(args[1])
    try:
        result, profile = json.loads(res_path.read_text()), json.loads(prof_path.read_text())
        merged = merge(result, profile)
        parsed = parse_profile(merged, str(prof_path))
    except (OSError, json.JSONDecodeError, KeyError, ValueError, ConfigError) as e:
        print(f"tier_bandwidth_merge: {res_path} into {prof_path}: {e}", file=sys.stderr)
        return 2
    missing = [c for c in TIER_COMPONENTS if c not in parsed.tables]
    if missing:
        print(f"tier_bandwidth_merge: {res_path} lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    prof_path.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"{prof_path}: tier tables from {res_path} ({merged['tier_disk_io']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
