#!/bin/bash
# The executed runs of benchmarks/tier_fidelity.py on one GPU, one command (from the repository root):
#
#   GPU=h200 bash benchmarks/tier_fidelity.sh            # CONFIGS="none host8-lru-write-back" for a few
#   GPU=h100 MEASURE_TIERS=1 bash benchmarks/tier_fidelity.sh   # an H100 (h100-80gb), its tier tables measured first
#   POLICY=sglang CONFIGS="none host8-lru-write-through" bash benchmarks/tier_fidelity.sh   # another engine
#
# Writes runs/tier_fidelity/exec-$GPU/ (exec-$GPU-$POLICY/ for POLICY vllm-prefix or sglang; one run
# directory per configuration) and, when $OUT is set, packs it into $OUT/tier-fidelity-exec-$GPU.tgz. The disk tier's file lives on the machine's local
# disk (DISK_DIR, default runs/tier_fidelity/disk under the repository). BUDGET_S (seconds from the
# start, kernel build included) stops starting new runs. The machine needs simpy: a wheel under
# .whl/ or runs/fidelity/whl/ is installed when it lacks it. KERNELS (a directory holding a
# kernels/ package, e.g. the committed one exported by `git archive`) replaces the working tree's.
# The executed runs' engine decides (onload recompute) by the shipped profile with the tier tables
# of TABLES (default benchmarks/results/tier-$GPU.json); MEASURE_TIERS=1 measures them first
# (benchmarks/tier_bandwidth.py, written to the run directory) and uses those. PROFILE=1 profiles
# the model first on this machine (blocksim profile, about 4 minutes), into the run directory's
# base-profile.json, which then replaces the shipped profile for the runs and their simulated twins.
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}. MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
GPU=${GPU:-h200}
case $GPU in h100) GPU_NAME=h100-80gb ;; *) GPU_NAME=h200-141gb ;; esac
BUDGET_S=${BUDGET_S:-100000}
POLICY=${POLICY:-vllm-v1}
SUFFIX=$([ "$POLICY" = vllm-v1 ] || echo "-$POLICY")
EXEC=runs/tier_fidelity/exec-$GPU$SUFFIX
DISK_DIR=${DISK_DIR:-runs/tier_fidelity/disk}
. "$(dirname "$0")/device_simpy.sh"   # simpy as a carried wheel where the machine lacks it
if [ -n "${KERNELS:-}" ] && [ -d "$KERNELS/kernels" ]; then
  rm -rf kernels && cp -r "$KERNELS/kernels" kernels
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
df -h "$(dirname "$DISK_DIR")" | tail -1
t0=$(date +%s)
python -c "from kernels._build import extension; extension(); print('kernels built')" || exit 1
echo "kernels: $(( $(date +%s) - t0 )) s"
mkdir -p "$DISK_DIR" "$EXEC"
TABLES=${TABLES:-benchmarks/results/tier-$GPU.json}
if [ -n "${MEASURE_TIERS:-}" ]; then  # the tier tables measured again first, by the code of this tree
  python benchmarks/tier_bandwidth.py --model llama-3-8b --disk-dir "$DISK_DIR" --out "$EXEC/tier-$GPU.json" \
    > "$EXEC/tier-bandwidth.log" 2>&1 && TABLES=$EXEC/tier-$GPU.json
  tail -3 "$EXEC/tier-bandwidth.log"; echo "tier tables: $TABLES, $(( $(date +%s) - t0 )) s"
fi
[ -f "$TABLES" ] || { echo "no tier tables $TABLES: set MEASURE_TIERS=1"; exit 2; }
if [ -n "${PROFILE:-}" ] && [ ! -f "$EXEC/base-profile.json" ]; then  # the model profiled on this machine first
  python -m validation.profile --model llama-3-8b --gpu-name "$GPU_NAME" --out "$EXEC/base-profile.json" --quiet \
    || exit 1
  echo "profile: $(( $(date +%s) - t0 )) s"
fi
BASE=$([ -f "$EXEC/base-profile.json" ] && echo "--base-profile $EXEC/base-profile.json")
python benchmarks/tier_fidelity.py execute --out "$EXEC" --disk-dir "$DISK_DIR" --tier-tables "$TABLES" --gpu "$GPU_NAME" \
    --policy "$POLICY" $BASE --budget-s $(( BUDGET_S - ($(date +%s) - t0) )) ${CONFIGS:+--configs $CONFIGS}
grep -E "^(Traceback|blocksim:)|Error" "$EXEC/execute.log" | sort | uniq -c | head -20
python - "$EXEC" <<'EOF'
import json, sys
from pathlib import Path
for p in sorted(Path(sys.argv[1]).glob("*/executor.json")):
    e = json.loads(p.read_text())
    s = json.loads((p.parent / "summary.json").read_text())
    print(f"{p.parent.name}: ttft mean {s['ttft_mean_s']:.4f} s p90 {s['ttft_p90_s']:.4f} s; tier moves "
          f"{e.get('tier_moves', 0)}, checked loads {e.get('tier_checked_loads', 0)}, mismatches "
          f"{e.get('tier_checksum_mismatches', 0)}, disk {e.get('tier_disk_io', '-')}")
EOF
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/tier-fidelity-exec-$GPU$SUFFIX.tgz" "$EXEC"
fi
echo "done in $(( $(date +%s) - t0 )) s"
