"""Fidelity of a simulated run against an executed one: latency percentiles, throughput and per-step time.

Inputs are two run directories of the same trace: SIM (``blocksim replay``, priced by a cost model)
and EXEC (the same trace executed on a GPU, ``blocksim replay --executor cuda``: each step lasts
its measured time and its ``t_*_s`` columns keep the cost model's prediction). Requests are
matched by ``request_id``; the two runs must hold the same requests (ids, arrivals and lengths),
else they are refused as runs of different traces.

Errors are signed fractions, ``(sim - exec) / exec``:

* latency: TTFT, TPOT and end-to-end at p50, p90 and p99 over the requests finished in both runs,
  and, request by request (matched by id), the median and 10%-90% range of each request's own error
  (`request_errors`): a percentile over about a hundred requests can move several times further than
  the median request does, where the values around it in the distribution lie far apart;
* throughput: output tokens per second of the serving interval (`blocksim.records.metrics`).

Per-step time (MAPE, the mean of ``|predicted - measured| / measured`` over executed steps with a
measured time), the predictions taken from, in order:

1. the simulated run's own steps, when EXEC executed exactly SIM's steps (same count and, step
   by step, the same prompts, tokens, decodes, context and block moves): SIM's ``duration_s``;
2. SIM's cost model pricing EXEC's steps: EXEC re-played at its measured step times
   (`analysis.fidelity_replay`), checked to reproduce the executed steps;
3. SIM's cost model re-pricing EXEC's recorded plan (``--record-plan``), when the replay is not
   possible (a profile no longer readable, a replay that diverges);
4. EXEC's own ``t_*_s`` columns, when EXEC was priced by the same cost model as SIM (same name,
   profile file name and creation time).

Otherwise the per-step error is left out (None) and `step_source` says why. So one executed run
serves every simulated twin (profiled, roofline, fitted roofline) with its own per-step error.
This module runs the engine only through `analysis.fidelity_replay`, to price executed steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.rundir import Run, RunDirError, load_run
from blocksim.records.metrics import throughput
from blocksim.records.schema import FLOAT_COLUMNS

METRICS = ("ttft", "tpot", "e2e")
PERCENTILES = (50, 90, 99)
TIME_COLUMNS = tuple(c for c in ("t_linear_s", "t_attn_prefill_s", "t_attn_decode_s", "t_swap_s", "t_copy_s",
                                 "t_comm_s", "t_overhead_s") if c in FLOAT_COLUMNS)


def predicted_step_s(steps: pd.DataFrame) -> np.ndarray:
    """The cost model's prediction of each step: the sum of its ``t_*_s`` columns (``t_comm_s``
    only in runs with tensor parallelism)."""
    return steps[[c for c in TIME_COLUMNS if c in steps.columns]].sum(axis=1).to_numpy(np.float64)
#: Step columns that say what a step did; equal in two runs when one executed the other's steps.
COMPOSITION = ("num_prefill_seqs", "prefill_tokens", "num_decode_seqs", "decode_ctx_tokens",
               "blocks_swapped_in", "blocks_swapped_out", "blocks_copied")
#: The keys of a results row (benchmarks/results/fidelity-*.json), in order.
ROW_KEYS = ("trace", "preset", "model", "gpu", "tensor_parallel", "cost_model", "step_mape",
            "ttft_p50_err", "ttft_p99_err", "tpot_p50_err", "tpot_p99_err", "e2e_p50_err", "e2e_p99_err",
            "throughput_err")


class FidelityError(RunDirError):
    """Two run directories that cannot be compared (not runs, or runs of different traces)."""


@dataclass
class Fidelity:
    sim: Run
    exec: Run
    matched: int                     # requests finished in both runs
    latency: pd.DataFrame            # metric, percentile, sim_s, exec_s, err
    throughput: dict                 # sim, exec (output tokens/s), err
    predicted_s: np.ndarray | None   # per executed step
    measured_s: np.ndarray | None
    step_source: str
    per_request: pd.DataFrame | None = None   # metric, median, p10, p90, requests (`request_errors`)
    extra: dict = field(default_factory=dict)

    @property
    def step_mape(self) -> float | None:
        if self.predicted_s is None:
            return None
        ok = self.measured_s > 0
        if not ok.any():
            return None
        return float(np.mean(np.abs(self.predicted_s[ok] - self.measured_s[ok]) / self.measured_s[ok]))

    def err(self, metric: str, pct: int) -> float:
        r = self.latency[(self.latency.metric == metric) & (self.latency.percentile == pct)]
        return float(r.err.iloc[0])

    @property
    def cost_model(self) -> dict:
        return self.sim.summary.get("cost_model") or {"name": self.sim.config.get("policy_config", {}).get("cost_model")}

    def row(self, trace: str | None = None) -> dict:
        """The results row: `ROW_KEYS` (errors as signed fractions, step_mape a fraction) plus p90
        errors, the median request's errors (``*_request_median_err``) and the requests each metric
        covers (``*_requests``: TPOT only those with more than one output token), the cost model's
        profile or constants, the run directories and the counts."""
        cfg = self.sim.config
        row = {
            "trace": trace or Path(str(self.sim.summary.get("trace") or self.sim.path.name)).name,
            "preset": cfg.get("policy"),
            "model": (cfg.get("model") or {}).get("name"),
            "gpu": (cfg.get("gpu") or {}).get("name"),
            "tensor_parallel": cfg.get("tensor_parallel"),
            "cost_model": self.cost_model.get("name"),
            "step_mape": self.step_mape,
        }
        for m in METRICS:
            for p in (50, 99):
                row[f"{m}_p{p}_err"] = self.err(m, p)
        row["throughput_err"] = self.throughput["err"]
        for m in METRICS:
            row[f"{m}_p90_err"] = self.err(m, 90)
        for r in ([] if self.per_request is None else self.per_request.itertuples(index=False)):
            row[f"{r.metric}_request_median_err"] = r.median
            row[f"{r.metric}_requests"] = r.requests  # how many requests the metric's figures cover
        row.update({"cost_profile": self.cost_model.get("profile"), "sim_run": str(self.sim.path),
                    "exec_run": str(self.exec.path), "requests_matched": self.matched,
                    "steps_compared": 0 if self.predicted_s is None else int(len(self.predicted_s)),
                    "step_source": self.step_source})
        return {k: _json_safe(v) for k, v in row.items()}


def _json_safe(v):
    if isinstance(v, (float, np.floating)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def signed_err(sim: float, exe: float) -> float:
    return (sim - exe) / exe if exe else math.nan


# --- loading --------------------------------------------------------------------------------------
def load_pair(sim_dir, exec_dir) -> tuple[Run, Run]:
    """Both run directories, checked to be runs of the same trace (FidelityError otherwise)."""
    runs = []
    for label, d in (("SIM_RUN", sim_dir), ("EXEC_RUN", exec_dir)):
        p = Path(d)
        if not p.exists():
            raise FidelityError(f"{label} {p}: not found")
        try:
            runs.append(load_run(p))
        except RunDirError as e:
            raise FidelityError(f"{label} {e} (not a run directory written by blocksim replay)") from None
    sim, exe = runs
    a = sim.requests.set_index("request_id")
    b = exe.requests.set_index("request_id")
    only_sim, only_exec = a.index.difference(b.index), b.index.difference(a.index)
    if len(only_sim) or len(only_exec):
        raise FidelityError(f"{sim.path} and {exe.path} replay different traces: {len(only_sim)} request ids only in "
                            f"SIM_RUN, {len(only_exec)} only in EXEC_RUN; compare runs of one trace")
    b = b.loc[a.index]
    for col in ("prompt_tokens", "output_tokens", "n"):
        if col in a and col in b and not (a[col].to_numpy() == b[col].to_numpy()).all():
            rid = a.index[np.argmax(a[col].to_numpy() != b[col].to_numpy())]
            raise FidelityError(f"{sim.path} and {exe.path} replay different traces: request {rid} has {col} "
                                f"{a.loc[rid, col]} in SIM_RUN, {b.loc[rid, col]} in EXEC_RUN")
    if not np.allclose(a.arrival_s.to_numpy(), b.arrival_s.to_numpy(), rtol=0, atol=1e-6):
        raise FidelityError(f"{sim.path} and {exe.path} replay different traces: arrival times differ "
                            f"(a rate scale or window applied to one run only?)")
    return sim, exe


# --- latency and throughput -----------------------------------------------------------------------
def matched_values(sim: pd.DataFrame, exe: pd.DataFrame) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """Per metric of `METRICS`, the simulated and executed values of the requests finished in both
    runs where both are finite (the same requests in both arrays, in one order), and how many
    requests finished in both."""
    a = sim[sim.status == "finished"].set_index("request_id")
    b = exe[exe.status == "finished"].set_index("request_id")
    both = a.index.intersection(b.index)
    values = {}
    for m in METRICS:
        x = a.loc[both, f"{m}_s"].to_numpy(np.float64)
        y = b.loc[both, f"{m}_s"].to_numpy(np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        values[m] = (x[ok], y[ok])
    return values, int(len(both))


def latency_errors(sim: pd.DataFrame, exe: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Percentiles of each metric over the requests finished in both runs, and their signed errors."""
    values, matched = matched_values(sim, exe)
    rows = []
    for m, (x, y) in values.items():
        for p in PERCENTILES:
            sp = float(np.percentile(x, p)) if len(x) else math.nan
            ep = float(np.percentile(y, p)) if len(y) else math.nan
            rows.append({"metric": m, "percentile": p, "sim_s": sp, "exec_s": ep, "err": signed_err(sp, ep)})
    return pd.DataFrame(rows), matched


