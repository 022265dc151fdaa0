#!/usr/bin/env bash
# Session 40, prepared (not run): CUTLASS's ptr-array down / dx with tiles from a counter taken in
# chunks of consecutive tiles (branch chunk: LEANMOE_DYN_CHUNK, a build-time experiment, never for
# main). Why: the ptr-array kernel rewrites its TMA descriptors whenever a CTA's next tile is another
# expert's; at n <= 512 that is nearly every tile (s10: down at 7B-n256 366 -> 317 us with the same
# rows over 4 experts instead of 128), and s40 traced down 12-23% and dx 6-14% behind QuACK's on the
# small rows. Builds: bg_c1 / bg_c2 / bg_c4 = leanmoe_bench_gemms with chunks of 1 (main's dyn) / 2 /
# 4 and two configs more than main (down's tma64 1x2 with tiles from a counter; ping-pong 192x128 1x2
# for dx); gt_c4 the GPU tests.
# 1. Tests on the c4 build (CutlassDynamicTilesMatchStatic: dyn bit for bit equal to static; every
#    compiled config against the CPU loops), memcheck and racecheck on the dynamic-tiles test.
# 2. ncu at base clocks, one launch after a warm-up, down and dx on six rows: the static default
#    (heuristic, c1 build), then the counter with chunks 1 / 2 / 4, and dx on 192x128 tiles.
# Carry [".carry/chunk"], bench/results/archive moved out of the tree. BUDGET=540.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/device_call.sh
unpack gt=.carry/chunk/gt_c4.xz c1=.carry/chunk/bg_c1.xz c2=.carry/chunk/bg_c2.xz c4=.carry/chunk/bg_c4.xz
header .carry/chunk/commit
gpu_tests 'ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' 'ExpertGemms.CutlassDynamicTilesMatchStatic'
P=cutlass:pingpong:128x192:auto
cncu() {  # NAME BIN ARGS...: one launch of the CUTLASS kernel under ncu (as ncu_ms, for down / dx)
  local name=$1 bin=$2
  shift 2
  timeout "$(cap 40)" ncu --metrics gpu__time_duration.sum -k regex:GemmUniversal --launch-skip 1 -c 1 \
    "$B/$bin" "$@" --iters 1 --warmup 1 > "$L/ncu_$name.txt" 2>&1
  say "ncu $name rc=$? $(grep -E 'gpu__time_duration' "$L/ncu_$name.txt" | awk '{print $(NF-1), $NF}') (t=$SECONDS)"
}
for r in 7B-n256 1.4B-n256 1.4B-n512 7B-n1024 30B-n1024 120B-n2048; do
  for g in down dx; do
    cncu "${r}_${g}_static" c1 --shape $r --layout hf --gemms $g
    for b in c1 c2 c4; do
      cncu "${r}_${g}_dyn1x2_$b" $b --shape $r --layout hf --gemms $g --config $g=$P:tma:c1x2:dyn
    done
  done
  # dx on ping-pong 192x128 1x2, static (QuACK's autotuner's pick for dx on these rows, 4-10% ahead of
  # 128x192 in its own timing; s10 measured it on CUTLASS at 0.90-1.15x by row on the large ones).
  cncu "${r}_dx_192x128" c1 --shape $r --layout hf --gemms dx --config dx=cutlass:pingpong:192x128:auto:tma:c1x2
  case $r in 1.4B-*|7B-*)  # 2x1 static on the small rows (s9, H200: down 1.4B-n512 572 vs 532 TFLOP/s for 1x2)
    for g in down dx; do cncu "${r}_${g}_2x1" c1 --shape $r --layout hf --gemms $g --config $g=$P:tma:c2; done ;;
  esac
  case $r in *-n256)
    for b in c1 c4; do cncu "${r}_down_dyn64_$b" $b --shape $r --layout hf --gemms down --config down=$P:tma64:c1x2:dyn; done ;;
  esac
  case $r in 30B-n1024|120B-n2048)
    for b in c1 c4; do cncu "${r}_dx_dyn2x1_$b" $b --shape $r --layout hf --gemms dx --config dx=$P:tma:c2:dyn; done ;;
  esac
done
say "done t=$SECONDS"
