#!/usr/bin/env bash
# Session 28: the varlen-K tile order. The probe (probe_call.sh) put dW1's loss in the overlap of
# loads and MMAs (no loads 6.37 ms, no MMAs 5.08, both 7.42, QuACK 6.71 at base clocks), and QuACK's
# dW1 hits L2 more (83% vs 76.5%) with a square group of tiles walked serpentine. Branch serp:
# main + odd bands of row units walk the n-units backwards. Two binaries of leanmoe_bench_gemms (main
# 122a5b0, serp), dW1 at bands 1/4/8 and dW2 at 1/2: (1) ncu at base clocks (duration, L2 hit rate,
# DRAM bytes read; one launch after warm-up) at 120B-n2048 and 30B-n1024; (2) the steady state, 2
# rounds, the two binaries alternating. Carry [".carry/serp"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack main=.carry/serp/bg_main.xz serp=.carry/serp/bg_serp.xz
say "serp $(cat .carry/serp/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
G=gather:coop
C1="dw1=$G:256x128:s4:tma:c2"; C2="dw2=$G:128x256:s4:tma:c2"
for shape in 120B-n2048 30B-n1024; do
  for cfg in "$C1:b1" "$C1:b4" "$C1:b8" "$C2:b1" "$C2:b2"; do
    for bin in main serp; do
      timeout "$(cap 40)" ncu --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
        -k regex:gather_grouped_gemm --launch-skip 1 -c 1 "$B/$bin" --shape $shape --gemms ${cfg%%=*} --config "$cfg" \
        --iters 1 --warmup 1 > "$L/ncu_${shape}_${cfg//[:=]/_}_$bin.txt" 2>&1
      say "ncu $shape ${cfg#*c2:} ${cfg%%=*} $bin rc=$? $(grep -E 'gpu__time_duration|sector_hit_rate|dram__bytes_read' "$L/ncu_${shape}_${cfg//[:=]/_}_$bin.txt" | awk '{print $(NF-1), $NF}' | tr '\n' ' ') (t=$SECONDS)"
    done
  done
done
for r in 1 2; do
  for bin in main serp; do
    [ $r = 2 ] && bin=$([ $bin = main ] && echo serp || echo main)
    timeout "$(cap 100)" "$B/$bin" --shape 120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b --gemms dw1,dw2 \
      --config "$C1:b1,$C1:b4,$C1:b8,$C2:b1,$C2:b2" --iters 20 --warmup 3 --warm-seconds 2 > "$L/steady_r${r}_$bin.txt" 2>&1
    say "steady r$r $bin rc=$? (t=$SECONDS)"
    grep -E '^\| ' "$L/steady_r${r}_$bin.txt" | grep -v '^| shape' | awk -F'|' -v b=$bin '{print b, $2, $9, $10, $11}' | tee -a "$S"
  done
done
say "done t=$SECONDS"
