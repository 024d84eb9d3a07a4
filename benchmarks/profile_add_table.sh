#!/bin/bash
# Tables (`blocksim profile --add-table`) measured into the shipped profiles of this GPU, replacing
# them there, one command on the GPU machine (repository root):
#
#   TABLES="attn_decode decode_step" MODELS="llama-2-7b llama-3-8b" bash benchmarks/profile_add_table.sh
#
# The GPU is the catalog's for the device's name (H100 -> h100-80gb, H200 -> h200-141gb); each
# profile is copied to $OUT as it is written. The machine needs simpy: see device_simpy.sh.
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}. MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
TABLES=${TABLES:-decode_step_padded}
args=(); for t in $TABLES; do args+=(--add-table "$t"); done
MODELS=${MODELS:-"llama-2-7b llama-3-8b"}
. "$(dirname "$0")/device_simpy.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
GPU=$(python -c "import torch; from validation.profile import catalog_gpu; print(catalog_gpu(torch.cuda.get_device_name()) or '')")
[ -n "$GPU" ] || { echo "profile_add_table.sh: this device is none of the catalog's GPUs" >&2; exit 2; }
t0=$(date +%s)
python -c "from kernels._build import extension; extension()" || exit 1
echo "kernels: $(( $(date +%s) - t0 )) s"
rc=0
for m in $MODELS; do
  f="blocksim/profiles/${m}__${GPU}__float16__tp1.json"
  if python -m blocksim profile --model "$m" "${args[@]}" --out "$f"; then
    [ -n "${OUT:-}" ] && cp "$f" "$OUT/"
  else
    echo "$m: $TABLES failed; $f left as it was" >&2; rc=1
  fi
  echo "$m: $(( $(date +%s) - t0 )) s"
done
exit $rc
