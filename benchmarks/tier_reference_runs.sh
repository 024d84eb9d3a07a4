#!/usr/bin/env bash
# Replays with KV tiers that cover every eviction, write and onload policy, the prefix-caching
# presets and recorded plans (tier moves), written under DIR; compare two such trees with
# `python benchmarks/same_records.py BEFORE AFTER`. Runs the tree the script is in; needs
# ../shared/traces beside the repository.
#   bash benchmarks/tier_reference_runs.sh DIR
set -euo pipefail
D=${1:?usage: tier_reference_runs.sh DIR}
R=$(cd "$(dirname "$0")/.." && pwd)
M=$R/../shared/traces/mooncake/synthetic_trace.jsonl
q="--quiet --no-report --clip-to-model --cost-profile $R/benchmarks/roofline_defaults.json"
big="--tier-host-gib 256 --tier-disk-gib 2048"
small="--tier-host-gib 16 --tier-disk-gib 64"
run() { out=$1; shift; PYTHONPATH=$R python -m blocksim replay $M --out "$D/$out" $q "$@" > /dev/null; }
run v1-wait --policy vllm-v1 $big
run v1-recompute --policy vllm-v1 $big --tier-onload recompute
run v1-host --policy vllm-v1 --tier-host-gib 256
run v1-chunk256 --policy vllm-v1 $big --tier-chunk-tokens 256
run v1-small --policy vllm-v1 $small
run v1-small-recompute --policy vllm-v1 $small --tier-onload recompute
run v1-small-plan --policy vllm-v1 $small --record-plan --max-requests 1500
run v1-lfu-arc-deadline --policy vllm-v1 $small --tier-host-eviction lfu --tier-disk-eviction arc --tier-onload deadline --tier-onload-deadline-ms 5
run v1-arc-lfu --policy vllm-v1 $small --tier-host-eviction arc --tier-disk-eviction lfu
run v1-write-back --policy vllm-v1 $small --tier-host-write write-back --tier-disk-write write-through
run v1-selective --policy vllm-v1 $small --tier-host-write write-through-selective --tier-disk-write write-through-selective --tier-write-hits 2
run v1-disk-only --policy vllm-v1 --tier-disk-gib 64
run v1-host-tiny --policy vllm-v1 --tier-host-gib 1 --tier-disk-gib 4 --tier-chunk-tokens 32
run prefix-wait --policy vllm-prefix $big
run prefix-small-write-back --policy vllm-prefix $small --tier-host-write write-back
run sglang-wait --policy sglang $big
run sglang-small-recompute --policy sglang $small --tier-onload recompute
