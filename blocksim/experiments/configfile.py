"""Configuration files: the options of `blocksim.options.OPTIONS` in a YAML or TOML mapping.

The keys are option names with underscores (``block_size``, ``swap_space_gib``, ...). `replay`,
`compare` and `sweep` read one with ``--config FILE``; flags given on the command line win over it.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from blocksim import options
from blocksim.catalog import read_mapping
from blocksim.config import ConfigError


def read_config_file(path: str | Path) -> dict:
    """Options from a YAML or TOML file; an unknown key is refused with the known ones."""
    data = read_mapping(Path(path), "config file")
    known = set(options.FILE_KEYS)
    unknown = set(data) - known
    if unknown:
        close = {k: difflib.get_close_matches(k, known, n=1) for k in sorted(unknown)}
        hints = [f"{m[0]!r} for {k!r}" for k, m in close.items() if m]
        use = f"; write {', '.join(hints)}" if hints else ""
        raise ConfigError(f"config file {path}: unknown option(s) {sorted(unknown)}{use}; known: {sorted(known)}")
    if isinstance(data.get("catalog"), str):
        data["catalog"] = [data["catalog"]]
    return data
