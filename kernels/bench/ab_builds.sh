#!/usr/bin/env bash
# Builds of the kernels against the working tree's, on a GPU machine, from the repository root: each
# PATCH (a `git diff` of kernels/csrc, e.g. kernels/results/ws-variants/tmakv.patch) applied to a
# copy of the tree and built in a cache of its own, the prefill tests of every build (the tree's too)
# run, then every build's config 7 timed on the c = 0 prefill shapes (kernels/bench/ab_c0.py), the builds in turn, ROUNDS times.
# The working tree's own build is "base". Logs, test output and ab-NAMEROUND.json under $OUT.
#   bash kernels/bench/ab_builds.sh PATCH...     (ROUNDS=2 by default; BASE_TESTS=0 skips the tree's tests)
set -o pipefail
OUT=${OUT:-ab-run}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export OUT PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8}
ROUNDS=${ROUNDS:-2}
root=$(pwd); work=$(mktemp -d)
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
copy() { mkdir -p "$work/$1" && tar -C "$root" -c --exclude=./.git --exclude=./runs . | tar -x -C "$work/$1"; }
names=(base); copy base
for patch in "$@"; do
  name=$(basename "$patch" .patch); names+=("$name"); copy "$name"
  (cd "$work/$name" && git apply "$root/$patch") || { echo "ab_builds.sh: $patch does not apply to the working tree" >&2; exit 2; }
done
for name in "${names[@]}"; do
  (cd "$work/$name" && PYTHONPATH=. BLOCKSIM_KERNELS_CACHE="$work/cache-$name" timeout 300 \
    python -c "import kernels._build as b; b.extension()" > "$OUT/build-$name.log" 2>&1) &
done
wait; el builds
tested=("${names[@]}"); [ "${BASE_TESTS:-1}" = 0 ] && tested=("${names[@]:1}")
for name in "${tested[@]}"; do
  (cd "$work/$name" && PYTHONPATH=. BLOCKSIM_KERNELS_CACHE="$work/cache-$name" timeout 300 python -m pytest -q -x \
    -p no:cacheprovider tests/kernels/test_paged_prefill.py > "$OUT/tests-$name.log" 2>&1; tail -n 1 "$OUT/tests-$name.log")
  el "tests $name"
done
for r in $(seq 1 "$ROUNDS"); do
  for name in "${names[@]}"; do
    (cd "$work/$name" && PYTHONPATH=. BLOCKSIM_KERNELS_CACHE="$work/cache-$name" TAG="$name$r" timeout 200 \
      python kernels/bench/ab_c0.py) | tee -a "$OUT/ab.txt"
  done
done
el done
