#!/usr/bin/env bash
# Nsight Compute on a GPU machine, from the repository root: the warp-specialized prefill kernel
# (config 7) and cuDNN's SDPA kernel on 32 x 512 new tokens of llama-2-7b's heads and 1 x 8192 of
# llama-3-8b's (one launch each, after two), and the kernel's source counters at 32 x 512. Reports
# under $OUT; the summary lines printed last.
export PYTHONPATH=. PYTHONUNBUFFERED=1 MAX_JOBS=16
python -c "import kernels._build as b; b.extension()" 2>&1 | tail -2
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
for case in "32,0,512 l2" "1,0,8192 l3"; do
  set -- $case
  ncu --clock-control none $S -k regex:ws_kernel --launch-skip 2 --launch-count 1 python kernels/bench/ws_profile.py ws $1 $2 7 > $OUT/ws_${1//,/x}_$2.txt 2>&1
  ncu --clock-control none $S -k regex:"fprop|sdpa|cudnn|fmha|flash" --launch-skip 2 --launch-count 1 python kernels/bench/ws_profile.py cudnn $1 $2 > $OUT/cudnn_${1//,/x}_$2.txt 2>&1
done
ncu --clock-control none --section SourceCounters -k regex:ws_kernel --launch-skip 2 --launch-count 1 python kernels/bench/ws_profile.py ws 32,0,512 l2 7 > $OUT/ws_src.txt 2>&1
ls -la $OUT; grep -h "Duration\|Compute (SM) Throughput\|Registers Per\|Block Size\|Grid Size\|Issue Slots Busy\|No Eligible\|Warp Cycles Per Issued\|Dynamic Shared\|Memory Throughput\|Function Name\| Kernel\|sdpa\|fprop" $OUT/*_*.txt | head -80
