#!/usr/bin/env bash
# Session 5, call 4: where dH spends its time now (per-warp epilogue, lean producer), against up:
# ncu PC sampling + details of one launch each at 120B-n2048.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'cp $W/*.txt "$FINAL/" 2>/dev/null' EXIT
B=.carry/b; commit="$(cat $B/commit)"; echo "commit $commit"
for g in dh up; do
  echo "== ncu $g (t=${SECONDS}s)"
  timeout 120 ncu --clock-control none -k regex:ws_grouped_gemm --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis \
    --import-source no -o "$W/ncu_$g" \
    $B/leanmoe_bench_gemms --config 120B-n2048 --gemms $g --iters 1 --warmup 1 >"$W/ncu_run_$g.txt" 2>&1; echo "rc=$?"
  ncu -i "$W/ncu_$g.ncu-rep" --page source --csv --print-source sass >"$W/src_$g.csv" 2>&1
  ncu -i "$W/ncu_$g.ncu-rep" --page details >"$W/ncu_details_$g.txt" 2>&1
  python3 bench/ncu_source_summary.py "$W/src_$g.csv" --top 40 >"$W/ncu_source_$g.txt"
  grep -E "Duration|Throughput|Hit Rate|Warp Cycles" "$W/ncu_details_$g.txt" | head -14
  head -22 "$W/ncu_source_$g.txt"
done
