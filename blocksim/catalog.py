"""Built-in models and GPUs, and users' own from YAML or TOML files.

A catalog file holds two optional tables::

    models:
      my-13b: {num_layers: 40, hidden_size: 5120, num_heads: 40, num_kv_heads: 40, head_size: 128,
               num_params: 13.0e9, max_model_len: 4096, intermediate_size: 13824, vocab_size: 32000}
    gpus:
      my-gpu: {memory_gib: 48, hbm_bw_gbps: 864, fp16_tflops: 181, host_link_gbps: 25}

GPU memory may be given as `memory_gib` or `memory_bytes`. A GPU's `gpu_link_gbps` (GPU-to-GPU, one
way: NVLink, else PCIe; default 32, PCIe Gen4 x16) and `allreduce_latency_s` (default 20e-6) price
tensor parallelism's all-reduces. `num_sms` (default 0: not known) lets the profiled cost model place
a step's prefill blocks on the SMs where the cost profile does not record them. Entries override
built-ins of the same name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from blocksim.config import GiB, ConfigError, GPUSpec, ModelSpec

_M = ModelSpec
MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    _M("opt-13b", 40, 5120, 40, 40, 128, 12.85e9, 2048, 20480, 50272),
    _M("opt-66b", 64, 9216, 72, 72, 128, 65.7e9, 2048, 36864, 50272),
    _M("opt-175b", 96, 12288, 96, 96, 128, 175.0e9, 2048, 49152, 50272),
    _M("llama-2-7b", 32, 4096, 32, 32, 128, 6.74e9, 4096, 11008, 32000),
    _M("llama-2-13b", 40, 5120, 40, 40, 128, 13.0e9, 4096, 13824, 32000),
    _M("llama-2-70b", 80, 8192, 64, 8, 128, 68.98e9, 4096, 28672, 32000),
    _M("llama-3-8b", 32, 4096, 32, 8, 128, 8.03e9, 8192, 14336, 128256),
    _M("llama-3-70b", 80, 8192, 64, 8, 128, 70.55e9, 8192, 28672, 128256),
    # Mistral 7B v0.1: attends within a 4096-token sliding window, which blocksim does not model
    # (it keeps KV for the whole context)
    _M("mistral-7b", 32, 4096, 32, 8, 128, 7.24e9, 32768, 14336, 32000),
]}

# Memory as the driver reports it; bandwidth and tensor rates from the vendors' datasheets
# (dense, no sparsity); host link as a sustained pinned-copy rate, below the PCIe peak.
# GPU-to-GPU link, one way per GPU (half the datasheets' bidirectional figure): NVLink 4 on H100
# SXM and H200 SXM, 900 GB/s bidirectional (NVIDIA H100 and H200 Tensor Core GPU datasheets);
# NVLink 3 on A100 SXM, 600 GB/s (NVIDIA A100 datasheet); L4 has no NVLink, PCIe Gen4 x16 at
# 64 GB/s (NVIDIA L4 datasheet). All-reduce latency: an estimate of NCCL's time for a small message
# within one node (nccl-tests all_reduce_perf reports times of the order of 10 us at a few bytes
# over NVLink); a profile's measured all-reduce table replaces it.
GPUS: dict[str, GPUSpec] = {g.name: g for g in [
    GPUSpec("a100-40gb", int(40 * GiB), 1555.0, 312.0, 25.0, gpu_link_gbps=300.0, allreduce_latency_s=10e-6,
            num_sms=108),
    GPUSpec("a100-80gb", int(80 * GiB), 2039.0, 312.0, 25.0, gpu_link_gbps=300.0, allreduce_latency_s=10e-6,
            num_sms=108),
    GPUSpec("h100-80gb", int(80 * GiB), 3350.0, 989.0, 50.0, gpu_link_gbps=450.0, allreduce_latency_s=10e-6,
            num_sms=132),
    GPUSpec("h200-141gb", int(141 * GiB), 4800.0, 989.0, 50.0, gpu_link_gbps=450.0, allreduce_latency_s=10e-6,
            num_sms=132),
    GPUSpec("l4", int(24 * GiB), 300.0, 121.0, 25.0, gpu_link_gbps=32.0, allreduce_latency_s=20e-6,
            num_sms=58),
]}


def read_mapping(path: Path, what: str = "catalog file") -> dict[str, Any]:
    """A YAML or TOML mapping; errors name the file as `what`."""
    if not path.exists():
        raise ConfigError(f"{what} {path}: not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path}: byte {e.object[e.start]:#04x} at offset {e.start} is not UTF-8 text; "
                          f"save the file as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read it ({e.strerror or e}); name a readable file") from None
    try:  # the parsers load with the first file read
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        elif path.suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"{what} {path}: unknown extension; use .yaml, .yml or .toml")
    except ConfigError:
        raise
    except Exception as e:  # parser errors carry their own line numbers
        raise ConfigError(f"{what} {path}: cannot parse: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: the top level must be a mapping")
    return data


def _build(cls: type, name: str, fields: dict[str, Any], where: str) -> Any:
    fields = dict(fields)
    if cls is GPUSpec and "memory_gib" in fields:
        fields["memory_bytes"] = int(float(fields.pop("memory_gib")) * GiB)
    known = {f.name for f in dataclasses.fields(cls)} - {"name"}
    unknown = set(fields) - known
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    missing = {f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.name != "name"} - set(fields)
    if missing:
        raise ConfigError(f"{where}: missing field(s) {sorted(missing)}")
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    for k, v in fields.items():
        if types[k] in ("int", "float") and isinstance(v, str):  # YAML reads 1.0e7 as a string
            try:
                v = float(v)
            except ValueError:
                raise ConfigError(f"{where}.{k}: expected a number, got {v!r}") from None
        if types[k] == "int" and isinstance(v, float):
            if not v.is_integer():
                raise ConfigError(f"{where}.{k}: expected an integer, got {v!r}")
            v = int(v)
        fields[k] = v
    try:
        return cls(name=name, **fields)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from e


class Catalog:
    """Models and GPUs by name: the built-ins plus any loaded files."""

    def __init__(self, files: list[str | Path] | None = None) -> None:
        self.models = dict(MODELS)
        self.gpus = dict(GPUS)
        for f in files or []:
            self.load(Path(f))

    def load(self, path: Path) -> None:
        data = read_mapping(path)
        for name, fields in (data.get("models") or {}).items():
            self.models[name] = _build(ModelSpec, name, fields, f"{path}: models.{name}")
        for name, fields in (data.get("gpus") or {}).items():
            self.gpus[name] = _build(GPUSpec, name, fields, f"{path}: gpus.{name}")

    def model(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise ConfigError(f"unknown model {name!r}; known: {', '.join(sorted(self.models))} "
                              f"(add your own with --catalog FILE.yaml)") from None

    def gpu(self, name: str) -> GPUSpec:
        try:
            return self.gpus[name]
        except KeyError:
            raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(sorted(self.gpus))} "
                              f"(add your own with --catalog FILE.yaml)") from None
