#!/usr/bin/env bash
# Session 37 (prepared for the next session): branch dwc4 = main + dW1 / dW2 in 4x1 clusters as a
# second compiled varlen-K kernel (gather:coop:128x256:s4:tma:c4; the heuristic keeps c2). Each CTA
# multicasts a quarter of the TMA operand's k-tile into all four, so a CTA reads 16 KB of gathered
# rows + 8 KB of boxes from L2 per k-tile instead of 16 + 16 (s37 call 7: the loads alone run at
# 88-91% of the tensor pipe's time, L2 at 76% of its peak). The GEMM tests with memcheck and
# racecheck on the 4x1 test; ncu at base clocks c2 / c4 on four rows; --digest c2 against c4 (the
# same summation order: equal digests expected); the layer with --gemm-config dw1=..c4,dw2=..c4
# against the default (graph, steady state, 2 rotating rounds); the loads alone (no wgmma) c2 / c4;
# and, on the side, up and dH with an L2::256B hint on their gathered copies (l2hint.patch).
# Carry [".carry/dwc4"], bench/results/archive moved out of the tree. BUDGET=560, ~470 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/dwc4/gt.xz bg=.carry/dwc4/bg.xz leanmoe=.carry/dwc4/leanmoe.xz bg_p2=.carry/dwc4/bg_p2.xz \
  bg_l2=.carry/dwc4/bg_l2.xz
header .carry/dwc4/commit
c2=gather:coop:128x256:s4:tma:c2; c4=gather:coop:128x256:s4:tma:c4
gpu_tests 'ExpertGemms.*:LayerGemmConfigs.*:BackwardOverlap.*:GemmConfig.*:GemmHeuristics.*' 'ExpertGemms.DwIn4x1Clusters'
for r in 120B-n2048 30B-n1024 gpt-oss-20b olmoe-1b-7b; do
  for g in dw1 dw2; do for c in c2 c4; do ncu_ms "${r}_${g}_$c" bg --shape $r --layout hf --gemms $g --config "$g=${!c}"; done; done
done
# The loads alone (bg_p2: dwc4 + dwc4_probe.patch built with LEANMOE_PROBE 2, no wgmma), c2 / c4: does
# sharing the boxes four ways shorten the loads' period (s37 call 7: 4.98 ms for dW1 in 2x1)?
for g in dw1 dw2; do for c in c2 c4; do ncu_ms "120B-n2048_${g}_${c}_loads" bg_p2 --shape 120B-n2048 --layout hf --gemms $g --config "$g=${!c}"; done; done
for r in 30B-n1024 olmoe-1b-7b; do
  for c in c2 c4; do digest "${r}_$c" bg --shape $r --gemms dw1,dw2 --layout hf,transposed --config "dw1=${!c},dw2=${!c}"; done
done
# l2hint (bg_l2: main + l2hint.patch): up's and dH's gathered A-row copies with an L2::256B prefetch-size
# hint (each K-major row's next k-tile fetched into L2 with this one), against bg (whose up and dH are
# main's): ncu at three rows, and the same output digests.
for r in 120B-n2048 gpt-oss-20b olmoe-1b-7b; do
  for g in up dh; do for b in bg bg_l2; do ncu_ms "${r}_${g}_$b" $b --shape $r --layout hf --gemms $g; done; done
done
for b in bg bg_l2; do digest "30B-n1024_updh_$b" $b --shape 30B-n1024 --gemms up,dh --layout hf,transposed; done
declare -A V=([c2]="" [c4]="--gemm-config dw1=$c4,dw2=$c4")
layer_rounds 2 120B-n2048,30B-n1024,olmoe-1b-7b,gpt-oss-20b c2 c4
say "done t=$SECONDS"
