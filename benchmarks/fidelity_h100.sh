#!/bin/bash
# The H100 part of the fidelity benchmark, one command on an H100 machine (repository root):
# profiles of llama-2-7b, llama-3-8b and mistral-7b, and one executed slice per model
# (the Azure conversation slice, preset vllm). See benchmarks/FIDELITY.md for the rest.
# On an H100 the kernel build takes ~30 s, a slice ~35 s, a profile 4-6 min (llama-2-7b about 4,
# llama-3-8b over 5.5, measured before the linear table's 64-token grid added 64 points); where a
# call is limited to 10 minutes, give PROFILE_MODELS one model a call
# (PROFILE_MODELS="" runs the slices alone). Profiles are copied to $OUT as they finish, the
# executed runs packed at the end.
GPU=h100-80gb PROFILE_MODELS=${PROFILE_MODELS-"llama-2-7b llama-3-8b mistral-7b"} RUN_MODELS="llama-2-7b llama-3-8b" \
  TRACES="azure-conv" PRESETS="vllm" BUDGET_S=${BUDGET_S:-500} exec bash "$(dirname "$0")/fidelity_device.sh"
