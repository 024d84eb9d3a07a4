"""Small trace samples shipped with the package (see ``traces/data/SOURCE-*.md``)."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"

_SAMPLES = {
    "azure-conv": "azure_conv_2023_sample.csv",
    "azure-code": "azure_code_2023_sample.csv",
    "mooncake": "mooncake_sample.jsonl",
}


def bundled_names() -> list[str]:
    """Names accepted by :func:`bundled`."""
    return list(_SAMPLES)


def bundled(name: str) -> Path:
    """Path of a bundled sample: ``azure-conv``, ``azure-code`` or ``mooncake``."""
    try:
        return DATA_DIR / _SAMPLES[name]
    except KeyError:
        raise KeyError(f"no bundled trace {name!r}; choose one of {', '.join(_SAMPLES)}") from None
