#!/usr/bin/env bash
# Nsight Compute on a GPU machine, from the repository root: the tensor pipe's active cycles, the
# instructions by pipe and the shared-memory wavefronts of config 7 and of cuDNN's SDPA kernel on
# 1 x 8192 new tokens of llama-3-8b's heads and 32 x 512 of llama-2-7b's (one launch each, after two),
# with the sections that summarise them; reports under $OUT, their key lines printed last.
export PYTHONPATH=. PYTHONUNBUFFERED=1 MAX_JOBS=16
OUT=${OUT:-pipes-run}; mkdir -p "$OUT"
python -c "import kernels._build as b; b.extension()" 2>&1 | tail -1
S="--section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SpeedOfLight --section InstructionStats"
M="--metrics regex:sm__pipe_.*tensor.*cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_.*sum$,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum"
for case in "1,0,8192 l3" "32,0,512 l2"; do
  set -- $case; tag=${1//,/x}_$2
  ncu --clock-control none $S -k regex:ws_kernel --launch-skip 2 --launch-count 1 python kernels/bench/ws_profile.py ws $1 $2 7 > $OUT/sec_ws_$tag.txt 2>&1
  ncu --clock-control none $S -k regex:"fprop|sdpa|cudnn|fmha|flash" --launch-skip 2 --launch-count 1 python kernels/bench/ws_profile.py cudnn $1 $2 > $OUT/sec_cudnn_$tag.txt 2>&1
  ncu --clock-control none $M -k regex:ws_kernel --launch-skip 2 --launch-count 1 python kernels/bench/ws_profile.py ws $1 $2 7 > $OUT/met_ws_$tag.txt 2>&1
  ncu --clock-control none $M -k regex:"fprop|sdpa|cudnn|fmha|flash" --launch-skip 2 --launch-count 1 python kernels/bench/ws_profile.py cudnn $1 $2 > $OUT/met_cudnn_$tag.txt 2>&1
done
for f in $OUT/sec_*.txt $OUT/met_*.txt; do echo "=== $f"; grep -E "Duration|Pipe|pipe|Shared|shared|Tensor|tensor|Issue|Executed Ipc|SM Busy|L1/TEX Hit|Bank|inst_executed|ERR|rror" $f | grep -v "^ *--" | head -40; done
