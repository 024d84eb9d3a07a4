#!/usr/bin/env bash
# Tier transfer tables and the tiers' correctness checks on this machine's GPU, one command:
#   bash benchmarks/tier_bandwidth.sh h100      # writes $OUT (or benchmarks/results)/tier-h100.json
# The GPU tests of the tier executor run first; the benchmark's disk tier lives in a temporary
# directory under the repository root (its mount and I/O mode are recorded in the JSON).
set -o pipefail
name=${1:?usage: tier_bandwidth.sh NAME (e.g. h100, h200)}
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} PYTHONPATH=.
python -m pytest -q tests/validation/test_tiers_gpu.py tests/validation/test_tiers.py 2>&1 | tee "$out/tier-$name-tests.log" | tail -3
python benchmarks/tier_bandwidth.py --model llama-3-8b --out "$out/tier-$name.json" 2>&1 | tee "$out/tier-$name.log"
