#!/usr/bin/env bash
# Session 32: L2 prefetch in the gather kernel's producers (branch tmagather e298229, dev macros,
# build pf4m): the varlen-K producer (dW1, dW2) prefetches the k-tile 4 ahead in its stream (the
# gathered rows by prefetch.global.L2, its half of the TMA operand's boxes by
# cp.async.bulk.prefetch.tensor), the varlen-M one (up, dH) 4 k-tiles ahead within a tile (A rows;
# the weight boxes of the default up and dH paths). Against main (p0 = 7204877's binaries, library
# kernels SASS-identical to main 61a204a's): ncu at base clocks at 120B-n2048; the layer, graph
# replays at the steady state, 2 rotating rounds; pf4m's whole GPU suite with memcheck and
# racecheck on three expert-GEMM tests; then ncu at two more rows as time allows.
# Carry [".carry/pfall", ".carry/pfl", ".carry/pf/bg_pf4m.xz", ".carry/vk2/bg_vk.xz",
# ".carry/vk2/leanmoe_vk.xz"], bench/results/archive moved out of the tree.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/pfl/gt_pf4m.xz p0=.carry/vk2/bg_vk.xz pf4m=.carry/pf/bg_pf4m.xz \
  leanmoe_p0=.carry/vk2/leanmoe_vk.xz leanmoe_pf4m=.carry/pfl/leanmoe_pf4m.xz
header .carry/pfall/commit
for g in dw1 dw2 up dh; do
  for p in p0 pf4m; do ncu_ms "120B-n2048_${g}_$p" $p --shape 120B-n2048 --layout hf --gemms $g; done
done
declare -A V=([p0]="" [pf4m]="")
layer_rounds 2 120B-n2048,30B-n1024,gpt-oss-20b p0 pf4m
gpu_tests "*" ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights:ExpertGemms.WideExperts
for r in 30B-n1024 gpt-oss-20b; do
  for g in dw1 up dw2 dh; do
    for p in p0 pf4m; do ncu_ms "${r}_${g}_$p" $p --shape $r --layout hf --gemms $g; done
  done
done
say "done t=$SECONDS"
