#!/usr/bin/env bash
# Session 33: the varlen-K producer with its gathered rows resolved
# before the stage's empty wait (branch feedpre: the shuffles and the row offsets of k-tile kt+1 are
# computed right after k-tile kt's copies, so after the wait each producer thread issues only its 8
# copies). Against main (p0 = main b6916a3, fp = feedpre rebased onto it):
# ncu at base clocks of dW1 and dW2 at three rows, then the layer (graph, steady state, 2 rotating
# rounds), then feedpre's whole GPU suite with memcheck and racecheck on the dW tests.
# Carry [".carry/fp2"], bench/results/archive moved
# out of the tree. ~330 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/fp2/gt_fp.xz p0=.carry/fp2/bg_p0.xz fp=.carry/fp2/bg_fp.xz \
  leanmoe_p0=.carry/fp2/leanmoe_p0.xz leanmoe_fp=.carry/fp2/leanmoe_fp.xz
header .carry/fp2/commit
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
