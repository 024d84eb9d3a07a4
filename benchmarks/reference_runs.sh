#!/usr/bin/env bash
# Replays that cover every preset and preemption path, written under DIR; compare two such trees
# with `python benchmarks/same_records.py BEFORE AFTER`. Needs ../shared/traces beside the repository.
#   bash benchmarks/reference_runs.sh DIR
set -euo pipefail
D=${1:?usage: reference_runs.sh DIR}
T=$(dirname "$0")/../../shared/traces
conv=$T/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
code=$T/azure_llm_2023/AzureLLMInferenceTrace_code.csv
q="--quiet --no-report --cost-profile $(dirname "$0")/roofline_defaults.json"  # the built-in roofline
blocksim replay $conv --out $D/vllm $q
blocksim replay $conv --out $D/chunked --policy vllm-chunked $q
blocksim replay $T/mooncake/synthetic_trace.jsonl --out $D/prefix --policy vllm-prefix $q --clip-to-model
blocksim replay $code --out $D/orca --policy orca-pow2 $q --max-requests 3000
blocksim replay $code --out $D/swap $q --max-requests 3000 --num-gpu-blocks 600 --preemption swap --rate-scale 4 --clip-to-model
blocksim replay $conv --out $D/static --policy static $q --max-requests 2000 --clip-to-model
blocksim replay $conv --out $D/swap2 $q --max-requests 3000 --num-gpu-blocks 1000 --preemption swap --rate-scale 8 --clip-to-model --watermark 0
blocksim replay $conv --out $D/recompute $q --max-requests 3000 --num-gpu-blocks 1000 --rate-scale 8 --clip-to-model --victim largest
blocksim replay $conv --out $D/prio $q --max-requests 3000 --num-gpu-blocks 1000 --rate-scale 8 --clip-to-model --scheduler sjf --policy vllm-chunked
blocksim replay $conv --out $D/vllm-v1 --policy vllm-v1 $q
blocksim replay $conv --out $D/sglang --policy sglang $q
blocksim replay $T/mooncake/synthetic_trace.jsonl --out $D/v1-prefix --policy vllm-v1 $q --clip-to-model
blocksim replay $T/mooncake/synthetic_trace.jsonl --out $D/sglang-prefix --policy sglang $q --clip-to-model
blocksim replay $conv --out $D/v1-recompute --policy vllm-v1 $q --max-requests 3000 --num-gpu-blocks 1000 --rate-scale 8 --clip-to-model
blocksim replay $T/mooncake/synthetic_trace.jsonl --out $D/v1-prefix-recompute --policy vllm-v1 $q --clip-to-model --num-gpu-blocks 600 --max-requests 2000 --rate-scale 4
