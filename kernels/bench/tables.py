"""The printed output of ``python -m kernels.bench`` back into data: the device lines and every
Markdown table under its ``## `` title, cells as numbers where they are numbers.

    python -m kernels.bench.tables bench_output.txt > kernels/results/h200.json

(a run's ``--json`` file holds the same measurements unrounded; this reads a saved console output.)
"""

from __future__ import annotations

import json
import re
import sys

_DEVICE = re.compile(r"device: (?P<device>.+), torch (?P<torch>\S+), CUDA (?P<cuda>\S+)$")
_COPY = re.compile(r"device copy bandwidth (?P<when>\(read \+ write\)|after the run): (?P<gbs>[\d.]+) GB/s")


def cell(text: str):
    """``"0.2417"`` -> 0.2417, ``"4442"`` -> 4442, anything else stays text."""
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+)(e[+-]?\d+)?|[+-]?\d+e[+-]?\d+", text):
        return float(text)
    return text


def parse(text: str) -> dict:
    """``{"device", "torch", "cuda", "copy_gbs", "copy_gbs_after", "sections": {title: {"notes":
    [...], "rows": [{column: value}]}}}`` of one bench output (keys absent where the output has no
    such line)."""
    out: dict = {"sections": {}}
    section = None
    header = None
    for line in text.splitlines():
        line = line.rstrip()
        if m := _DEVICE.match(line):
            out.update(m.groupdict())
        elif m := _COPY.match(line):
            out["copy_gbs" if m["when"].startswith("(") else "copy_gbs_after"] = float(m["gbs"])
        elif line.startswith("## "):
            section = out["sections"].setdefault(line[3:].strip(), {"notes": [], "rows": []})
            header = None
        elif section is None:
            continue
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
                section["rows"].append(dict(zip(header, map(cell, cells))))
        elif line:
            section["notes"].append(line)
            header = None
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m kernels.bench.tables BENCH_OUTPUT.txt", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        json.dump(parse(f.read()), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
