"""Just-in-time build of the CUDA extension (``torch.utils.cpp_extension.load``), done once per
process on the first CUDA call and cached on disk between processes; a digest of every file under
csrc/ is part of the compile flags, so an edit of any of them (headers included) rebuilds.

The build directory is ``$BLOCKSIM_KERNELS_CACHE`` if set, else ``$TORCH_EXTENSIONS_DIR/blocksim``,
else ``~/.cache/blocksim/kernels``, with one subdirectory per (torch, CUDA, GPU architecture).
Sources are compiled for the GPUs present: ``sm_90a`` on Hopper, ``sm_XY`` elsewhere. ``MAX_JOBS``
bounds the parallel compile jobs; ``BLOCKSIM_KERNELS_VERBOSE=1`` shows the compiler's output;
``BLOCKSIM_NVCC_FLAGS`` adds nvcc flags (e.g. ``-D`` switches of an experiment: such a build gets its
own subdirectory).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    "paged_attention_f32.cu",
    "paged_attention_f16.cu",
    "paged_attention_bf16.cu",
    "cache_ops.cu",
    "fast_decode_f16.cu",
    "fast_decode_bf16.cu",
    "paged_prefill_f16.cu",
    "paged_prefill_bf16.cu",
    "paged_prefill_wgmma.cu",
    "torch_bindings.cpp",
)

_lock = threading.Lock()
_ext = None


def arch_flags(capabilities: set[tuple[int, int]]) -> list[str]:
    """nvcc ``-gencode`` flags for these compute capabilities (Hopper gets its ``a`` variant)."""
    flags = []
    for major, minor in sorted(capabilities):
        cc = f"{major}{minor}a" if (major, minor) == (9, 0) else f"{major}{minor}"
        flags.append(f"-gencode=arch=compute_{cc},code=sm_{cc}")
    return flags


def sources_digest() -> str:
    """A digest of every file under csrc/ (sources and headers). It goes into the compile flags, so
    that an edit of a header alone rebuilds every object: torch's build cache versions the listed
    sources and the flags only, so without it a warm cache keeps the objects of an edited header's
    old version."""
    h = hashlib.sha1()
    for f in sorted(CSRC.iterdir()):
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_dir(capabilities: set[tuple[int, int]]) -> Path:
    if os.environ.get("BLOCKSIM_KERNELS_CACHE"):
        root = Path(os.environ["BLOCKSIM_KERNELS_CACHE"])
    elif os.environ.get("TORCH_EXTENSIONS_DIR"):
        root = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "blocksim"
    else:
        root = Path.home() / ".cache" / "blocksim" / "kernels"
    archs = "-".join(f"sm{a}{b}" for a, b in sorted(capabilities))
    tag = f"torch{torch.__version__}-cuda{torch.version.cuda}-{archs}".replace("+", "_")
    extra = os.environ.get("BLOCKSIM_NVCC_FLAGS", "").strip()
    if extra:
        tag += "-" + hashlib.sha1(extra.encode()).hexdigest()[:10]
    return root / tag


def _check_toolchain() -> None:
    if torch.version.cuda is None:
        raise RuntimeError(
            f"kernels: this torch ({torch.__version__}) is a CPU-only build; the CUDA kernels need a "
            "CUDA build of torch. CPU tensors use the PyTorch references (kernels.vllm.reference, "
            "kernels.fast.reference).")
    if not torch.cuda.is_available():
        raise RuntimeError("kernels: no CUDA device is available; CPU tensors use the PyTorch "
                           "references (kernels.vllm.reference, kernels.fast.reference).")
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    if nvcc is None or not nvcc.exists():
        raise RuntimeError("kernels: nvcc not found, so the CUDA kernels cannot be built. Install the "
                           "CUDA toolkit and set CUDA_HOME (or put nvcc on PATH).")
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401  (the pip package puts the binary on its own path)
        except ImportError:
            raise RuntimeError("kernels: ninja is needed to build the CUDA kernels: "
                               "pip install ninja (or pip install 'blocksim[kernels]').") from None


def extension():
    """The compiled extension module, built (or loaded from the cache) on first use."""
    global _ext
    if _ext is not None:
        return _ext
    with _lock:
        if _ext is None:
            _check_toolchain()
            from torch.utils.cpp_extension import load

            caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
            build = cache_dir(caps)
            build.mkdir(parents=True, exist_ok=True)
            digest = f"-DBLOCKSIM_SOURCES_DIGEST=0x{sources_digest()}"
            _ext = load(
                name="blocksim_kernels",
                sources=[str(CSRC / s) for s in SOURCES],
                extra_cflags=["-O3", digest],
                extra_cuda_cflags=["-O3", "-lineinfo", digest, *arch_flags(caps),
                                   *shlex.split(os.environ.get("BLOCKSIM_NVCC_FLAGS", ""))],
                build_directory=str(build),
                verbose=os.environ.get("BLOCKSIM_KERNELS_VERBOSE") == "1",
            )
    return _ext
