"""Cost files: a measured profile ("blocksim-profile/1") or the roofline's parameters, read and checked.

``--cost-profile FILE`` takes either kind; the file's ``"format"`` key tells which:

* ``"blocksim-profile/1"``: step components measured on a GPU by ``blocksim profile`` (tables of
  seconds on grids; the keys are listed in `COMPONENT_AXES`). Read into a :class:`Profile`. The
  optional ``allreduce`` table (axes ``["bytes"]``) holds one all-reduce's seconds by message
  size among the profile's ``tensor_parallel`` GPUs; a profile at tensor_parallel > 1 measures its
  other tables on one rank without communication.
* ``"blocksim-roofline/1"``, or no ``"format"`` key: the roofline's `CostParams`, as
  ``{"params": {...}}`` or a flat object (what ``blocksim cost-fit --out`` and
  ``blocksim validate --calibrate-with`` write).

Any other format string is refused naming the file, the format found and the known ones. A
profile is checked whole when it is read: every table has its axes, a sorted grid per axis and
positive seconds of the grid's shape; a bad one is refused naming the file and the field. Unknown
components are ignored with a warning; extra keys are kept. Shipped profiles live in
``blocksim/profiles/<model>__<gpu>__<dtype>__tp<N>.json`` (`shipped_profile` finds one).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from blocksim.config import ConfigError, SimConfig
from blocksim.cost.roofline import CostParams

PROFILE_FORMAT = "blocksim-profile/1"
ROOFLINE_FORMAT = "blocksim-roofline/1"
KNOWN_FORMATS = (PROFILE_FORMAT, ROOFLINE_FORMAT)
PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"

#: Each table's axes, in order. `decode_step`, `decode_step_longest`, `decode_step_shared`,
#: `decode_step_padded`, `allreduce` and the tier tables are optional; the others are required.
COMPONENT_AXES: dict[str, tuple[str, ...]] = {
    "linear": ("tokens",),
    "attn_prefill": ("batch", "new_tokens", "cached_tokens"),
    "attn_decode": ("batch", "context"),
    "cache_write": ("tokens",),
    "sample": ("sequences",),
    "swap_out": ("blocks",),
    "swap_in": ("blocks",),
    "copy": ("blocks",),
    "decode_step": ("batch", "context"),
    # a whole graph step by its rows' mean context and its longest row over that mean
    "decode_step_longest": ("batch", "context", "longest"),
    # a whole graph step of equal rows in pairs, the second row of each reading the first's blocks but
    # its last (the prompt two samples of one request share); with `own_seconds`, the same rows each on
    # its own blocks measured alongside, and `shared_fraction`, the share of the step's context tokens
    # a row reads from blocks its pair's first row also reads
    "decode_step_shared": ("batch", "context"),
    # a whole graph step whose real rows are the fraction `real` of its padded batch (equal rows; the
    # others the executor's one-token padding rows), `context` the mean over the padded rows; with
    # `spread_seconds`, its twin of the same tokens spread over all the rows, measured alongside
    "decode_step_padded": ("batch", "real", "context"),
    "allreduce": ("bytes",),
    # tier transfers (`blocksim profile --tier-dir`): seconds to move `chunks` chunks of `chunk_bytes`
    "tier_gpu_host": ("chunk_bytes", "chunks"),
    "tier_host_gpu": ("chunk_bytes", "chunks"),
    "tier_host_disk": ("chunk_bytes", "chunks"),
    "tier_gpu_disk": ("chunk_bytes", "chunks"),
    "tier_disk_gpu": ("chunk_bytes", "chunks"),
    # host->disk into slots of the disk tier's file never written before (blocks allocated as written)
    "tier_host_disk_fresh": ("chunk_bytes", "chunks"),
}
TIER_COMPONENTS = ("tier_gpu_host", "tier_host_gpu", "tier_host_disk", "tier_gpu_disk", "tier_disk_gpu")
TIER_FRESH = "tier_host_disk_fresh"
OPTIONAL = ("decode_step", "decode_step_longest", "decode_step_shared", "decode_step_padded", "allreduce",
            *TIER_COMPONENTS, TIER_FRESH)
#: Header fields a profile must have, checked against the run's configuration where they name it.
HEADER = ("model", "gpu", "dtype", "tensor_parallel", "block_size", "cuda_graph_batch_sizes")


class ProfileWarning(UserWarning):
    """A profile read with something left out (an unknown component), or a run that left its grid."""


warnings.filterwarnings("always", category=ProfileWarning)  # every run's count, even when two runs agree


@dataclass(frozen=True)
class Grid:
    """One measured table: `axes` in order, a sorted grid per axis, and seconds of the grids' shape."""

    name: str
    axes: tuple[str, ...]
    grids: tuple[np.ndarray, ...]
    seconds: np.ndarray


