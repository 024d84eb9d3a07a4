#!/bin/bash
# Tensor-parallel fidelity on one machine with several GPUs: cost profiles of MODELS at each degree
# of DEGREES that the machine's GPU count allows, executed (GPU-in-the-loop) replays of the fidelity
# slices at those degrees, their simulated twins, and the errors merged into
# benchmarks/results/fidelity-$GPU.json (rows with tensor_parallel set). Run from the repository
# root on the GPU machine:
#
#   GPU=h200-141gb bash benchmarks/tp_device.sh                 # llama-2-70b and llama-3-70b at TP 2, 4, 8
#   GPU=h200-141gb MODELS=llama-2-70b DEGREES=2 PRESETS=vllm TRACES=azure-conv bash benchmarks/tp_device.sh
#
# Writes the profiles to blocksim/profiles/<model>__$GPU__float16__tp<N>.json (the shipped
# location), the executed runs to runs/fidelity/tp/exec/, the twins to runs/fidelity/tp/sim/, and
# packs them into $OUT/tp-$GPU.tgz when $OUT is set. BUDGET_S (seconds from the start): no executed
# run starts that its simulated twin says would end past it (`fidelity_runs.py execute --budget-s`).
# One process per GPU (validation.sharded); NVLink multicast stays off in every process (the three
# variables below, also set by validation.sharded for its workers).
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}. MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPU=${GPU:-h200-141gb}
MODELS=${MODELS:-"llama-2-70b llama-3-70b"}
DEGREES=${DEGREES:-"2 4 8"}
TRACES=${TRACES:-"azure-conv azure-code mooncake"}
PRESETS=${PRESETS:-"vllm vllm-prefix vllm-chunked swap-n2"}
BUDGET_S=${BUDGET_S:-100000}
ROOT=runs/fidelity/tp
EXEC=$ROOT/exec
. "$(dirname "$0")/device_simpy.sh"   # simpy as a carried wheel where the machine lacks it
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
NGPU=$(nvidia-smi -L | wc -l)
t0=$(date +%s)
python -c "from kernels._build import extension; e = extension(); print('kernels built; paged prefill kernel:', hasattr(e, 'paged_prefill'))" || exit 1
echo "kernels: $(( $(date +%s) - t0 )) s"
RUN=""
for tp in $DEGREES; do
  if [ "$tp" -gt "$NGPU" ]; then echo "tensor parallel $tp: skipped ($NGPU GPUs)"; continue; fi
  RUN="$RUN $tp"
  for m in $MODELS; do
    f="blocksim/profiles/${m}__${GPU}__float16__tp${tp}.json"
    python -m validation.profile --model "$m" --gpu-name "$GPU" --tensor-parallel "$tp" --out "$f" \
      || echo "profile $m tp$tp failed"
    [ -n "${OUT:-}" ] && [ -f "$f" ] && cp "$f" "$OUT/"   # each profile comes back even if a later step runs out of time
  done
done
echo "profiles: $(( $(date +%s) - t0 )) s"
for tp in $RUN; do
  left=$(( BUDGET_S - ($(date +%s) - t0) ))
  python benchmarks/fidelity_runs.py execute --out $EXEC --gpu "$GPU" --models $MODELS --traces $TRACES \
      --presets $PRESETS --tensor-parallel "$tp" --budget-s $left
done
grep -E "^(Traceback|blocksim:)|Error" $EXEC/execute.log | sort | uniq -c | head -20
python benchmarks/fidelity_runs.py simulate --exec $EXEC --out $ROOT/sim
python benchmarks/fidelity_runs.py results --exec $EXEC --sim $ROOT/sim --merge \
    --json benchmarks/results/fidelity-$GPU.json --markdown $ROOT/table.md
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/tp-$GPU.tgz" $EXEC $ROOT/sim/*/*/summary.json $ROOT/table.md benchmarks/results/fidelity-$GPU.json \
      blocksim/profiles/*__${GPU}__*tp[2-8].json 2>/dev/null
  cp $EXEC/execute.log "$OUT/execute-tp-$GPU.log"
fi
echo "done in $(( $(date +%s) - t0 )) s"
