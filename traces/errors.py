"""Errors, warnings and the read report of the traces package."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class TraceError(ValueError):
    """A trace file cannot be read as asked.

    The message names the file, the line (CSV, JSONL) or row (Parquet) and the column
    where the first problem is, and ends with a hint on how to fix it. The parts are
    also attributes, for programs: ``path``, ``line``, ``column``, ``hint``.
    """

    def __init__(
        self,
        path: str | Path | None,
        problem: str,
        *,
        line: int | None = None,
        column: str | None = None,
        hint: str | None = None,
        where: str = "line",
    ) -> None:
        self.path = None if path is None else str(path)
        self.problem = problem
        self.line = line
        self.column = column
        self.hint = hint
        self.where = where
        parts = [self.path or "<trace>"]
        if line is not None:
            parts.append(f"{where} {line}")
        if column is not None:
            parts.append(f"column {column!r}")
        message = ": ".join([", ".join(parts), problem])
        if hint:
            message += f". Hint: {hint}"
        super().__init__(message)


class TraceWarning(UserWarning):
    """Something in a trace is suspicious or was skipped, but reading went on."""


@dataclass(frozen=True)
class ReadReport:
    """What reading a file left out or flagged.

    ``skipped_rows`` bad rows were skipped (only with ``lenient=True``); ``skipped_lines``
    holds the line (or row) numbers of the first few, ``skip_reasons`` counts them by
    ``"column: problem"``. ``failed_rows`` counts rows the format marks as failed requests
    (BurstGPT: zero response tokens); ``failed_kept`` says whether they are in the trace.
    ``where`` says what the numbers count: ``line`` (CSV, JSONL) or ``row`` (Parquet).
    """

    skipped_rows: int = 0
    skipped_lines: tuple[int, ...] = ()
    skip_reasons: dict[str, int] = field(default_factory=dict)
    failed_rows: int = 0
    failed_kept: bool = False
    where: str = "line"

    def summary(self) -> str:
        """One line for humans; empty when nothing was skipped or failed."""
        parts = []
        if self.skipped_rows:
            lines = ", ".join(map(str, self.skipped_lines))
            more = ", ..." if self.skipped_rows > len(self.skipped_lines) else ""
            reasons = "; ".join(f"{n} x {r}" for r, n in self.skip_reasons.items())
            parts.append(f"skipped {self.skipped_rows} bad rows ({self.where}s {lines}{more}): {reasons}")
        if self.failed_rows:
            verb = "kept" if self.failed_kept else "dropped"
            parts.append(f"{verb} {self.failed_rows} failed requests (zero output tokens)")
        return "; ".join(parts)
