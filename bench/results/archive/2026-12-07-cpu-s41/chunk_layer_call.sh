#!/usr/bin/env bash
# Session 41: the layer with down and dx on tiles from a counter taken in chunks of 4 (branch chunk,
# leanmoe_c4) against main's defaults (static tiles; leanmoe from .carry/vs) on the small rows, graph
# replays at the steady state, 2 rounds, variants rotated (chunks of 1 against 4: the ncu call before).
# Carry [".carry/chunk_layer", ".carry/vs"], bench/results/archive moved out. BUDGET=420.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/vs/leanmoe.xz leanmoe_c4=.carry/chunk_layer/leanmoe_c4.xz
header .carry/chunk_layer/commit
P=cutlass:pingpong:128x192:auto
declare -A V
V[base]=""
# n <= 256: down's default has 64-column epilogue subtiles (tma64), kept in the counter variant.
V[c4]="--gemm-config down=$P:tma64:c1x2:dyn,dx=$P:tma:c1x2:dyn"
in_logs_subdir n256 layer_rounds 2 7B-n256,1.4B-n256 base c4
V[c4]="--gemm-config down=$P:tma:c1x2:dyn,dx=$P:tma:c1x2:dyn"
in_logs_subdir n512 layer_rounds 2 1.4B-n512,7B-n1024 base c4
say "done t=$SECONDS"
