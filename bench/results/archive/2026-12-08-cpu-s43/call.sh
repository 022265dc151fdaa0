#!/usr/bin/env bash
# Session 43: one call in place of s42's three (2026-12-07-cpu-s42: call.sh, fwd_call.sh,
# layer_call.sh), because refused starts cost 90 s (H100) or 180 s (H200) of the device budget. The
# binaries are s42's prepare.sh's (main 4945a4d, and "all" = main + chunk.patch + fp8alt.patch +
# fwdgroups.patch). Most decisive first:
# 1. the dev benches (seconds): FP8 promotion with the warpgroups' wgmma groups alternating; a
#    tile's epilogue under the next tile's wgmmas (two accumulator sets) against the cooperative order;
# 2. correctness before timing: the grouped forward bitwise against the ordinary one, and down / dx
#    from the chunked counter bitwise against the static kernel;
# 3. the grouped forward (`--fwd-overlap G:S`) against the ordinary one, graph replays at the steady
#    state, 2 rounds, variants rotated (fwd_call.sh on 3 rows);
# 4. FP8 up / dH, main against the alternation, ncu at base clocks;
# 5. down / dx static against the chunks of 4 on the small rows, ncu;
# 6. sanitizers on the grouped forward and every compiled configuration.
# Carry [".carry/s42", ".carry/s42_layer/leanmoe_all.xz"], bench/results/archive moved out. BUDGET=540.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/device_call.sh
unpack fp8p=.carry/s42/fp8p.xz eob=.carry/s42/eob.xz c1=.carry/s42/bg_c1.xz all=.carry/s42/bg_all.xz \
  gt=.carry/s42/gt_all.xz leanmoe=.carry/s42_layer/leanmoe_all.xz
header .carry/s42/commit
dev_bench fp8_promotion fp8p 20000
dev_bench epilogue_overlap eob 2000
gpu_tests 'ForwardOverlap.*:ExpertGemms.CutlassDynamicTilesMatchStatic'
declare -A V
V[off]=""
V[g4s16]="--fwd-overlap 4:16"
V[g2s24]="--fwd-overlap 2:24"
layer_rounds 2 7B-n256,1.4B-n256,olmoe-1b-7b off g4s16 g2s24
for r in 120B-n2048 7B-n256; do
  for g in up dh; do
    for b in c1 all; do ncu_ms "fp8_${r}_${g}_$b" $b --shape $r --layout hf --gemms $g --precision fp8; done
  done
done
P=cutlass:pingpong:128x192:auto
for r in 7B-n256 1.4B-n256; do
  for g in down dx; do
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_${g}_static" c1 --shape $r --layout hf --gemms $g
    NCU_KERNEL=GemmUniversal ncu_ms "${r}_${g}_dyn1x2_c4" all --shape $r --layout hf --gemms $g --config $g=$P:tma:c1x2:dyn
  done
  NCU_KERNEL=GemmUniversal ncu_ms "${r}_down_dyn64_c4" all --shape $r --layout hf --gemms down --config down=$P:tma64:c1x2:dyn
done
gpu_tests 'ExpertGemms.EveryCompiledConfig' 'ForwardOverlap.TopKBiasesAndLayoutsBitwise'
say "done t=$SECONDS"
