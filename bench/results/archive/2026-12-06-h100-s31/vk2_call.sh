#!/usr/bin/env bash
# Session 31, call 4: branch varlenk at 7204877 (the plain dW store per warp again, so the 71
# kernels it shares with main compile to SASS identical to main's; the transposed-store kernels
# identical to those timed in call 2). The whole GPU suite; memcheck and racecheck on the dW tests;
# ncu at base clocks of the two plain-store cases call 2 found slower (120B-n2048 transposed dW1,
# gpt-oss-20b HF dW2), main (p0) against varlenk (vk); the layer, graph replays at the steady state,
# 2 rotating rounds, at three rows in the HF layout and gpt-oss-20b in the transposed one.
# Run from the repository root with bench/results/archive moved out of the tree (carry size), the
# script copied to this path, carry [".carry/vk2", ".carry/wgc/bg_p0.xz", ".carry/wgc/leanmoe_p0.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/vk2/gt.xz vk=.carry/vk2/bg_vk.xz p0=.carry/wgc/bg_p0.xz leanmoe_vk=.carry/vk2/leanmoe_vk.xz \
  leanmoe_p0=.carry/wgc/leanmoe_p0.xz
header .carry/vk2/commit
gpu_tests '*' ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights  # + memcheck, racecheck
for c in "120B-n2048 transposed dw1" "gpt-oss-20b hf dw2"; do
  set -- $c
  for p in p0 vk; do ncu_ms "${1}_${2}_${3}_$p" $p --shape $1 --layout $2 --gemms $3; done
done
declare -A V=([p0]="" [vk]="")
layer_rounds 2 120B-n2048,30B-n1024,gpt-oss-20b p0 vk
V=([p0]="--layout transposed" [vk]="--layout transposed")
in_logs_subdir transposed layer_rounds 2 gpt-oss-20b p0 vk
say "done t=$SECONDS"
