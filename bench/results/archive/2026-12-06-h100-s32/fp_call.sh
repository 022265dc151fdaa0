#!/usr/bin/env bash
# Session 32 (prepared for the next session): the varlen-K producer with its gathered rows resolved
# before the stage's empty wait (branch feedpre: the shuffles and the row offsets of k-tile kt+1 are
# computed right after k-tile kt's copies, so after the wait each producer thread issues only its 8
# copies). Against main (p0 = 7204877's binaries, library kernels SASS-identical to main 61a204a's):
# ncu at base clocks of dW1 and dW2 at three rows, then the layer (graph, steady state, 2 rotating
# rounds), then feedpre's whole GPU suite with memcheck and racecheck on the dW tests.
# Carry [".carry/fp", ".carry/vk2/bg_vk.xz", ".carry/vk2/leanmoe_vk.xz"], bench/results/archive moved
# out of the tree. ~330 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/fp/gt_fp.xz p0=.carry/vk2/bg_vk.xz fp=.carry/fp/bg_fp.xz \
  leanmoe_p0=.carry/vk2/leanmoe_vk.xz leanmoe_fp=.carry/fp/leanmoe_fp.xz
header .carry/fp/commit
for r in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do
    for p in p0 fp; do ncu_ms "${r}_${g}_$p" $p --shape $r --layout hf --gemms $g; done
  done
done
for p in p0 fp; do ncu_ms "120B-n2048_transposed_dw1_$p" $p --shape 120B-n2048 --layout transposed --gemms dw1; done
declare -A V=([p0]="" [fp]="")
layer_rounds 2 120B-n2048,30B-n1024,gpt-oss-20b p0 fp
gpu_tests "*" ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights:ExpertGemms.WideExperts
say "done t=$SECONDS"