@dataclass(frozen=True)
class Profile:
    """A validated "blocksim-profile/1" file."""

    path: str
    model: str
    gpu: str
    dtype: str
    kv_dtype: str
    tensor_parallel: int
    block_size: int
    cuda_graph_batch_sizes: tuple[int, ...]
    tables: dict[str, Grid]
    linear_graph: Grid | None          # linear replayed as a CUDA graph, on its own token grid
    overhead_eager_s: float
    overhead_graph_s: float
    header: dict = field(default_factory=dict)  # the file's other top-level fields (device, torch, command, ...)
    #: tables measured again into the profile (`blocksim profile --add-table`): name -> when (UTC)
    tables_measured: dict = field(default_factory=dict)

    def check_matches(self, config: SimConfig) -> None:
        """Refuse a profile measured for another model, GPU, dtype or tensor-parallel degree."""
        want = {"model": config.model.name, "gpu": config.gpu.name, "dtype": run_dtype(config),
                "tensor_parallel": config.tensor_parallel}
        for key, run_value in want.items():
            value = getattr(self, key)
            if value != run_value:
                raise ConfigError(
                    f"cost profile {self.path}: measured for {key} {value!r}, the run uses {key} {run_value!r}; "
                    f"profile the run's {key} (blocksim profile), pass the matching --cost-profile, "
                    f"or use --cost-model roofline")


def run_dtype(config: SimConfig) -> str:
    """The element type a run's model computes in: the catalog's 2-byte models are float16."""
    return {1: "int8", 2: "float16", 4: "float32"}[config.model.dtype_bytes]


def profile_name(model: str, gpu: str, dtype: str, tensor_parallel: int) -> str:
    return f"{model}__{gpu}__{dtype}__tp{tensor_parallel}.json"


def shipped_profile(config: SimConfig, directory: Path | None = None) -> Path | None:
    """The shipped profile of the run's (model, GPU, dtype, TP) in `directory` (default
    `PROFILES_DIR`), or None."""
    p = (directory or PROFILES_DIR) / profile_name(config.model.name, config.gpu.name, run_dtype(config), config.tensor_parallel)
    return p if p.is_file() else None


def portable_path(path: str | Path) -> str:
    """How summary.json names a profile: ``blocksim/profiles/NAME`` for a shipped one (found again on
    any machine by `resolve_path`), else the path as given."""
    p = Path(path)
    if p.parent.resolve() == PROFILES_DIR.resolve():
        return f"blocksim/profiles/{p.name}"
    return str(path)


def resolve_path(path: str | Path) -> Path:
    """A profile's file: the path itself, or a shipped profile named ``blocksim/profiles/NAME``."""
    p = Path(path)
    if not p.is_file() and str(path).startswith("blocksim/profiles/") and (PROFILES_DIR / p.name).is_file():
        return PROFILES_DIR / p.name
    return p


def shipped_profiles(directory: Path | None = None) -> list[str]:
    return sorted(p.name for p in (directory or PROFILES_DIR).glob("*.json"))


# --- reading ---------------------------------------------------------------------------------------
def read_json(path: str | Path) -> dict:
    p = resolve_path(path)
    if not p.is_file():
        raise ConfigError(f"cost profile {p}: not found")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"cost profile {p}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"cost profile {p}: the top level must be an object, got {type(data).__name__}")
    return data


def load_cost_file(path: str | Path) -> Profile | CostParams:
    """A profile or the roofline's parameters, by the file's ``"format"`` key; ConfigError when bad."""
    data = read_json(path)
    fmt = data.get("format")
    if fmt == PROFILE_FORMAT:
        return parse_profile(data, portable_path(resolve_path(path)))
    if fmt is None or fmt == ROOFLINE_FORMAT:
        return CostParams.from_dict(data, path)
    raise ConfigError(f"cost profile {path}: format {fmt!r} is not one this blocksim reads "
                      f"({', '.join(KNOWN_FORMATS)}, or no format key for roofline parameters)")


