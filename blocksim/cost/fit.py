"""The roofline's constants fitted on a measured profile's grids, and its error there.

`fit_roofline` fits `CostParams` so that `RooflineCostModel` reproduces a "blocksim-profile/1"
profile's tables, each by least squares on the relative error ``(predicted - measured) / measured``
over the table's grid points:

* ``flops_efficiency`` and ``bw_efficiency`` from the linear table, each grid point weighted by the
  span of log tokens it covers (`log_span_weights`: a densely sampled stretch of the grid counts no
  more than a sparsely sampled one): the roofline's
  ``max(tokens * 2 * params / (peak_flops * flops_eff), weight_bytes / (hbm_bw * bw_eff))`` against
  the measured ``linear + cache_write + sample`` (everything the roofline's linear term stands for;
  sampling taken at as many sequences as tokens up to the largest CUDA-graph batch, at one sequence
  beyond, as for decode and prompt steps). A log-spaced search over both rates (each efficiency
  capped at 1).
* ``scale_attn_decode`` (decode attention at every (batch, context)), ``scale_attn_prefill``
  (prefill attention at every (batch, new, cached)): one multiplier each, closed form.
* swaps (``swap_batched``: one launch set per cache tensor, as the kernels swap): the bytes term
  and the fixed term, ``scale_swap`` and ``transfer_latency_s``, over the swap-in and swap-out
  tables together; copies: ``scale_copy`` and ``launch_s`` likewise (weighted linear least squares,
  the fixed term kept >= 0).
* ``step_overhead_s``: the profile's graph overhead when it captures CUDA graphs (most steps are
  decode-only), else its eager overhead.
* ``link_efficiency`` and ``allreduce_latency_s`` from a tensor-parallel profile's ``allreduce``
  table: the ring's bytes term and the fixed term, likewise (the efficiency capped at 1).

`shipped_fit` gives the roofline its constants when a run names no file: fitted on the shipped
profile of the run's model and GPU, else on the shipped profiles of its GPU (the median of each
constant), else none (the built-in defaults).

`grid_errors` reports the mean absolute percentage error and the signed median error of a roofline
on each table's grid points: the numbers `blocksim cost-fit` prints for the default and the fitted
constants.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from blocksim.config import SimConfig
from blocksim.cost.interpolate import Line
from blocksim.cost.profile_file import ROOFLINE_FORMAT, Profile
from blocksim.cost.roofline import CostParams, RooflineCostModel

COMPARED = ("linear", "attn_prefill", "attn_decode", "swap", "copy")


def _mesh(grids) -> list[np.ndarray]:
    return [m.ravel() for m in np.meshgrid(*grids, indexing="ij")]


def _scale(base: np.ndarray, meas: np.ndarray) -> float:
    """The multiplier s minimising sum(((s * base - meas) / meas) ** 2)."""
    r = base / meas
    return float(np.sum(r) / np.sum(r * r))


def _affine(x: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    """(alpha, beta >= 0) minimising sum(((alpha * x + beta - meas) / meas) ** 2)."""
    a = np.stack([x / meas, 1.0 / meas], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(meas), rcond=None)
    if beta < 0 or alpha <= 0:
        return _scale(x, meas), 0.0
    return float(alpha), float(beta)


def targets(profile: Profile, config: SimConfig) -> dict[str, tuple[dict, np.ndarray]]:
    """Per compared component: the grid points (as the roofline's arguments) and the measured seconds."""
    t = profile.tables
    out = {}
    tokens = t["linear"].grids[0]
    big = max(profile.cuda_graph_batch_sizes, default=1)
    seqs = np.where(tokens <= big, tokens, 1.0)
    lin = (t["linear"].seconds + Line.of(t["cache_write"]).eval(tokens) + Line.of(t["sample"]).eval(seqs))
    out["linear"] = ({"tokens": tokens}, lin)
    b, p, c = _mesh(t["attn_prefill"].grids)
    out["attn_prefill"] = ({"batch": b, "new": p, "cached": c}, t["attn_prefill"].seconds.ravel())
    b, ctx = _mesh(t["attn_decode"].grids)
    out["attn_decode"] = ({"batch": b, "context": ctx}, t["attn_decode"].seconds.ravel())
    ratio = profile.block_size / config.cache.block_size  # profile blocks -> run blocks
    sw = np.concatenate([t["swap_in"].grids[0], t["swap_out"].grids[0]]) * ratio
    out["swap"] = ({"blocks": sw}, np.concatenate([t["swap_in"].seconds, t["swap_out"].seconds]))
    out["copy"] = ({"blocks": t["copy"].grids[0] * ratio}, t["copy"].seconds)
    if "allreduce" in t and config.tensor_parallel > 1:
        out["allreduce"] = ({"bytes": t["allreduce"].grids[0]}, t["allreduce"].seconds)
    return out


def predict(model: RooflineCostModel, comp: str, args: dict) -> np.ndarray:
    """The roofline's seconds at a component's grid points."""
    if comp == "linear":
        return np.array([model.linear(int(round(x))) if x >= 1 else model.linear(1) for x in args["tokens"]])
    if comp == "attn_prefill":
        return np.array([model.attn_prefill(np.full(int(b), p), np.full(int(b), c))
                         for b, p, c in zip(args["batch"], args["new"], args["cached"])])
    if comp == "attn_decode":
        return np.asarray(model.attn_decode(args["batch"] * args["context"]), dtype=np.float64)
    if comp == "swap":
        return np.array([model.swap(float(x)) for x in args["blocks"]])
    if comp == "allreduce":
        return np.array([model.allreduce(float(x)) for x in args["bytes"]])
    return np.array([model.copy(float(x)) for x in args["blocks"]])


def grid_errors(profile: Profile, config: SimConfig, params: CostParams | None = None) -> dict[str, dict]:
    """Per component: grid points, MAPE (%) and median signed relative error of the roofline with `params`."""
    model = RooflineCostModel(config, params)
    out = {}
    for comp, (args, meas) in targets(profile, config).items():
        pred = predict(model, comp, args)
        rel = (pred - meas) / meas
        out[comp] = {"points": int(len(meas)), "mape_pct": float(np.mean(np.abs(rel)) * 100),
                     "median_err": float(np.median(rel))}
    return out


def log_span_weights(x: np.ndarray) -> np.ndarray:
    """Each point's share of the grid's span in log units: half the log distance to each neighbour
    (the trapezoid rule over log x), so that a stretch sampled densely weighs as much as the same
    stretch sampled sparsely."""
    lx = np.log(np.asarray(x, dtype=np.float64))
    if len(lx) < 2:
        return np.ones_like(lx)
    gaps = np.diff(lx)
    return np.concatenate([[0.0], gaps]) / 2 + np.concatenate([gaps, [0.0]]) / 2


def _fit_linear(config: SimConfig, tokens: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    """(flops_efficiency, bw_efficiency) of max(a * tokens, b) against `meas`, each capped at 1."""
    m, g, tp = config.model, config.gpu, config.tensor_parallel
    flops_per_token = 2.0 * m.num_params / tp
    weight_bytes = m.weight_bytes / tp
    a0 = float(meas[-1] / tokens[-1])  # the largest batch is the most compute-bound point
    b0 = float(np.min(meas))
    mult = np.logspace(-1.0, 1.0, 201)
    a = a0 * mult[:, None, None]
    b = b0 * mult[None, :, None]
    pred = np.maximum(a * tokens[None, None, :], b)
    err = np.sum(log_span_weights(tokens) * ((pred - meas) / meas) ** 2, axis=2)
    i, j = np.unravel_index(np.argmin(err), err.shape)
    fe = flops_per_token / (g.fp16_tflops * 1e12 * a0 * mult[i])
    be = weight_bytes / (g.hbm_bw_gbps * 1e9 * b0 * mult[j])
    return float(min(fe, 1.0)), float(min(be, 1.0))


def fit_roofline(profile: Profile, config: SimConfig) -> CostParams:
    """Roofline constants fitted on the profile's grids (see the module docstring)."""
    profile.check_matches(config)
    tg = targets(profile, config)
    fe, be = _fit_linear(config, tg["linear"][0]["tokens"], tg["linear"][1])
    params = CostParams(flops_efficiency=fe, bw_efficiency=be, swap_batched=True)
    model = RooflineCostModel(config, params)
    scales = {}
    for comp in ("attn_prefill", "attn_decode"):
        args, meas = tg[comp]
        scales[f"scale_{comp}"] = _scale(predict(model, comp, args), meas)
    m = config.model
    copies = 2 * m.num_layers
    args, meas = tg["swap"]
    alpha, beta = _affine(args["blocks"] * config.block_bytes, meas)
    scale_swap = alpha * model.link_bw
    latency = beta / (copies * scale_swap)
    args, meas = tg["copy"]
    alpha, beta = _affine(args["blocks"] * config.block_bytes, meas)
    scale_copy = alpha * model.bw / 2
    launch = beta / scale_copy
    # a fixed cost per step, never below zero (a profile's eager difference may be: the parts over-count)
    overhead = profile.overhead_graph_s if profile.cuda_graph_batch_sizes else max(0.0, profile.overhead_eager_s)
    comm = {}
    if "allreduce" in tg:
        args, meas = tg["allreduce"]
        tp = config.tensor_parallel
        alpha, beta = _affine(args["bytes"] * 2 * (tp - 1) / tp / (config.gpu.gpu_link_gbps * 1e9), meas)
        comm = {"link_efficiency": float(min(1.0, 1.0 / alpha)), "allreduce_latency_s": beta}
    return CostParams(flops_efficiency=fe, bw_efficiency=be, step_overhead_s=overhead,
                      transfer_latency_s=latency, launch_s=launch, swap_batched=True,
                      scale_linear=1.0, scale_swap=scale_swap, scale_copy=scale_copy, **scales, **comm)


_FITTED: dict = {}


def shipped_fit(config: SimConfig) -> tuple[CostParams, list[str]] | None:
    """The roofline's constants for a run without a file: fitted on the shipped profile of the run's
    model, GPU, dtype and TP when there is one, else on every shipped profile of its GPU, dtype and
    TP (each fitted alone, the median of each constant taken: the GPU's efficiencies and scales carry
    across models). None when the GPU has no shipped profile. Returns the constants and the
    profiles they were fitted on; cached per set of files."""
    from blocksim.catalog import MODELS
    from blocksim.cost.profile_file import PROFILES_DIR, load_profile, portable_path, run_dtype, shipped_profile
    own = shipped_profile(config)
    if own is not None:
        paths = [own]
    else:
        tail = f"__{config.gpu.name}__{run_dtype(config)}__tp{config.tensor_parallel}.json"
        paths = sorted(p for p in PROFILES_DIR.glob(f"*{tail}") if p.name[: -len(tail)] in MODELS)
    if not paths:
        return None
    key = (config.gpu, config.tensor_parallel, tuple((str(p), p.stat().st_mtime_ns) for p in paths))
    hit = _FITTED.get(key)
    if hit is None:
        fits = []
        for p in paths:
            prof = load_profile(p)
            # the profile's own model, without the run's tiers (sized for the run's model)
            fits.append(fit_roofline(prof, config.replace(model=MODELS[prof.model], tiers=None)).to_dict())
        merged = {k: (float(np.median([f[k] for f in fits])) if isinstance(fits[0][k], float) else fits[0][k])
                  for k in fits[0]}
        hit = (CostParams(**merged), [portable_path(p) for p in paths])
        _FITTED[key] = hit
    return hit


def write_params(params: CostParams, path: str | Path, source: str) -> Path:
    """The fitted constants as a "blocksim-roofline/1" file (a --cost-profile for the roofline)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"format": ROOFLINE_FORMAT, "params": params.to_dict(), "source": source}, indent=1) + "\n")
    return p
