"""`pd`: pandas, imported on first use.

The trace modules use pandas for the general readers, shaping and frames; `blocksim replay` of a
plain CSV trace reads it with Arrow alone (`traces.fast_csv`) and never needs pandas, which takes
a fifth of a second and 45 MB to import. `from .lazy_pandas import pd` gives the modules a name
whose attributes load pandas when first read.
"""

from __future__ import annotations


class _Pandas:
    __slots__ = ()

    def __getattr__(self, name: str):
        import pandas

        return getattr(pandas, name)


pd = _Pandas()
