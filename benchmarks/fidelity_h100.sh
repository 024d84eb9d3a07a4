#!/bin/bash
# The H100 part of the fidelity benchmark, one command on an H100 machine (repository root):
# profiles of llama-2-7b, llama-3-8b and mistral-7b, and one executed slice per model
# (the Azure conversation slice, preset vllm). See benchmarks/FIDELITY.md for the rest.
# About 6 minutes on an H100 (kernel build ~30 s, each profile ~2 min, each slice ~45 s); the
# profiles are copied to $OUT as they finish, the executed runs packed at the end.
GPU=h100-80gb PROFILE_MODELS="llama-2-7b llama-3-8b mistral-7b" RUN_MODELS="llama-2-7b llama-3-8b" \
  TRACES="azure-conv" PRESETS="vllm" BUDGET_S=${BUDGET_S:-500} exec bash "$(dirname "$0")/fidelity_device.sh"
