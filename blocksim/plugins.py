"""Plug points: short names in small registries, or `"package.module:Class"` for users' own classes.

Kinds and what a class must provide:

* ``allocator``: a memory manager built as ``Class(config)`` with `BlockSpaceManager`'s interface
  (`can_allocate`, `allocate`, `can_append_slots`, `append_slots`, swap and free methods,
  `memory_breakdown`, span methods, `check_invariants`).
* ``scheduler``: a `Scheduler` subclass built as ``Class(scheduler_config, memory_manager, max_model_len, policy)``.
* ``victim``: a function ``(candidates: list[SequenceGroup]) -> int``, the index of the group to preempt.
* ``cost_model``: built as ``Class(config, params)`` with `RooflineCostModel`'s methods.

Adding a policy is one class in one file plus one registry line (or none, with a plugin string).
A plugin string is checked where a configuration is built: the module imports, the attribute
exists, and it can be called with the arguments its kind is called with. A victim plugin's result
is checked at each call; an exception raised inside any plugin is reported as a `PluginError`
naming it (`blame`).
This module is the registry only: `blocksim.policies` registers the built-ins when it is imported,
so code that resolves built-in names imports `blocksim.policies` (the engine does).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import traceback
from pathlib import Path
from typing import Any

from blocksim.config import ConfigError

_REGISTRIES: dict[str, dict[str, Any]] = {"allocator": {}, "scheduler": {}, "victim": {}, "cost_model": {}}

#: How each kind is called: the positional parameters a plugin must accept.
CALLED_AS: dict[str, tuple[str, ...]] = {
    "allocator": ("config",),
    "scheduler": ("scheduler_config", "memory_manager", "max_model_len", "policy"),
    "victim": ("candidates",),
    "cost_model": ("config", "params"),
}

#: Plugin strings loaded so far, by the source file of their module: (first line, last line, label)
#: of each plugin's source (for `blame`).
_LOADED: dict[str, dict[tuple[int, int, str], None]] = {}


class PluginError(ConfigError):
    """A plugin that cannot be used, or that raised while the engine ran."""


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
        check_signature(kind, name, obj)
        source = getattr(module, "__file__", None)
        if source:
            try:
                lines, first = inspect.getsourcelines(obj)
                span = (first, first + len(lines) - 1)
            except (OSError, TypeError):
                span = (0, 0)
            _LOADED.setdefault(str(Path(source).resolve()), {})[(*span, f"{kind} {name!r}")] = None
        return _checked_victim(name, obj) if kind == "victim" else obj
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
    """Refuse an unknown built-in name, or a plugin string that does not import or has the wrong
    signature, where a configuration is built."""
    resolve(kind, name)


def check_signature(kind: str, name: str, obj: Any) -> None:
    """Refuse an object that cannot be called as `kind` calls it (`CALLED_AS`)."""
    params = CALLED_AS[kind]
    wanted = f"{kind} plugins are called as f({', '.join(params)})"
    if not callable(obj):
        raise PluginError(f"{kind} {name!r}: is an object of type {type(obj).__name__}, not a class or function; "
                          f"{wanted}")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # some built-ins have no signature: accepted
        return
    try:
        signature.bind(*params)
    except TypeError:
        raise PluginError(f"{kind} {name!r}: takes {signature}, but {wanted}; "
                          f"change its parameters or name another object") from None


def _checked_victim(name: str, fn: Any) -> Any:
    """`fn`, its result checked: the index of one of the candidates."""

    @functools.wraps(fn)
    def victim(candidates):
        index = fn(candidates)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(candidates):
            raise PluginError(f"victim {name!r} returned {index!r} for {len(candidates)} candidates; "
                              f"a victim returns the index (an int from 0 to {len(candidates) - 1}) "
                              f"of the group to preempt")
        return index

    return victim


def blame(exc: BaseException) -> str | None:
    """One line naming the plugin whose code raised `exc` (the innermost plugin frame of its
    traceback), or None when no plugin code is on the traceback."""
    if isinstance(exc, PluginError) or not _LOADED:
        return None
    frames, seen, cause = [], set(), exc
    while cause is not None and id(cause) not in seen:  # SimPy re-raises a process's error as a new one
        seen.add(id(cause))
        frames = traceback.extract_tb(cause.__traceback__) + frames
        cause = cause.__cause__ or cause.__context__
    for frame in reversed(frames):
        try:
            which = _LOADED.get(str(Path(frame.filename).resolve()))
        except OSError:
            which = None
        if which:
            inside = [label for first, last, label in which if first <= (frame.lineno or 0) <= last]
            which = " or ".join(inside or [label for _, _, label in which])
            text = " ".join(str(exc).split())
            return (f"{which} raised {type(exc).__name__}: {text} (at {frame.filename}:{frame.lineno}, "
                    f"in {frame.name}); fix the plugin, or run with -vv for the traceback")
    return None