def request_errors(sim: pd.DataFrame, exe: pd.DataFrame) -> pd.DataFrame:
    """Each metric's signed error request by request over the requests finished in both runs (with a
    finite, positive executed value): the median, the 10th and 90th percentiles of those errors, and
    how many requests they cover."""
    rows = []
    for m, (x, y) in matched_values(sim, exe)[0].items():
        pos = y > 0
        e = (x[pos] - y[pos]) / y[pos]
        q = np.percentile(e, [50, 10, 90]) if len(e) else [math.nan] * 3
        rows.append({"metric": m, "median": float(q[0]), "p10": float(q[1]), "p90": float(q[2]),
                     "requests": int(pos.sum())})
    return pd.DataFrame(rows)


# --- per-step time --------------------------------------------------------------------------------
def same_steps(sim: pd.DataFrame, exe: pd.DataFrame) -> bool:
    """True when EXEC executed exactly SIM's steps (same count and composition, step by step)."""
    if len(sim) != len(exe) or not len(sim):
        return False
    return all((sim[c].to_numpy() == exe[c].to_numpy()).all() for c in COMPOSITION if c in sim and c in exe)


def reprice_plan(run_dir, cost) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers, predicted seconds) of every step of a recorded plan, priced by `cost` as the
    engine prices a step (`blocksim.cost.step.step_times`). A prompt chunk samples when it
    reaches the prompt's end (the plan does not hold the tokens a recomputed sequence had generated,
    so a chunk ending inside them counts as sampling). The plan holds no padding rows: a step of
    static batching (`static` preset), which the engine prices with its padding rows' contexts, is
    priced here without them."""
    from blocksim.cost.step import step_times
    from blocksim.records.plan import read_plan
    meta, steps, seqs, _ = read_plan(run_dir)
    bs = int(meta.get("block_size", 16))
    shares = getattr(cost, "prices_shared_rows", False)
    prices_longest = getattr(cost, "prices_longest_row", False)
    comm = getattr(cost, "comm", None) if getattr(cost, "allreduces_per_step", 0) else None  # TP all-reduces
    by_step = {s: g for s, g in seqs.groupby("step", sort=False)} if len(seqs) else {}
    out = np.zeros(len(steps))
    empty = seqs.iloc[:0] if len(seqs) else None
    for i, row in enumerate(steps.itertuples(index=False)):
        s = by_step.get(row.step, empty)
        pre = s[s.is_prefill].drop_duplicates("request_id") if s is not None else None
        dec = s[~s.is_prefill] if s is not None else None
        P = 0 if pre is None else len(pre)
        n = 0 if dec is None else len(dec)
        new = (pre.new_end - pre.new_start).to_numpy(np.int64) if P else np.zeros(0, np.int64)
        cached = pre.new_start.to_numpy(np.int64) if P else np.zeros(0, np.int64)
        ctx = int(dec.context_len.sum()) if n else 0
        moves = len(row.swap_in_src) + len(row.swap_out_src) + len(row.copy_src)
        decode_only = P == 0 and moves == 0
        sampled = n + (int((pre.new_end >= pre.prompt_tokens).sum()) if P else 0)  # prompts that end
        longest, shared = None, 0
        if n and prices_longest:  # a graph step, or an eager one's uneven rows
            longest = int(dec.context_len.max())
            # context tokens rows read from blocks another row reads too: a request's samples share
            # its prompt's full blocks (`blocksim.engine.spans.shared_tokens`), in graph steps
            if decode_only and shares and dec.request_id.duplicated().any():
                rows = dec.groupby("request_id", sort=False).prompt_tokens.agg(["size", "first"])
                shared = int(((rows["size"] - 1) * (rows["first"] // bs * bs)).sum())
        t = sum(step_times(cost, new if P else None, cached, n, ctx, decode_only=decode_only, sampled=sampled,
                           active=P + n > 0, longest=longest, shared=shared, swapped_in=len(row.swap_in_src),
                           swapped_out=len(row.swap_out_src), copied=len(row.copy_src), comm=comm).values())
        out[i] = t
    return steps.step.to_numpy(np.int64), out


def _same_model(a: dict, b: dict) -> bool:
    if not a or not b or a.get("name") != b.get("name"):
        return False
    if a.get("name") == "roofline":
        return a.get("params") == b.get("params")
    pa, pb = a.get("profile"), b.get("profile")
    return pa is not None and pb is not None and Path(pa).name == Path(pb).name \
        and a.get("created_utc") == b.get("created_utc") and a.get("tables_measured") == b.get("tables_measured") \
        and a.get("calibrated") == b.get("calibrated")


def step_pairs(sim: Run, exe: Run) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(predicted, measured, source) per executed step, by the rules of the module docstring."""
    from analysis.fidelity_replay import ReplayDiverged, measured_replay, rebuild_cost_model
    measured = exe.steps.duration_s.to_numpy(np.float64)
    if same_steps(sim.steps, exe.steps):
        return sim.steps.duration_s.to_numpy(np.float64), measured, "the simulated run's steps, executed one for one"
    sim_cm, exe_cm = sim.summary.get("cost_model") or {}, exe.summary.get("cost_model") or {}
    why = []
    if sim_cm:
        try:
            pred = measured_replay(sim.summary, exe)
            return pred, measured, (f"the simulated run's {sim_cm.get('name')} model pricing the executed steps "
                                    f"(the executed run re-played at its measured step times)")
        except (ReplayDiverged, ValueError, KeyError, TypeError, OSError) as e:
            why.append(f"re-play: {e}")
        if (exe.path / "plan" / "meta.json").is_file():
            try:
                steps, pred = reprice_plan(exe.path, rebuild_cost_model(sim.summary))
            except (ValueError, KeyError, TypeError, OSError) as e:
                why.append(f"plan: {e}")
            else:
                pos = exe.steps.set_index("step").index.get_indexer(steps)
                keep = pos >= 0
                return pred[keep], measured[pos[keep]], (f"the executed run's plan re-priced by the simulated "
                                                         f"run's {sim_cm.get('name')} model")
    if _same_model(sim_cm, exe_cm):
        pred = predicted_step_s(exe.steps)
        return pred, measured, f"the executed run's own {exe_cm.get('name')} prediction of each step"
    return None, None, "no per-step comparison (" + "; ".join(why or ["no cost model recorded"]) + ")"


