#!/usr/bin/env bash
# Session 41, one call for three questions (starts were scarce), most decisive first:
# 1. dev/fp8_promotion_bench.cu: the FP8 promotion structure with the two consumer warpgroups' wgmma
#    groups in strict alternation (fp8-lib-alt, fp8-n192-alt) beside s17's variants (seconds).
# 2. FP8 up / dH in the library's kernel, main (base = bg_c1: the chunk build, whose gather kernels
#    are main's) against branch fp8alt (the same alternation in the FP8 mainloop), ncu at base clocks.
# 3. CUTLASS's down / dx: the static default against tiles from a counter in chunks of 4 (branch
#    chunk), ncu, the small rows first; dx with 64x64 epilogue subtiles at n = 256.
# 4. fp8alt's output digests against main's (the alternation changes no arithmetic) and its FP8 tests,
#    memcheck and racecheck.
# Carry [".carry/s41"], bench/results/archive moved out of the tree.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack fp8p=.carry/s41/fp8p.xz c1=.carry/s41/bg_c1.xz c4=.carry/s41/bg_c4.xz alt=.carry/s41/bg_alt.xz gt=.carry/s41/gt_alt.xz
header .carry/s41/commit
timeout "$(cap 60)" "$B/fp8p" 20000 > "$L/fp8_promotion.txt" 2>&1
say "fp8_promotion rc=$? (t=$SECONDS)"; grep -E '^\|' "$L/fp8_promotion.txt" | tee -a "$S"
for r in 120B-n2048 30B-n1024 7B-n256; do
  for g in up dh; do
    for b in c1 alt; do ncu_ms "fp8_${r}_${g}_$b" $b --shape $r --layout hf --gemms $g --precision fp8; done
  done
done
P=cutlass:pingpong:128x192:auto
cncu() { NCU_KERNEL=GemmUniversal ncu_ms "$@"; }  # CUTLASS's down / dx
for r in 7B-n256 1.4B-n256 1.4B-n512 7B-n1024 30B-n1024 120B-n2048; do
  for g in down dx; do
    cncu "${r}_${g}_static" c1 --shape $r --layout hf --gemms $g
    cncu "${r}_${g}_dyn1x2_c4" c4 --shape $r --layout hf --gemms $g --config $g=$P:tma:c1x2:dyn
  done
  case $r in *-n256)
    cncu "${r}_down_dyn64_c4" c4 --shape $r --layout hf --gemms down --config down=$P:tma64:c1x2:dyn
    cncu "${r}_dx_tma64" c1 --shape $r --layout hf --gemms dx --config dx=$P:tma64:c1x2 ;;
  esac
  [ $r = 1.4B-n512 ] && {  # fp8alt's checks before the large rows (the budget may end there)
    digest base c1 --shape 7B-n256,olmoe-1b-7b --gemms up,dh --precision fp8
    digest alt alt --shape 7B-n256,olmoe-1b-7b --gemms up,dh --precision fp8
    gpu_tests 'ExpertGemmsFp8.*:CudaBackendFp8.*:CudaFp8Weights.*' 'ExpertGemmsFp8.SwiGLUDefaultPath:ExpertGemmsFp8.OneExpertTakesAllRows'
  }
done
say "done t=$SECONDS"
