#!/usr/bin/env bash
# Nsight Compute's warp-state sampling of config 7 per SASS instruction, on a GPU machine from the
# repository root: 1 x 8192 new tokens of llama-3-8b's heads and 32 x 512 of llama-2-7b's (one launch
# each, after two). Writes src_SHAPE.csv.gz (the source page) and details_SHAPE.txt under $OUT and
# prints kernels/bench/ws_stalls.py's summary of each.
export PYTHONPATH=. PYTHONUNBUFFERED=1 MAX_JOBS=16
OUT=${OUT:-stalls-run}; mkdir -p "$OUT"
python -c "import kernels._build as b; b.extension()" 2>&1 | tail -1
for case in "1,0,8192 l3" "32,0,512 l2"; do
  set -- $case; tag=${1//,/x}_$2
  ncu --clock-control none --section WarpStateStats --section SourceCounters --section SpeedOfLight \
      -k regex:ws_kernel --launch-skip 2 --launch-count 1 -o "$OUT/ws_$tag" -f \
      python kernels/bench/ws_profile.py ws $1 $2 7 > "$OUT/ncu_$tag.log" 2>&1
  ncu -i "$OUT/ws_$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/src_$tag.csv"
  ncu -i "$OUT/ws_$tag.ncu-rep" --page details > "$OUT/details_$tag.txt" 2>&1
  gzip -f "$OUT/src_$tag.csv" && rm -f "$OUT/ws_$tag.ncu-rep"
  python kernels/bench/ws_stalls.py "$OUT/src_$tag.csv.gz"
done
