#!/usr/bin/env bash
# The paged prefill kernel on a GPU, from the repository root: the build, its GPU tests with the
# decode kernel's, and the benchmark's prefill_tiles and prefill sections. Writes NAME-build.log,
# NAME-prefill-tests.log, NAME-prefill.json (every figure) and NAME-prefill.txt (the tables) under
# $OUT (default: ./prefill-run).
# Usage: bash kernels/bench/gpu_prefill.sh [NAME]   (e.g. h100; default: the GPU's model, lower case)
#        SECTIONS=prefill bash kernels/bench/gpu_prefill.sh NAME   (other sections; default prefill_tiles,prefill)
set -o pipefail
OUT=${OUT:-prefill-run}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
name=${1:-$(python -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())")}
python -c "import time, kernels._build as b; t = time.time(); b.extension(); print(f'build {time.time() - t:.0f} s')" \
  2>&1 | tee "$OUT/$name-build.log" || exit 1
python -m pytest -q -p no:cacheprovider tests/kernels/test_paged_prefill.py tests/kernels/test_prefill_reference.py \
  tests/kernels/test_fast_decode.py 2>&1 | tee "$OUT/$name-prefill-tests.log" | tail -n 30
python -m kernels.bench --sections "${SECTIONS:-prefill_tiles,prefill}" --json "$OUT/$name-prefill.json" 2>&1 | tee "$OUT/$name-prefill.txt"
