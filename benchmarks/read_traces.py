"""Time ``traces.read_trace`` on generated 1,000,000-row files (Azure CSV, BurstGPT CSV, generic CSV).

Run: ``python benchmarks/read_traces.py [--rows N]``. Files are written to a temporary directory
and removed afterwards; the generation time is not counted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from traces import read_trace


def write_files(folder: Path, rows: int, seed: int = 0) -> dict[str, tuple[Path, dict]]:
    rng = np.random.default_rng(seed)
    offsets_us = np.cumsum(rng.exponential(200_000, size=rows)).astype(np.int64)
    stamps = np.datetime64("2023-11-16T18:15:46", "us") + offsets_us.astype("timedelta64[us]")
    text = np.char.replace(np.datetime_as_string(stamps, unit="us"), "T", " ")
    prompt = rng.integers(1, 8000, size=rows)
    output = rng.integers(1, 1000, size=rows)
    files = {}
    azure = folder / "azure.csv"
    pd.DataFrame({"TIMESTAMP": np.char.add(text, "0"), "ContextTokens": prompt, "GeneratedTokens": output}) \
        .to_csv(azure, index=False)
    files["azure (date-time strings)"] = (azure, {})
    burst = folder / "burstgpt.csv"
    pd.DataFrame({"Timestamp": offsets_us // 1_000_000, "Model": "ChatGPT", "Request tokens": prompt,
                  "Response tokens": output, "Total tokens": prompt + output, "Log Type": "Conversation log"}) \
        .to_csv(burst, index=False)
    files["burstgpt"] = (burst, {})
    generic = folder / "generic.csv"
    pd.DataFrame({"ts_ms": offsets_us / 1000.0, "in": prompt, "out": output}).to_csv(generic, index=False)
    files["generic (--map, ms)"] = (generic, {"mapping": {"arrival_s": "ts_ms", "prompt_tokens": "in",
                                                         "output_tokens": "out"}, "time_unit": "ms"})
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = write_files(Path(tmp), args.rows)
        for label, (path, kwargs) in files.items():
            start = time.perf_counter()
            trace = read_trace(path, **kwargs)
            elapsed = time.perf_counter() - start
            size_mb = path.stat().st_size / 1e6
            print(f"{label:28s} {len(trace):>9,} rows  {size_mb:6.1f} MB  read in {elapsed:5.2f} s")


if __name__ == "__main__":
    main()
