"""Carry one table of a cost profile into another profile of the same model, GPU, dtype and
tensor-parallel degree, measured on another lease:

    python benchmarks/profile_carry_table.py SOURCE.json DEST.json --table decode_step_shared

For a table the destination's lease did not measure (`blocksim profile --leave-out`) and the
device time to add it (`--add-table`) was not there. Only the tables `--add-table` can measure
alone are carried: their `measured` record (device, torch, command, UTC, seconds) stays with them,
and gains `carried_from` (the source profile's file name and creation time), so that the
destination names the lease each of its tables comes from. DEST is rewritten in place, whole or
not at all, and only if the simulator's loader reads the result.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the profile header fields two profiles must share for a table to move between them
SAME = ("format", "model", "gpu", "dtype", "kv_dtype", "tensor_parallel", "block_size")


class CarryError(Exception):
    pass


def _read(path: Path) -> dict:
    """The profile at `path` as its JSON object, once the simulator's loader reads it."""
    from blocksim.config import ConfigError
    from blocksim.cost.profile_file import load_profile, read_json
    try:
        load_profile(path)
        return read_json(path)
    except ConfigError as e:
        raise CarryError(f"{e}; give a file `blocksim profile` wrote") from None


def carry(source: dict, dest: dict, table: str, source_name: str) -> dict:
    """`dest` with `source`'s `table`, its `measured` record kept (built from the source's header
    where the table was measured with the whole source profile) and `carried_from` added."""
    from validation.profile import ADDABLE

    if table not in ADDABLE:
        raise CarryError(f"--table {table}: only tables `blocksim profile --add-table` measures alone can be "
                         f"carried; name one of {', '.join(ADDABLE)}")
    for key in SAME:
        if source.get(key) != dest.get(key):
            raise CarryError(f"{key}: the source profile has {source.get(key)!r}, the destination "
                             f"{dest.get(key)!r}; carry tables between profiles of one model, GPU, dtype and "
                             f"tensor-parallel degree")
    comp = source["components"].get(table)
    if not isinstance(comp, dict):
        raise CarryError(f"--table {table}: the source profile has no such table; name one it holds "
                         f"({', '.join(sorted(source['components']))})")
    comp = copy.deepcopy(comp)
    measured = comp.get("measured")
    if not isinstance(measured, dict):
        secs = {k: v for k, v in (source.get("measure_s") or {}).items() if table in k.split(", ")}
        measured = {"device": source.get("device"), "torch": source.get("torch"), "command": source.get("command"),
                    "utc": source.get("created_utc"), "measure_s": sum(secs.values()) if secs else None}
    measured["carried_from"] = {"profile": source_name, "created_utc": source.get("created_utc")}
    comp["measured"] = measured
    out = copy.deepcopy(dest)
    out["components"][table] = comp
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--table", required=True)
    a = p.parse_args(argv)
    try:
        out = carry(_read(a.source), _read(a.dest), a.table, a.source.name)
    except CarryError as e:
        print(f"profile_carry_table.py: {e}", file=sys.stderr)
        return 2
    from validation.profile import ProfileError, _write_whole
    try:
        _write_whole(a.dest, out)  # checked by the simulator's loader, then moved into place
    except ProfileError as e:
        print(f"profile_carry_table.py: {e}", file=sys.stderr)
        return 2
    print(f"profile_carry_table.py: {a.table} of {a.source} carried into {a.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
