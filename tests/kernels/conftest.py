"""Reports the CUDA device (if any) in the pytest header, so GPU test logs name their device."""

from __future__ import annotations


def pytest_report_header(config):
    try:
        import torch
    except ImportError:
        return "kernels: torch not installed"
    if not torch.cuda.is_available():
        return f"kernels: torch {torch.__version__}, no CUDA device (GPU tests skipped)"
    p = torch.cuda.get_device_properties(0)
    return (f"kernels: torch {torch.__version__}, CUDA {torch.version.cuda}, device {p.name} "
            f"(sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB)")