def errors(f: Fidelity) -> dict:
    """`f`'s errors as a flat dict: step_mape and the ``*_err`` keys of `ROW_KEYS`, the p90 and the
    median request's errors, and how they were obtained (cost profile, counts, step source)."""
    return {k: v for k, v in f.row().items() if k not in ("trace", "preset", "model", "gpu", "tensor_parallel",
                                                         "cost_model")}


def compare_runs(sim_dir, exec_dir) -> dict:
    """The errors of SIM against EXEC as a flat dict (`errors`)."""
    return errors(compare(sim_dir, exec_dir))


def compare(sim_dir, exec_dir) -> Fidelity:
    """SIM_RUN against EXEC_RUN (run directories of one trace); FidelityError for bad input."""
    sim, exe = load_pair(sim_dir, exec_dir)
    lat, matched = latency_errors(sim.requests, exe.requests)
    ts = throughput(sim.requests, sim.steps)["output_tokens_per_s"]
    te = throughput(exe.requests, exe.steps)["output_tokens_per_s"]
    pred, meas, source = step_pairs(sim, exe)
    return Fidelity(sim, exe, matched, lat, {"sim": ts, "exec": te, "err": signed_err(ts, te)}, pred, meas, source,
                    request_errors(sim.requests, exe.requests))


