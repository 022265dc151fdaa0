#!/usr/bin/env bash
# Session 28: where the gather kernel's time goes, by removing one side. Three builds of
# leanmoe_bench_gemms from one tree: p0 = main 122a5b0; p1 = the producers load nothing (each stage's
# barriers still complete: thread 0 expects 0 bytes, the other producer threads arrive with no copy);
# p2 = the consumers issue no wgmma (they still wait, fence and release). Branch probe (the
# LEANMOE_PROBE macro, a dev hack, not for main). p1 is the kernel's MMA + pipeline bound, p2 its feed
# bound; against p0 they say which side the ~11% to QuACK is on. Timed (1) under ncu at base clocks
# (gpu__time_duration, one launch after one warm-up, no power cap in play) and (2) at the steady state
# (leanmoe_bench_gemms, 2 rounds, the three binaries rotated). Carry [".carry/probe"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p0=.carry/probe/bg_p0.xz p1=.carry/probe/bg_p1.xz p2=.carry/probe/bg_p2.xz
say "probe $(cat .carry/probe/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
for g in dw1 dw2 up dh; do
  for p in p0 p1 p2; do
    timeout "$(cap 60)" ncu --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed \
      -k regex:gather_grouped_gemm --launch-skip 1 -c 1 "$B/$p" --shape 120B-n2048 --gemms $g --iters 1 --warmup 1 \
      > "$L/ncu_${g}_$p.txt" 2>&1
    say "ncu 120B-n2048 $g $p rc=$? $(grep -E 'gpu__time_duration|per_second|sm__throughput' "$L/ncu_${g}_$p.txt" | awk '{print $1, $(NF-1), $NF}' | tr '\n' ' ') (t=$SECONDS)"
  done
done
for r in 1 2; do
  for k in 0 1 2; do
    p=p$(( (k + r) % 3 ))
    timeout "$(cap 120)" "$B/$p" --shape 120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b --gemms dw1,dw2,up,dh --iters 20 --warmup 3 \
      --warm-seconds 2 > "$L/steady_r${r}_$p.txt" 2>&1
    say "steady r$r $p rc=$? (t=$SECONDS)"
    grep -E '^\| ' "$L/steady_r${r}_$p.txt" | grep -v '^| shape' | awk -F'|' -v p=$p '{print p, $2, $9, $11}' | tee -a "$S"
  done
done
say "done t=$SECONDS"
