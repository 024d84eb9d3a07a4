"""Sweep specifications: the YAML file, its validation, and the grid of points it names.

A spec names ``trace`` (a path, ``bundled:NAME``, or a list of them), ``base`` (options every
point shares: ``policy``, ``max_requests``, ``rate_scale`` and any ``blocksim.experiments.runner`` option),
``axes`` (option -> list of values; the grid is their product, times the traces, times
``seeds``), and optionally ``slo`` and ``report``. See docs/sweeps.md.

Every point is validated before anything runs (``build_config`` for each one), so a typo in an
axis name or a bad value fails at once, naming the point.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import traces
from analysis.slo import parse_slo
from blocksim import options
from blocksim.config import ConfigError

SPEC_KEYS = ("name", "trace", "base", "axes", "seeds", "slo", "report")
REPORT_KEYS = ("x", "y")
#: Short names in run directory names (anything else is written in full): the options' own, and the seed's.
_SHORT = {**options.SHORT_NAMES, "seed": "s"}
#: Options a point applies itself rather than passing them to replay as overrides.
_APPLIED_BY_POINT = ("policy", "rate_scale", "max_requests", "seed")


class SpecError(ValueError):
    """A sweep spec that cannot run: bad YAML, unknown keys or axes, a point the simulator refuses."""


@dataclass(frozen=True)
class TraceRef:
    """One trace of the sweep: ``label`` (the ``trace`` column) and where it comes from."""

    label: str
    source: str  # "bundled:NAME" or an absolute path

    def path(self) -> Path:
        if self.source.startswith("bundled:"):
            return traces.bundled(self.source.split(":", 1)[1])
        return Path(self.source)


@dataclass(frozen=True)
class Point:
    """One run: a trace and its options (``policy``, ``rate_scale``, ``max_requests``, ``seed``,
    runner overrides). ``varying`` are the keys that differ across the grid (the axes)."""

    trace: str
    params: dict
    varying: tuple = ()

    @property
    def policy(self) -> str:
        return str(self.params.get("policy", "vllm"))

    @property
    def rate_scale(self) -> float:
        return float(self.params.get("rate_scale", 1.0))

    @property
    def seed(self) -> int | None:
        return self.params.get("seed")

    @property
    def max_requests(self) -> int | None:
        return self.params.get("max_requests")

    def overrides(self) -> dict:
        """The `blocksim.experiments.runner.replay` overrides: every option but those the point applies
        itself (policy and rate scale as keywords, ``max_requests`` and ``seed`` in `points.shape_trace`)."""
        return {k: v for k, v in self.params.items() if k not in _APPLIED_BY_POINT}

    def with_rate(self, rate_scale: float) -> Point:
        varying = self.varying if "rate_scale" in self.varying else (*self.varying, "rate_scale")
        return Point(self.trace, {**self.params, "rate_scale": float(rate_scale)}, varying)

    def key(self) -> str:
        """A hash of everything that determines the run (trace label and every option)."""
        blob = json.dumps({"trace": self.trace, **self.params}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:8]

    def name(self) -> str:
        """Stable, readable run directory name: ``<trace>_<policy>_<axis values>_<hash>``."""
        parts = [self.trace]
        if "policy" in self.varying:
            parts.append(self.policy)
        for k in self.varying:
            if k not in ("policy", "trace"):
                v = self.params.get(k)
                v = f"{v:g}" if isinstance(v, float) else str(v)
                parts.append(f"{_SHORT.get(k, k)}{v}")
        readable = "_".join(re.sub(r"[^A-Za-z0-9.=+-]+", "-", p) for p in parts)
        return f"{readable[:120]}_{self.key()}"


@dataclass
class SweepSpec:
    traces: list[TraceRef]
    base: dict
    axes: dict[str, list]
    seeds: list | None = None
    slo: str | None = None
    name: str = "sweep"
    report: dict = field(default_factory=dict)

    def points(self) -> list[Point]:
        """The grid: traces x axes product x seeds, in spec order (the first axis varies slowest)."""
        varying = tuple(self.axes) + (("seed",) if self.seeds else ())
        out = []
        for tr in self.traces:
            for values in itertools.product(*self.axes.values()):
                params = {**self.base, **dict(zip(self.axes, values))}
                for seed in self.seeds or [None]:
                    p = dict(params) if seed is None else {**params, "seed": seed}
                    out.append(Point(tr.label, p, varying))
        return out

    def to_dict(self) -> dict:
        d = {"name": self.name, "trace": [t.source for t in self.traces], "base": self.base, "axes": self.axes}
        if self.seeds:
            d["seeds"] = self.seeds
        if self.slo:
            d["slo"] = self.slo
        if self.report:
            d["report"] = self.report
        return d


def _trace_refs(value, base_dir: Path) -> list[TraceRef]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, (str, Path)) for v in items):
        raise SpecError("'trace' must be a path, 'bundled:NAME', or a non-empty list of them")
    refs: list[TraceRef] = []
    for item in map(str, items):
        if item.startswith("bundled:"):
            name = item.split(":", 1)[1]
            if name not in traces.bundled_names():
                raise SpecError(f"trace {item!r}: no bundled trace {name!r}; choose one of "
                                f"{', '.join(traces.bundled_names())}")
            label, source = name, item
        else:
            path = Path(item).expanduser()
            path = path if path.is_absolute() else (base_dir / path)
            if not path.exists():
                raise SpecError(f"trace {item!r}: no such file ({path}); relative paths are read from the "
                                f"spec's folder, or name a bundled trace (bundled:NAME)")
            label, source = path.stem, str(path.resolve())
        taken = {r.label for r in refs}
        unique, k = label, 2
        while unique in taken:
            unique, k = f"{label}-{k}", k + 1
        refs.append(TraceRef(unique, source))
    return refs


def _check_name(key: str, where: str) -> None:
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise SpecError(f"{where}: {key!r} is not an option name")
    if key in ("trace", "seed", "seeds"):
        raise SpecError(f"{where}: {key!r} is set by the top-level 'trace:' / 'seeds:' keys, not here")


def parse_spec(data: Any, base_dir: str | Path = ".") -> SweepSpec:
    """A `SweepSpec` from the loaded YAML mapping; relative trace paths are read from ``base_dir``."""
    if not isinstance(data, dict):
        raise SpecError(f"a sweep spec is a YAML mapping with {', '.join(SPEC_KEYS)}; got {type(data).__name__}")
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise SpecError(f"unknown top-level key(s) {unknown}; known: {', '.join(SPEC_KEYS)}")
    if "trace" not in data:
        raise SpecError("the spec needs 'trace:' (a path, 'bundled:NAME', or a list of them)")
    base = data.get("base") or {}
    axes = data.get("axes") or {}
    if not isinstance(base, dict):
        raise SpecError("'base' must be a mapping of option -> value")
    if not isinstance(axes, dict):
        raise SpecError("'axes' must be a mapping of option -> list of values")
    for k in base:
        _check_name(k, "base")
    for k, values in axes.items():
        _check_name(k, "axes")
        if not isinstance(values, list) or not values:
            raise SpecError(f"axis {k!r}: needs a non-empty list of values, got {values!r}")
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) != len(values):
            raise SpecError(f"axis {k!r}: repeated values in {values}")
    seeds = data.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not seeds
                              or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise SpecError(f"'seeds' must be a non-empty list of integers, got {seeds!r}")
    report = data.get("report") or {}
    if not isinstance(report, dict) or any(k not in REPORT_KEYS for k in report):
        raise SpecError(f"'report' takes {', '.join(REPORT_KEYS)} (the heatmap's axes), got {report!r}")
    slo = data.get("slo")
    if slo is not None:
        try:
            parse_slo(str(slo))
        except ValueError as exc:
            raise SpecError(f"slo: {exc}") from None
    spec = SweepSpec(traces=_trace_refs(data["trace"], Path(base_dir)), base=dict(base), axes=dict(axes),
                     seeds=seeds, slo=None if slo is None else str(slo), name=str(data.get("name") or "sweep"),
                     report=dict(report))
    for key in ("x", "y"):
        if key in report and report[key] not in (*spec.axes, "trace", "seed"):
            raise SpecError(f"report.{key}: {report[key]!r} is not an axis ({', '.join(spec.axes)})")
    return spec


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a spec file (the grid itself is checked by `validate_points`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    try:
        return parse_spec(data, path.parent)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def describe(point: Point) -> str:
    """``trace=azure-conv policy=vllm block_size=7`` for messages."""
    shown = {k: point.params.get(k) for k in point.varying if k in point.params}
    return " ".join([f"trace={point.trace}", *(f"{k}={v}" for k, v in shown.items())])


def validate_points(points: list[Point]) -> None:
    """Build every point's configuration; the first one the simulator refuses raises `SpecError`."""
    # the runner imports the whole simulator: loaded when points are validated, not when the CLI starts
    from blocksim.experiments.runner import check_options

    for point in points:
        try:
            if not point.rate_scale > 0 or point.rate_scale == float("inf"):
                raise ValueError(f"rate_scale must be a finite number > 0, got {point.rate_scale}")
            mr = point.max_requests
            if mr is not None and (not isinstance(mr, int) or isinstance(mr, bool) or mr < 1):
                raise ValueError(f"max_requests must be a positive integer, got {mr!r}")
            check_options(point.policy, point.overrides())
        except (ConfigError, ValueError, TypeError, KeyError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise SpecError(f"point [{describe(point)}]: {msg}") from None
