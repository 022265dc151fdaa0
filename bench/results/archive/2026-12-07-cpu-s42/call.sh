#!/usr/bin/env bash
# Session 42: s41's one call (s41_call.sh in 2026-12-07-cpu-s41), rebuilt from this folder's patches
# (s41's branches did not survive into this checkout): prepare.sh builds main (c1) and main + the
# folder's patches (all). Most decisive first:
# 1. dev/fp8_promotion_bench.cu: the FP8 promotion with the two consumer warpgroups' wgmma groups in
#    strict alternation (fp8-lib-alt, fp8-n192-alt) beside s17's variants (seconds).
#    dev/epilogue_overlap_bench.cu: a tile's epilogue under the warpgroup's next tile's wgmmas (two
#    64-register accumulator sets) against the cooperative order (seconds).
# 2. The chunked counter's correctness: down / dx with `:dyn` bitwise equal to the static kernel's
#    (ExpertGemms.CutlassDynamicTilesMatchStatic, now with tma64 1x2 too) before any of its timings.
# 3. FP8 up / dH, main against fp8alt.patch (the same alternation in the library's FP8 mainloop),
#    ncu at base clocks.
# 4. CUTLASS's down / dx: the static default against tiles from a counter in chunks of 4
#    (chunk.patch), ncu, the small rows first; dx with 64x64 epilogue subtiles at n = 256.
# 5. fp8alt's output digests against main's (the alternation changes no arithmetic), the FP8 tests
#    with memcheck and racecheck; every compiled configuration (the new tma64 dyn kernel among them);
#    the forward in expert groups (fwdgroups.patch) bitwise against the ordinary one, memcheck and
#    racecheck.
# Carry [".carry/s42"], bench/results/archive moved out of the tree. BUDGET=540.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/device_call.sh
unpack fp8p=.carry/s42/fp8p.xz eob=.carry/s42/eob.xz c1=.carry/s42/bg_c1.xz all=.carry/s42/bg_all.xz gt=.carry/s42/gt_all.xz
header .carry/s42/commit
dev_bench fp8_promotion fp8p 20000
dev_bench epilogue_overlap eob 2000
gpu_tests 'ExpertGemms.CutlassDynamicTilesMatchStatic'
for r in 120B-n2048 30B-n1024 7B-n256; do
  for g in up dh; do
    for b in c1 all; do ncu_ms "fp8_${r}_${g}_$b" $b --shape $r --layout hf --gemms $g --precision fp8; done
  done
done
P=cutlass:pingpong:128x192:auto
for r in 7B-n256 1.4B-n256 1.4B-n512 7B-n1024 30B-n1024 120B-n2048; do
  for g in down dx; do
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_${g}_static" c1 --shape $r --layout hf --gemms $g
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_${g}_dyn1x2_c4" all --shape $r --layout hf --gemms $g --config $g=$P:tma:c1x2:dyn
  done
  case $r in *-n256)
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_down_dyn64_c4" all --shape $r --layout hf --gemms down --config down=$P:tma64:c1x2:dyn
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_dx_tma64" c1 --shape $r --layout hf --gemms dx --config dx=$P:tma64:c1x2 ;;
  30B-n1024 | 120B-n2048)  # the H100's dx default there: 2x1 from the counter, chunks of 1 (main) vs 4
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_dx_dyn2x1_c1" c1 --shape $r --layout hf --gemms dx --config dx=$P:tma:c2:dyn
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_dx_dyn2x1_c4" all --shape $r --layout hf --gemms dx --config dx=$P:tma:c2:dyn ;;
  esac
  [ $r = 1.4B-n512 ] && {  # fp8alt's checks before the large rows (the budget may end there)
    digest base c1 --shape 7B-n256,olmoe-1b-7b --gemms up,dh --precision fp8
    digest alt all --shape 7B-n256,olmoe-1b-7b --gemms up,dh --precision fp8
    gpu_tests 'ExpertGemmsFp8.*:CudaBackendFp8.*:CudaFp8Weights.*' 'ExpertGemmsFp8.SwiGLUDefaultPath:ExpertGemmsFp8.OneExpertTakesAllRows'
  }
done
gpu_tests 'ExpertGemms.EveryCompiledConfig' 'ExpertGemms.CutlassDynamicTilesMatchStatic'
gpu_tests 'ForwardOverlap.*' 'ForwardOverlap.TopKBiasesAndLayoutsBitwise'
say "done t=$SECONDS"
