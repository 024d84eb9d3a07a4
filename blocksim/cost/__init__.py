"""Cost models: the predicted time of one engine step, by component.

* `roofline` (`blocksim.cost.roofline`): peak rates derated by efficiency factors (`CostParams`);
* `profiled` (`blocksim.cost.profiled`): tables measured on a GPU by ``blocksim profile``,
  interpolated (`blocksim.cost.interpolate`), read from a "blocksim-profile/1" file
  (`blocksim.cost.profile_file`);
* `auto` (the default): the shipped profile of the run's (model, GPU, dtype, TP) in
  ``blocksim/profiles/`` when there is one, else the roofline.

Without a file the roofline's constants are fitted on the shipped profiles (`blocksim.cost.fit.
shipped_fit`): the run's own model's profile, else those of its GPU; the built-in defaults where
its GPU has none.

``--cost-profile FILE`` is one flag for both kinds of file; its ``"format"`` key says which
(`load_cost_file`). With ``--cost-model roofline`` a profile is not interpolated: the roofline's
constants are fitted on its grids (`blocksim.cost.fit`) and used.

Each model has the methods the engine calls per step (``linear``, ``attn_prefill``,
``attn_decode``, ``swap``, ``copy``, ``overhead``; ``attn_decode`` also takes an array of context
sizes for a span of decode steps) and may have ``comm(tokens)``, the tensor-parallel all-reduces of
a step (called only when tensor_parallel > 1; a model without it prices them at zero), and
``report(steps)`` (from the run's step frame, of the columns ``report_columns`` names when it has
that attribute) or ``describe()``, the record summary.json keeps.
"""

from __future__ import annotations

from pathlib import Path

from blocksim.config import ConfigError, SimConfig
from blocksim.cost.fit import fit_roofline, shipped_fit
from blocksim.cost.profile_file import (
    PROFILE_FORMAT,
    Profile,
    ProfileWarning,
    load_cost_file,
    load_profile,
    shipped_profile,
    shipped_profiles,
)
from blocksim.cost.profiled import ProfiledCostModel
from blocksim.cost.roofline import COMPONENTS, CostParams, RooflineCostModel

__all__ = [
    "COMPONENTS", "CostParams", "PROFILE_FORMAT", "Profile", "ProfileWarning", "ProfiledCostModel",
    "RooflineCostModel", "BUILTIN_COST_MODELS", "build_cost_model", "cost_record", "fit_roofline",
    "load_cost_file", "load_profile", "shipped_profile",
]

BUILTIN_COST_MODELS = ("auto", "roofline", "profiled")


def _load(source) -> Profile | CostParams | None:
    if source is None or isinstance(source, (Profile, CostParams)):
        return source
    return load_cost_file(source)


def build_cost_model(config: SimConfig, name: str = "auto", source=None):
    """The built-in cost model `name` for `config`, from `source` (a file path, a loaded `Profile`
    or `CostParams`, or None). ConfigError when they do not go together."""
    if name not in BUILTIN_COST_MODELS:
        raise ConfigError(f"unknown cost model {name!r}; known: {', '.join(BUILTIN_COST_MODELS)}")
    given = _load(source)
    where = f"--cost-profile {source}" if isinstance(source, (str, Path)) else "the cost profile"
    if given is None and name in ("auto", "profiled"):
        path = shipped_profile(config)
        if path is not None:
            return ProfiledCostModel(config, load_profile(path))
        if name == "profiled":
            raise ConfigError(
                f"cost_model profiled: no shipped profile for {config.model.name} on {config.gpu.name} at "
                f"tensor_parallel {config.tensor_parallel} (shipped: {', '.join(shipped_profiles()) or 'none'}); "
                f"pass --cost-profile FILE (written by blocksim profile) or use --cost-model roofline")
    if given is None:
        fitted = shipped_fit(config)
        if fitted is None:
            return RooflineCostModel(config)
        params, paths = fitted
        return RooflineCostModel(config, params, source="fitted on " + ", ".join(paths))
    if isinstance(given, Profile):
        if name == "roofline":
            return RooflineCostModel(config, fit_roofline(given, config), source=f"fitted on {given.path}")
        return ProfiledCostModel(config, given)
    if name == "profiled":
        raise ConfigError(f"cost_model profiled: {where} holds roofline parameters, not a {PROFILE_FORMAT} "
                          f"profile; pass a profile written by blocksim profile, or use --cost-model roofline")
    return RooflineCostModel(config, given, source=str(source) if isinstance(source, (str, Path)) else None)


def cost_record(model, steps) -> dict:
    """What summary.json records of the cost model a run used: its `report(steps)`, else its
    `describe()`, else its name. `steps`: the run's step frame or columns, or a function of the
    columns a model's `report_columns` names (None: every column) returning them, called only for
    a model with `report` (so a run priced by the roofline builds no step records)."""
    report = getattr(model, "report", None)
    if report is not None:
        return report(steps(getattr(model, "report_columns", None)) if callable(steps) else steps)
    describe = getattr(model, "describe", None)
    if describe is not None:
        return describe()
    return {"name": getattr(model, "name", type(model).__name__)}