# --- results file ----------------------------------------------------------------------------------
#: what names a row of a fidelity results file: a new row replaces an old one with the same values
ROW_IDENTITY = ("trace", "preset", "model", "gpu", "tensor_parallel", "cost_model", "cost_profile")


def merged_rows(old: list[dict], rows: list[dict], identity: tuple[str, ...] = ROW_IDENTITY) -> list[dict]:
    """`old` without the rows whose values of `identity` a row of `rows` repeats, then `rows`."""
    def key(row: dict) -> tuple:
        return tuple(json.dumps(row.get(k), sort_keys=True) for k in identity)

    new_keys = {key(r) for r in rows}
    return [r for r in old if key(r) not in new_keys] + list(rows)


def append_rows(path, rows: list[dict], identity: tuple[str, ...] = ROW_IDENTITY) -> Path:
    """Add rows to a results file (a JSON list), replacing the rows whose values of `identity` (by
    default: trace, preset, model, GPU, TP, cost model and profile) a new row repeats; the file is
    created when absent and replaced whole (never left half-written)."""
    p = Path(path)
    old = []
    if p.exists():
        try:
            old = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise FidelityError(f"results file {p}: not valid JSON ({e}); fix or remove it") from None
        if not isinstance(old, list):
            raise FidelityError(f"results file {p}: expected a JSON list of rows")
    merged = merged_rows(old, rows, identity)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(merged, indent=1) + "\n")
    tmp.replace(p)
    return p
