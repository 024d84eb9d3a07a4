"""Service-level objectives given on the command line: ``ttft=2s,tpot=100ms,e2e=30s``.

Pure Python (the SLO keys come from `blocksim.records.schema`), so the CLI can validate ``--slo``
without loading pandas.
"""

from __future__ import annotations

import re

from blocksim.records.schema import SLO_COLUMNS  # SLO keys and the request column each bounds

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3}
_SLO_ITEM = re.compile(r"^\s*([a-z_0-9]+)\s*=\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ms|s)\s*$")


def parse_slo(text: str | None) -> dict[str, float]:
    """Parse ``"ttft=2s,tpot=100ms,e2e=30s"`` into ``{"ttft": 2.0, "tpot": 0.1, "e2e": 30.0}``.

    Every bound needs a unit (``s`` or ``ms``); keys are those of ``SLO_COLUMNS``.
    An empty or None string is no SLO (``{}``).
    """
    if not text or not text.strip():
        return {}
    slo: dict[str, float] = {}
    for item in text.split(","):
        match = _SLO_ITEM.match(item.lower())
        if not match:
            raise ValueError(
                f"SLO item {item.strip()!r} is not KEY=NUMBER<s|ms> (e.g. ttft=2s,tpot=100ms)"
            )
        key, number, unit = match.groups()
        if key not in SLO_COLUMNS:
            raise ValueError(f"unknown SLO key {key!r}; known keys: {', '.join(SLO_COLUMNS)}")
        if key in slo:
            raise ValueError(f"SLO key {key!r} given twice")
        slo[key] = float(number) * _UNIT_SECONDS[unit]
    return slo


def format_slo(slo: dict[str, float]) -> str:
    """The inverse of ``parse_slo`` in milliseconds, for captions: ``ttft=2000ms,tpot=100ms``."""
    return ",".join(f"{k}={v * 1e3:g}ms" for k, v in slo.items())
