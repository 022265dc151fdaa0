#!/usr/bin/env bash
# Session 42, the layer A/B after call.sh, if its ncu has either change ahead: main against
# main + the folder's patches (leanmoe_all), graph replays at the steady state, 2 rounds,
# variants rotated. The small rows with down / dx on tiles from a counter in chunks of 4 (the
# `:dyn` configs; base: main's static defaults); the large rows in FP8 (the alternation; both
# binaries run their defaults). Drop the half whose ncu lost. Carry [".carry/s42_layer"],
# bench/results/archive moved out. BUDGET=540.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/device_call.sh
unpack leanmoe=.carry/s42_layer/leanmoe_main.xz leanmoe_all=.carry/s42_layer/leanmoe_all.xz
header .carry/s42_layer/commit
P=cutlass:pingpong:128x192:auto
declare -A V
V[base]=""
# n <= 256: down's default has 64-column epilogue subtiles (tma64), kept in the counter variant.
V[all]="--gemm-config down=$P:tma64:c1x2:dyn,dx=$P:tma:c1x2:dyn"
in_logs_subdir n256 layer_rounds 2 7B-n256,1.4B-n256 base all
V[all]="--gemm-config down=$P:tma:c1x2:dyn,dx=$P:tma:c1x2:dyn"
in_logs_subdir n512 layer_rounds 2 1.4B-n512,7B-n1024 base all
V[base]="--precision fp8"
V[all]="--precision fp8"
in_logs_subdir fp8 layer_rounds 2 120B-n2048,30B-n1024,olmoe-1b-7b base all
say "done t=$SECONDS"