def load_profile(path: str | Path) -> Profile:
    """A "blocksim-profile/1" file; anything else is refused."""
    data = read_json(path)
    if data.get("format") != PROFILE_FORMAT:
        raise ConfigError(f"cost profile {path}: format {data.get('format')!r}, expected {PROFILE_FORMAT!r} "
                          f"(a file written by blocksim profile)")
    return parse_profile(data, portable_path(resolve_path(path)))


def _bad(path: str, where: str, msg: str) -> ConfigError:
    return ConfigError(f"cost profile {path}: {where}: {msg}")


def _grid(path: str, where: str, values) -> np.ndarray:
    try:
        g = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise _bad(path, where, "expected a list of numbers") from None
    if g.ndim != 1 or len(g) == 0:
        raise _bad(path, where, "expected a non-empty list of numbers")
    if not np.all(np.isfinite(g)) or (g < 0).any():
        raise _bad(path, where, "values must be finite and >= 0")
    if (np.diff(g) <= 0).any():
        raise _bad(path, where, "values must be strictly ascending")
    return g


def _seconds(path: str, where: str, values, shape: tuple[int, ...]) -> np.ndarray:
    try:
        s = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise _bad(path, where, f"expected nested lists of numbers of shape {list(shape)}") from None
    if s.shape != shape:
        raise _bad(path, where, f"shape {list(s.shape)} does not match the grid's {list(shape)}")
    if not np.all(np.isfinite(s)) or (s <= 0).any():
        raise _bad(path, where, "times must be finite and > 0 seconds")
    return s


def _shared_twins(path: str, spec: dict, paired: Grid) -> dict[str, Grid]:
    """``decode_step_shared``'s own-blocks seconds and shared fractions, as Grids of its grid
    (``decode_step_shared_own``, ``decode_step_shared_fraction``)."""
    w = "components.decode_step_shared"
    shape = paired.seconds.shape
    for key in ("own_seconds", "shared_fraction"):
        if key not in spec:
            raise _bad(path, w, f"missing {key} (the table's twin measured alongside it)")
    own = _seconds(path, f"{w}.own_seconds", spec["own_seconds"], shape)
    frac = _seconds(path, f"{w}.shared_fraction", spec["shared_fraction"], shape)  # finite, > 0, the shape
    if (frac > 0.5).any():
        raise _bad(path, f"{w}.shared_fraction", "expected fractions in (0, 0.5]: pairs share at most half the tokens")
    return {"decode_step_shared_own": Grid("decode_step_shared_own", paired.axes, paired.grids, own),
            "decode_step_shared_fraction": Grid("decode_step_shared_fraction", paired.axes, paired.grids, frac)}


def _padded_twin(path: str, spec: dict, padded: Grid) -> dict[str, Grid]:
    """``decode_step_padded``'s spread twin, as a Grid of its grid (``decode_step_padded_spread``)."""
    w = "components.decode_step_padded"
    if "spread_seconds" not in spec:
        raise _bad(path, w, "missing spread_seconds (the table's twin measured alongside it)")
    real = padded.grids[1]
    if real[0] <= 0 or real[-1] >= 1:
        raise _bad(path, f"{w}.grid.real", "expected fractions of real rows in (0, 1)")
    spread = _seconds(path, f"{w}.spread_seconds", spec["spread_seconds"], padded.seconds.shape)
    return {"decode_step_padded_spread": Grid("decode_step_padded_spread", padded.axes, padded.grids, spread)}


def _table(path: str, name: str, spec, axes: tuple[str, ...]) -> Grid:
    w = f"components.{name}"
    if not isinstance(spec, dict):
        raise _bad(path, w, "expected an object with axes, grid and seconds")
    if list(spec.get("axes") or []) != list(axes):
        raise _bad(path, f"{w}.axes", f"expected {list(axes)}, got {spec.get('axes')!r}")
    grid = spec.get("grid")
    if not isinstance(grid, dict):
        raise _bad(path, f"{w}.grid", "expected an object with one list per axis")
    grids = []
    for a in axes:
        if a not in grid:
            raise _bad(path, f"{w}.grid", f"missing axis {a!r}")
        grids.append(_grid(path, f"{w}.grid.{a}", grid[a]))
    shape = tuple(len(g) for g in grids)
    if "seconds" not in spec:
        raise _bad(path, w, "missing seconds")
    return Grid(name, axes, tuple(grids), _seconds(path, f"{w}.seconds", spec["seconds"], shape))


