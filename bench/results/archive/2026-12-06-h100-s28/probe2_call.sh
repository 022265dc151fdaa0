#!/usr/bin/env bash
# Session 28: the dW epilogue's share (probe_call.sh's sequel). Builds of leanmoe_bench_gemms from
# branch probe (probe.patch): p0 = main 122a5b0; p3 = the varlen-K kinds store nothing (loads and
# MMAs as p0); p4 = no loads and no stores (MMAs and the pipeline's barriers alone). ncu at base
# clocks, one launch after a warm-up, dW1 and dW2 at 120B-n2048, 30B-n1024, gpt-oss-20b. Carry [".carry/probe2"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p0=.carry/probe2/bg_p0.xz p3=.carry/probe2/bg_p3.xz p4=.carry/probe2/bg_p4.xz
say "probe2 $(cat .carry/probe2/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do
    for p in p0 p3 p4; do
      timeout "$(cap 40)" ncu --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
        -k regex:gather_grouped_gemm --launch-skip 1 -c 1 "$B/$p" --shape $shape --gemms $g --iters 1 --warmup 1 \
        > "$L/ncu_${shape}_${g}_$p.txt" 2>&1
      say "ncu $shape $g $p rc=$? $(grep -E 'gpu__time_duration|sm__throughput' "$L/ncu_${shape}_${g}_$p.txt" | awk '{print $(NF-1), $NF}' | tr '\n' ' ') (t=$SECONDS)"
    done
  done
done
say "done t=$SECONDS"
