"""The headline numbers of a run, one definition for the console and the reports.

Each column is a metric of `analysis.table.run_row` / `analysis.metrics.run_metrics` with its
label, unit and format. ``headline_frame`` turns rows of runs into a table of formatted text
(the reports' first table); ``text_table`` prints the same table on a console.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    unit: str = ""
    fmt: str = "{:,.0f}"
    scale: float = 1.0

    def format(self, value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return self.fmt.format(float(value) * self.scale)

    @property
    def header(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label


HEADLINE_COLUMNS = (
    Column("requests_per_s", "throughput", "req/s", "{:.2f}"),
    Column("ttft_p99_s", "TTFT p99", "s", "{:.2f}"),
    Column("tpot_p99_s", "TPOT p99", "ms", "{:.0f}", 1e3),
    Column("token_states_of_used_frac", "used KV holding tokens", "%", "{:.0f}", 100.0),
    Column("preemptions", "preemptions"),
    Column("rejected", "rejected"),
)
#: Key columns a comparison's rows lead with.
RUN_KEYS = (
    Column("policy", "policy", fmt="{}"),
    Column("rate_scale", "rate", fmt="x{:g}"),
)


def _cell(col: Column, value) -> str:
    if col.fmt == "{}":
        return str(value)
    try:
        return col.format(value)
    except (TypeError, ValueError):
        return str(value)


def headline_frame(rows: pd.DataFrame | list[dict], keys: tuple[Column, ...] = ()) -> pd.DataFrame:
    """One row per run: the key columns, then the headline metrics as formatted text, headed
    with their units. Metrics a row lacks read ``-``."""
    rows = pd.DataFrame(rows)
    out = {}
    for col in (*keys, *HEADLINE_COLUMNS):
        values = rows[col.key] if col.key in rows else [None] * len(rows)
        out[col.header] = [_cell(col, v) for v in values]
    return pd.DataFrame(out)


def text_table(frame: pd.DataFrame, indent: str = "  ") -> str:
    """A formatted frame as aligned console text: headers on two lines (label, then unit), the
    first column left-aligned, the rest right-aligned."""
    heads = [c.removesuffix(")").split(" (", 1) if c.endswith(")") else [c, ""] for c in frame.columns]
    units = [f"({u})" if u else "" for _, u in heads]
    labels = [label for label, _ in heads]
    cells = [[str(v) for v in frame[c]] for c in frame.columns]
    widths = [max(len(label), len(unit), *(len(v) for v in col)) for label, unit, col in zip(labels, units, cells)]

    def line(values) -> str:
        return indent + "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                  for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    lines = [line(labels)] + ([line(units)] if any(units) else [])
    return "\n".join(lines + [line(row) for row in zip(*cells)])


def comparison_findings(rows: pd.DataFrame) -> str:
    """What a comparison at one rate shows, read off its rows (``run_row`` columns, one per policy):
    the policies keeping the most and the least of their used KV memory for token states, and
    what that did to the batch, the queue, TTFT and throughput. Empty with fewer than two rows."""
    needed = ["token_states_of_used_frac", "ttft_p99_s", "requests_per_s"]
    if not set(needed) <= set(rows.columns):  # a table written before these columns existed
        return ""
    rows = rows.dropna(subset=needed[:1])
    if len(rows) < 2:
        return ""
    rows = rows.sort_values("token_states_of_used_frac", ascending=False, kind="stable")
    best, worst = rows.iloc[0], rows.iloc[-1]
    text = (f"{best['policy']} keeps {best['token_states_of_used_frac']:.0%} of the KV memory it uses for token "
            f"states, {worst['policy']} {worst['token_states_of_used_frac']:.0%}: the rest is reserved for "
            "tokens not generated yet or lost to fragmentation.")
    if worst["token_states_of_used_frac"] > 0.9 * best["token_states_of_used_frac"]:
        return text.replace(": the rest", "; the rest")
    if {"running_mean", "waiting_mean"} <= set(rows.columns) and worst["running_mean"] < best["running_mean"]:
        text += (f" So {worst['policy']} runs {worst['running_mean']:.1f} requests at a time on average against "
                 f"{best['running_mean']:.1f} with {worst['waiting_mean']:.1f} waiting against {best['waiting_mean']:.1f};")
    else:
        text += f" For {worst['policy']}, against {best['policy']}:"
    text += (f" TTFT p99 is {worst['ttft_p99_s']:.1f} s against {best['ttft_p99_s']:.1f} s and throughput "
             f"{worst['requests_per_s']:.2f} against {best['requests_per_s']:.2f} req/s.")
    return text
