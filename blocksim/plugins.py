"""Plug points: short names in small registries, or `"package.module:Class"` for users' own classes.

Kinds and what a class must provide:

* ``allocator``: a memory manager built as ``Class(config)`` with `BlockSpaceManager`'s interface
  (`can_allocate`, `allocate`, `can_append_slots`, `append_slots`, swap and free methods,
  `memory_breakdown`, span methods, `check_invariants`).
* ``scheduler``: a `Scheduler` subclass built as ``Class(scheduler_config, memory_manager, max_model_len, policy)``.
* ``victim``: a function ``(candidates: list[SequenceGroup]) -> int``, the index of the group to preempt.
* ``cost_model``: built as ``Class(config, params)`` with `RooflineCostModel`'s methods.

Adding a policy is one class in one file plus one registry line (or none, with a plugin string).
This module is the registry only: `blocksim.policies` registers the built-ins when it is imported,
so code that resolves built-in names imports `blocksim.policies` (the engine does).
"""

from __future__ import annotations

import importlib
from typing import Any

from blocksim.config import ConfigError

_REGISTRIES: dict[str, dict[str, Any]] = {"allocator": {}, "scheduler": {}, "victim": {}, "cost_model": {}}


def register(kind: str, name: str, obj: Any) -> Any:
    _REGISTRIES[kind][name] = obj
    return obj


def names(kind: str) -> list[str]:
    return sorted(_REGISTRIES[kind])


def is_plugin(name: str) -> bool:
    return ":" in name


def resolve(kind: str, name: str) -> Any:
    """The registered object for `name`, or the class a `"package.module:Class"` string names."""
    if is_plugin(name):
        module_name, _, attr = name.partition(":")
        if not module_name or not attr:
            raise ConfigError(f"{kind} {name!r}: a plugin is written 'package.module:Class'")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise ConfigError(f"{kind} {name!r}: cannot import module {module_name!r} "
                              f"({type(e).__name__}: {e}); is it installed or on PYTHONPATH?") from e
        try:
            obj = module
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{kind} {name!r}: module {module_name!r} has no attribute {attr!r}") from None
        return obj
    registry = _REGISTRIES[kind]
    if not registry:
        raise ConfigError(f"{kind} {name!r}: no built-in {kind} is registered; import blocksim.policies, "
                          f"which registers them, before resolving names")
    try:
        return registry[name]
    except KeyError:
        raise ConfigError(f"unknown {kind} {name!r}; known: {', '.join(sorted(registry))}, "
                          f"or a plugin 'package.module:Class'") from None


def check_name(kind: str, name: str) -> None:
    """Refuse an unknown built-in name where a configuration is built; plugin strings resolve at run time."""
    if not is_plugin(name):
        resolve(kind, name)

