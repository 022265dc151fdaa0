#!/usr/bin/env bash
# s38: the least of c4_call.sh that says whether dW in 4x1 clusters is worth a full call (device time
# was nearly spent on refused starts): the 4x1 test under memcheck and racecheck, ncu c2 / c4 of dW1 and
# dW2 at 120B-n2048, and the layer's backward c2 / c4 at two rows (graph, steady state, one round).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/dwc4/gt.xz bg=.carry/dwc4/bg.xz leanmoe=.carry/dwc4/leanmoe.xz
header .carry/dwc4/commit
c2=gather:coop:128x256:s4:tma:c2; c4=gather:coop:128x256:s4:tma:c4
gpu_tests 'ExpertGemms.DwIn4x1Clusters:ExpertGemms.EveryCompiledConfig*' 'ExpertGemms.DwIn4x1Clusters'
for g in dw1 dw2; do for c in c2 c4; do ncu_ms "120B-n2048_${g}_$c" bg --shape 120B-n2048 --layout hf --gemms $g --config "$g=${!c}"; done; done
declare -A V=([c2]="" [c4]="--gemm-config dw1=$c4,dw2=$c4")
layer_rounds 1 120B-n2048,gpt-oss-20b c2 c4
say "done t=$SECONDS"
