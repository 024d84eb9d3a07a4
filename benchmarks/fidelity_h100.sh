#!/bin/bash
# The H100 part of the fidelity benchmark, one command on an H100 machine (repository root):
# profiles of llama-2-7b, llama-3-8b and mistral-7b, and the Azure conversation and code slices
# (preset vllm) executed for llama-2-7b and llama-3-8b, as in benchmarks/FIDELITY-h100.md. See
# benchmarks/FIDELITY.md for the rest.
# On an H100 the kernel build takes ~30 s, the conversation slice ~42-44 s and the code slice ~21 s;
# a profile takes 4.8 min (llama-2-7b on the linear grid of its shipped profile, every 64 tokens:
# 285 s measured, of which attn_prefill 99 s) to 8 min (llama-3-8b on today's grid, every 16 tokens
# from 256: 468 s, linear 142 s, attn_prefill 199 s), each table's seconds under the profile's `measure_s`,
# plus decode_step_padded, 3 pairs of timings a cell (with one pair a cell it took 25-30 s,
# measured alone by benchmarks/profile_add_table.sh).
# Where a call is limited to 10 minutes, give it one model:
#   PROFILE_MODELS=llama-2-7b RUN_MODELS=llama-2-7b bash benchmarks/fidelity_h100.sh
# (PROFILE_MODELS="" runs the slices alone; TRACES and PRESETS name other slices and presets).
# Profiles are copied to $OUT as they finish, the executed runs packed at the end.
GPU=h100-80gb PROFILE_MODELS=${PROFILE_MODELS-"llama-2-7b llama-3-8b mistral-7b"} \
  RUN_MODELS=${RUN_MODELS:-"llama-2-7b llama-3-8b"} TRACES=${TRACES:-"azure-conv azure-code"} PRESETS=${PRESETS:-vllm} \
  BUDGET_S=${BUDGET_S:-520} exec bash "$(dirname "$0")/fidelity_device.sh"
