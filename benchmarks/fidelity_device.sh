#!/bin/bash
# Fidelity measurements on one GPU: cost profiles of PROFILE_MODELS, then executed (GPU-in-the-loop)
# replays of the fidelity slices for RUN_MODELS. Run from the repository root on the GPU machine:
#
#   GPU=h200-141gb PROFILE_MODELS="llama-2-7b llama-3-8b mistral-7b" RUN_MODELS="llama-2-7b llama-3-8b" \
#       bash benchmarks/fidelity_device.sh
#
# Writes the profiles to blocksim/profiles/ (the shipped location), the executed runs to
# runs/fidelity/exec/, and packs both into $OUT/fidelity-$GPU.tgz when $OUT is set. BUDGET_S
# (seconds from the start, kernel build included): no run starts that its simulated twin says
# would end past it, with a margin (`fidelity_runs.py execute --budget-s`). The machine needs
# simpy: a wheel under .whl/ or runs/fidelity/whl/ is installed when it lacks it. PROFILE_ARGS: more
# options of `blocksim profile` (e.g. "--leave-out decode_step_padded"). EXECUTOR_PREFILL: the executed
# runs' `--executor-prefill` (e.g. wgmma, with PROFILE_ARGS="--prefill wgmma" for profiles that price
# them alike). WIDE_STEPS: a model whose
# steps benchmarks/wide_steps.py times after the runs (below). CALIBRATE=1: first (before any
# profile of PROFILE_MODELS replaces a shipped one), each RUN_MODELS model's shipped profile is
# calibrated to this machine (`blocksim profile --calibrate`: a sample of its cells measured here,
# each seconds table scaled by its median ratio) into runs/fidelity/calibrated/<shipped name>, and
# copied to $OUT/calibrated/. Price the executed runs' twins with them by
#   python benchmarks/fidelity_runs.py simulate --exec runs/fidelity/exec --out DIR --profile-dir runs/fidelity/calibrated
# (PROFILE_MODELS="" to measure no whole profile). RUNS="model:trace:preset ...": those executed
# runs alone, in that order (instead of RUN_MODELS x TRACES x PRESETS); the runs so far are packed
# into $OUT after each, so a call stopped by its time limit keeps them.
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}. MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
GPU=${GPU:-h200-141gb}
PROFILE_MODELS=${PROFILE_MODELS-"llama-2-7b llama-3-8b mistral-7b"}
RUN_MODELS=${RUN_MODELS:-"llama-2-7b llama-3-8b"}
[ -n "${RUNS:-}" ] && RUN_MODELS=$(for r in $RUNS; do echo "${r%%:*}"; done | sort -u | xargs)  # RUNS' models
TRACES=${TRACES:-"azure-conv azure-code mooncake mooncake-prefix"}
PRESETS=${PRESETS:-"vllm vllm-prefix vllm-chunked swap-n2"}
BUDGET_S=${BUDGET_S:-100000}
EXEC=runs/fidelity/exec
. "$(dirname "$0")/device_simpy.sh"   # simpy as a carried wheel where the machine lacks it
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t0=$(date +%s)
build() { python -c "from kernels._build import extension; e = extension(); print('kernels built; paged prefill kernel:', hasattr(e, 'paged_prefill'))"; }
if ! build && [ -d runs/fidelity/kernels_head/kernels ]; then  # a carried copy of the committed kernels
  echo "the working tree's kernels do not build: using runs/fidelity/kernels_head"
  rm -rf kernels && cp -r runs/fidelity/kernels_head/kernels kernels && build || exit 1
fi
echo "kernels: $(( $(date +%s) - t0 )) s"
if [ "${CALIBRATE:-0}" = 1 ]; then
  mkdir -p runs/fidelity/calibrated
  for m in $RUN_MODELS; do
    f="runs/fidelity/calibrated/${m}__${GPU}__float16__tp1.json"
    python -m validation.profile --model "$m" --gpu-name "$GPU" --calibrate --out "$f" || echo "calibrate $m failed"
    [ -n "${OUT:-}" ] && [ -f "$f" ] && mkdir -p "$OUT/calibrated" && cp "$f" "$OUT/calibrated/"
  done
  echo "calibrated: $(( $(date +%s) - t0 )) s"
fi
for m in $PROFILE_MODELS; do
  f="blocksim/profiles/${m}__${GPU}__float16__tp1.json"
  python -m validation.profile --model "$m" --gpu-name "$GPU" --out "$f" ${PROFILE_ARGS:-} || echo "profile $m failed"
  [ -n "${OUT:-}" ] && [ -f "$f" ] && cp "$f" "$OUT/"   # each profile comes back even if a later step runs out of time
done
echo "profiles: $(( $(date +%s) - t0 )) s"
pack() {  # what this call has measured so far, into $OUT (a call stopped later keeps it)
  [ -n "${OUT:-}" ] && tar czf "$OUT/fidelity-$GPU.tgz" $EXEC blocksim/profiles/*__${GPU}__*.json \
      $( [ -d runs/fidelity/calibrated ] && echo runs/fidelity/calibrated ) 2>/dev/null
}
execute() {  # MODELS TRACES PRESETS: their runs, those that fit in what is left of BUDGET_S
  python benchmarks/fidelity_runs.py execute --out $EXEC --gpu "$GPU" --models $1 --traces $2 --presets $3 \
      --budget-s $(( BUDGET_S - ($(date +%s) - t0) )) ${EXECUTOR_PREFILL:+--executor-prefill $EXECUTOR_PREFILL}
  pack
}
if [ -n "${RUNS:-}" ]; then  # RUNS="model:trace:preset ...": these runs alone, in this order
  for r in $RUNS; do IFS=: read -r m tr pr <<< "$r"; execute "$m" "$tr" "$pr"; done
else
  execute "$RUN_MODELS" "$TRACES" "$PRESETS"
fi
grep -E "^(Traceback|blocksim:)|Error" $EXEC/execute.log | sort | uniq -c | head -20
for f in $EXEC/*/executor.json; do  # steps whose host fell behind the sleeps (validation/VALIDATION.md)
  python -c "import json, sys; e = json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-2], 'steps', e['steps'], 'late', e.get('late_steps'), 'timed again', e.get('retimed_steps'))" "$f"
done
[ -n "${OUT:-}" ] && cp $EXEC/execute.log "$OUT/execute-$GPU.log"
# WIDE_STEPS="MODEL": then, within BUDGET_S, benchmarks/wide_steps.py on that model: the chunked
# steps with the off-grid linear points, then the linear sweeps (each about two minutes)
for args in ${WIDE_STEPS:+"--cases chunked --offgrid:chunked" "--sweep:sweep"}; do
  left=$(( BUDGET_S - ($(date +%s) - t0) ))
  if [ $left -lt 60 ]; then echo "wide_steps ${args%%:*}: skipped (BUDGET_S)"; continue; fi
  timeout $left python benchmarks/wide_steps.py --model "$WIDE_STEPS" ${args%%:*} \
      --out "${OUT:-runs/fidelity}/wide-steps-${args##*:}-$GPU.json" 2>&1 | tail -20
done
echo "done in $(( $(date +%s) - t0 )) s"
