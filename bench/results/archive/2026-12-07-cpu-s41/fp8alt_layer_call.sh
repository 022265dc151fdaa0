#!/usr/bin/env bash
# Session 41, prepared (not run): the FP8 layer with branch fp8alt (the FP8 up / dH consumers issue
# their wgmma groups in strict alternation) against main, graph replays at the steady state,
# 2 rounds, variants rotated; run only if s41_call.sh's ncu of FP8 up / dH has fp8alt ahead.
# Copy to .carry/fp8alt_layer/call.sh; carry [".carry/fp8alt_layer", ".carry/vs"] (leanmoe_alt.xz
# there: fp8alt's CLI; .carry/vs/leanmoe.xz: main's), bench/results/archive moved out. BUDGET=420.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/vs/leanmoe.xz leanmoe_alt=.carry/fp8alt_layer/leanmoe_alt.xz
header .carry/fp8alt_layer/commit
declare -A V
V[base]="--precision fp8"
V[alt]="--precision fp8"
layer_rounds 2 120B-n2048,30B-n1024,olmoe-1b-7b,7B-n1024 base alt
say "done t=$SECONDS"
