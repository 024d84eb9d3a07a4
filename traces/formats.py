"""The trace formats: which source column feeds which canonical field, and in what unit.

A format is a :class:`FormatSpec`; adding one is one entry in :data:`FORMATS`. A user
``mapping`` (canonical field -> source column) overrides a format's columns; with only a
mapping, the ``generic`` format is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .columns import TIME_UNITS
from .errors import TraceError

REQUIRED_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_FIELDS = ("request_id", "n", "priority", "beam_width", "prefix_hashes")
FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS


@dataclass(frozen=True)
class FormatSpec:
    """How to read one trace format.

    ``columns`` maps canonical fields to source columns; ``optional`` fields are used
    when the file has them. ``time_unit`` is the unit of the arrival column (``None``:
    ``datetime`` for text columns, else seconds). ``hash_block_tokens`` is the block
    size behind ``prefix_hashes``. ``zero_output_is_failure`` marks formats whose rows
    with zero output tokens are failed requests (BurstGPT).
    """

    name: str
    columns: dict[str, str]
    time_unit: str | None
    description: str
    optional: frozenset[str] = field(default_factory=frozenset)
    hash_block_tokens: int | None = None
    zero_output_is_failure: bool = False

    def detect(self, columns: list[str]) -> bool:
        needed = {src for f, src in self.columns.items() if f not in self.optional}
        return bool(needed) and needed <= set(columns)


_CANONICAL = {f: f for f in FIELDS}

FORMATS: dict[str, FormatSpec] = {
    "canonical": FormatSpec(
        "canonical", _CANONICAL, "s",
        "this package's own columns (request_id, arrival_s, prompt_tokens, ...) in CSV, JSONL or Parquet",
        optional=frozenset(OPTIONAL_FIELDS)),
    "azure": FormatSpec(
        "azure", {"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens"},
        "datetime", "Azure LLM inference traces 2023 and 2024 (TIMESTAMP date-time strings)"),
    "burstgpt": FormatSpec(
        "burstgpt", {"arrival_s": "Timestamp", "prompt_tokens": "Request tokens", "output_tokens": "Response tokens"},
        "s", "BurstGPT (Timestamp in seconds; rows with zero Response tokens are failed requests)",
        zero_output_is_failure=True),
    "mooncake": FormatSpec(
        "mooncake", {"arrival_s": "timestamp", "prompt_tokens": "input_length", "output_tokens": "output_length",
                     "prefix_hashes": "hash_ids"},
        "ms", "Mooncake JSONL (timestamp in ms, hash_ids of 512-token blocks)",
        optional=frozenset({"prefix_hashes"}), hash_block_tokens=512),
    "generic": FormatSpec(
        "generic", {}, None, "any CSV, JSONL or Parquet file, with a column mapping"),
}
ALIASES = {"azure-2023": "azure", "azure-2024": "azure", "azure2023": "azure", "azure2024": "azure",
           "burst-gpt": "burstgpt", "mooncake-jsonl": "mooncake", "parquet": "canonical"}


def format_names() -> list[str]:
    return list(FORMATS) + list(ALIASES)


def resolve_format(path: Path, columns: list[str], format: str | None, mapping: dict[str, str] | None,
                   time_unit: str | None, hash_block_tokens: int | None) -> FormatSpec:
    """The spec to read ``path`` with: forced by ``format``, else detected from ``columns``."""
    mapping = dict(mapping or {})
    unknown = set(mapping) - set(FIELDS)
    if unknown:
        raise TraceError(path, f"unknown field(s) in the column mapping: {', '.join(sorted(unknown))}",
                         hint=f"map these fields: {', '.join(FIELDS)}")
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise TraceError(path, f"unknown time unit {time_unit!r}", hint=f"use one of {', '.join(TIME_UNITS)}")
    spec = _choose(path, columns, format, mapping)
    if mapping:
        merged = {**spec.columns, **mapping}
        spec = replace(spec, columns=merged, optional=spec.optional - set(mapping))
    missing = [f for f in REQUIRED_FIELDS if f not in spec.columns]
    if missing:
        raise TraceError(path, f"no column mapped to {', '.join(missing)}",
                         hint="give a mapping such as --map arrival_s=ts --map prompt_tokens=in --map output_tokens=out")
    if time_unit is not None:
        spec = replace(spec, time_unit=time_unit)
    if hash_block_tokens is not None:
        spec = replace(spec, hash_block_tokens=hash_block_tokens)
    return spec


def _choose(path: Path, columns: list[str], format: str | None, mapping: dict[str, str]) -> FormatSpec:
    if format is not None:
        key = ALIASES.get(format.lower(), format.lower())
        if key not in FORMATS:
            raise TraceError(path, f"unknown trace format {format!r}", hint=f"use one of {', '.join(format_names())}")
        return FORMATS[key]
    for spec in FORMATS.values():
        if spec.detect(columns):
            return spec
    if mapping:
        return FORMATS["generic"]
    shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
    raise TraceError(path, f"cannot tell the trace format from its columns ({shown})",
                     hint="name the format (--format azure|burstgpt|mooncake) or map the columns "
                          "(--map arrival_s=COL --map prompt_tokens=COL --map output_tokens=COL)")
