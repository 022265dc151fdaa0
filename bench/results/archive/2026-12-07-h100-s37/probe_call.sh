#!/usr/bin/env bash
# Session 37, call 7: which operand's loads take dW's time when nothing else runs. Four builds of
# leanmoe_bench_gemms from branch probe37 (main + the LEANMOE_PROBE macro, a dev hack): p0 = main;
# p2 = the consumers issue no wgmma (s28's loads-alone probe); p10 = that and no TMA (the gathered
# copies alone); p11 = no wgmma and no gathered copies in full k-tiles (the TMA boxes alone). ncu at
# base clocks, one launch after a warm-up, dW1 and dW2 at three rows; then the throughput breakdown
# (SM, L2, DRAM, % of peak) of each build at 120B-n2048.
# Carry [".carry/probe37"], bench/results/archive moved out of the tree. BUDGET=200, ~110 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p0=.carry/probe37/bg_p0.xz p2=.carry/probe37/bg_p2.xz p10=.carry/probe37/bg_p10.xz p11=.carry/probe37/bg_p11.xz
header .carry/probe37/commit
for r in 120B-n2048 gpt-oss-20b 30B-n1024; do
  for g in dw1 dw2; do for p in p0 p2 p10 p11; do ncu_ms "${r}_${g}_$p" $p --shape $r --layout hf --gemms $g; done; done
done
m=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
for g in dw1 dw2; do
  for p in p0 p2 p10 p11; do
    timeout "$(cap 30)" ncu --metrics $m -k regex:gather_grouped_gemm --launch-skip 1 -c 1 "$B/$p" --shape 120B-n2048 \
      --layout hf --gemms $g --iters 1 --warmup 1 > "$L/ncuthr_${g}_$p.txt" 2>&1
    say "thr 120B-n2048 $g $p rc=$? $(grep -E '__' "$L/ncuthr_${g}_$p.txt" | awk '{print $1, $NF}' | tr '\n' ' ') (t=$SECONDS)"
  done
done
say "done t=$SECONDS"
