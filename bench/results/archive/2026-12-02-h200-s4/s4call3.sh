#!/usr/bin/env bash
# Session 4, call 3: with the leaner producer, do the varlen-M schedule choices still hold?
# up/dh under cluster x epilogue switches (two rounds, interleaved), and ncu PC sampling of dW1.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'cp $W/*.txt "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tar.gz" -C "$W" .' EXIT
B=.carry/b
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.txt"
C=7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b
for round in 1 2; do
  for v in "default" "LEANMOE_GEMM_WS_CLUSTER=1" "LEANMOE_GEMM_WS_CLUSTER=0" "LEANMOE_GEMM_WS_EPI=reg" "LEANMOE_GEMM_WS_EPI=reg LEANMOE_GEMM_WS_CLUSTER=1"; do
    echo "### round $round: $v"
    ( [ "$v" = default ] || export $v; timeout 60 $B/leanmoe_bench_gemms --config $C --gemms up,dh --iters 30 2>&1 | grep '^| [0-9a-z]' )
  done
done | tee "$W/gemms_sweep.txt"
echo "== ncu source dw1"
timeout 80 ncu --clock-control none -k regex:ws_grouped_gemm --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no -o "$W/ncu_dw1" \
  $B/leanmoe_bench_gemms --config 120B-n2048 --gemms dw1 --iters 1 --warmup 1 >"$W/ncu_run_dw1.log" 2>&1; echo "rc=$?"
ncu -i "$W/ncu_dw1.ncu-rep" --page source --csv --print-source sass >"$W/ncu_src_dw1.csv" 2>&1
ncu -i "$W/ncu_dw1.ncu-rep" --page details >"$W/ncu_details_dw1.txt" 2>&1
grep -E "Duration|Compute \(SM\)|L2 Cache Throughput|DRAM Throughput" "$W/ncu_details_dw1.txt" | head -5
rm -f "$W/ncu_dw1.ncu-rep"