def parse_profile(data: dict, path: str) -> Profile:
    """Check a parsed "blocksim-profile/1" object whole; ConfigError naming the first bad field."""
    for key in HEADER:
        if key not in data:
            raise _bad(path, key, "missing (a blocksim-profile/1 file names model, gpu, dtype, tensor_parallel, "
                                  "block_size and cuda_graph_batch_sizes)")
    for key in ("model", "gpu", "dtype"):
        if not isinstance(data[key], str):
            raise _bad(path, key, f"expected a name, got {data[key]!r}")
    for key in ("tensor_parallel", "block_size"):
        if not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < 1:
            raise _bad(path, key, f"expected a positive integer, got {data[key]!r}")
    sms = data.get("num_sms", 0)
    if not isinstance(sms, int) or isinstance(sms, bool) or sms < 0:
        raise _bad(path, "num_sms", f"expected a whole number of SMs >= 0, got {sms!r}")
    sizes = data["cuda_graph_batch_sizes"]
    if not isinstance(sizes, list) or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in sizes):
        raise _bad(path, "cuda_graph_batch_sizes", "expected a list of positive integers")
    sizes = tuple(sorted(set(sizes)))
    comps = data.get("components")
    if not isinstance(comps, dict):
        raise _bad(path, "components", "missing, or not an object of tables")
    tables = {}
    for name, axes in COMPONENT_AXES.items():
        if name not in comps:
            if name in OPTIONAL:
                continue
            raise _bad(path, f"components.{name}", "missing")
        tables[name] = _table(path, name, comps[name], axes)
    if "decode_step_shared" in tables:
        tables.update(_shared_twins(path, comps["decode_step_shared"], tables["decode_step_shared"]))
    if "decode_step_padded" in tables:
        tables.update(_padded_twin(path, comps["decode_step_padded"], tables["decode_step_padded"]))
    unknown = sorted(set(comps) - set(COMPONENT_AXES) - {"overhead"})
    if unknown:
        warnings.warn(f"cost profile {path}: ignoring unknown component(s) {', '.join(unknown)}", ProfileWarning,
                      stacklevel=2)
    lin = comps["linear"]
    linear_graph = None
    if "graph_seconds" in lin:
        if "graph_tokens" in lin.get("grid", {}):
            g = _grid(path, "components.linear.grid.graph_tokens", lin["grid"]["graph_tokens"])
        else:
            g = tables["linear"].grids[0]
        linear_graph = Grid("linear_graph", ("tokens",), (g,),
                            _seconds(path, "components.linear.graph_seconds", lin["graph_seconds"], (len(g),)))
    over = comps.get("overhead")
    if not isinstance(over, dict):
        raise _bad(path, "components.overhead", "missing, or not an object with eager_s and graph_s")
    ov = {}
    for key in ("eager_s", "graph_s"):
        v = over.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v < 0:
            raise _bad(path, f"components.overhead.{key}", f"expected seconds >= 0, got {v!r}")
        ov[key] = float(v)
    cases = over.get("eager_cases_s")
    if cases is not None:  # the measured differences: their median, negative where the parts over-count
        if (not isinstance(cases, list) or not cases
                or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and np.isfinite(c) for c in cases)):
            raise _bad(path, "components.overhead.eager_cases_s", f"expected a list of seconds, got {cases!r}")
        median = float(np.median(cases))
        cheapest = float(np.min(tables["linear"].seconds))  # the linear part of a one-token eager step
        if median > -cheapest:
            ov["eager_s"] = median
        else:  # timings that cannot be a GPU's (a profile measured on the CPU): the floored figure
            warnings.warn(f"cost profile {path}: components.overhead.eager_cases_s: their median {median:.3g} s "
                          f"would leave the cheapest eager step ({cheapest:.3g} s of linear layers) no time; "
                          f"eager_s ({ov['eager_s']:.3g} s) prices eager steps instead", ProfileWarning, stacklevel=3)
    header = {k: v for k, v in data.items() if k not in ("components",)}
    again = {name: c["measured"]["utc"] for name, c in comps.items()
             if isinstance(c, dict) and isinstance(c.get("measured"), dict) and isinstance(c["measured"].get("utc"), str)}
    return Profile(path=path, model=data["model"], gpu=data["gpu"], dtype=data["dtype"],
                   kv_dtype=str(data.get("kv_dtype", data["dtype"])), tensor_parallel=data["tensor_parallel"],
                   block_size=data["block_size"], cuda_graph_batch_sizes=sizes, tables=tables,
                   linear_graph=linear_graph, overhead_eager_s=ov["eager_s"], overhead_graph_s=ov["graph_s"],
                   header=header, tables_measured=again)
