#!/usr/bin/env bash
# Session 28: more of the probe (probe.patch, branch probe): p0 = main 122a5b0; p6 = the varlen-K
# kinds skip their epilogue on a condition the compiler cannot fold (args.E < 0: the MMAs stay);
# p7 = no fence.proxy.async in the bf16 consumer mainloop (QuACK and CUTLASS have none); p8 = the
# consumers' release as one arrive by lanes 0 and 1 (lane r on CTA r's barrier, QuACK's) instead of
# two by lane 0. ncu at base clocks, dW1 and dW2 at three rows; then p0 / p7 / p8 at the steady
# state (2 rounds, rotated). Carry [".carry/probe3"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p0=.carry/probe3/bg_p0.xz p6=.carry/probe3/bg_p6.xz p7=.carry/probe3/bg_p7.xz p8=.carry/probe3/bg_p8.xz
say "probe3 $(cat .carry/probe3/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do
    for p in p0 p6 p7 p8; do
      timeout "$(cap 40)" ncu --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
        -k regex:gather_grouped_gemm --launch-skip 1 -c 1 "$B/$p" --shape $shape --gemms $g --iters 1 --warmup 1 \
        > "$L/ncu_${shape}_${g}_$p.txt" 2>&1
      say "ncu $shape $g $p rc=$? $(grep -E 'gpu__time_duration|sm__throughput' "$L/ncu_${shape}_${g}_$p.txt" | awk '{print $(NF-1), $NF}' | tr '\n' ' ') (t=$SECONDS)"
    done
  done
done
for r in 1 2; do
  for k in 0 1 2; do
    p=$(echo p0 p7 p8 | cut -d' ' -f$(( (k + r) % 3 + 1 )))
    timeout "$(cap 60)" "$B/$p" --shape 120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b --gemms dw1,dw2 --iters 20 --warmup 3 \
      --warm-seconds 2 > "$L/steady_r${r}_$p.txt" 2>&1
    say "steady r$r $p rc=$? (t=$SECONDS)"
    grep -E '^\| ' "$L/steady_r${r}_$p.txt" | grep -v '^| shape' | awk -F'|' -v p=$p '{print p, $2, $9, $11}' | tee -a "$S"
  done
done
say "done t=$SECONDS"
