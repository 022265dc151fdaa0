#!/usr/bin/env bash
# Session 37, call 6: dW1's varlen-K tile bands in the layer. s22 timed bands of 8 and 16 row units
# faster for dW1 alone where d >= 2048 (30B-n1024 -7.4%, olmoe-1b-7b -5.9%), s28 at the cap not
# again (-1.5% / +1.3%); the layer never ran them. Main's binary (.carry/vs) with
# `--gemm-config dw1=...:b8` and `:b16` against the default (b1), graph replays at the steady state,
# 2 rotating rounds, four rows. Carry [".carry/vs"], bench/results/archive moved out of the tree.
# BUDGET=330, ~250 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/vs/leanmoe.xz
echo "main d199b9c (library code of 91330d1, .carry/vs)" > "$L/commit"; header "$L/commit"
declare -A V=([b1]="" [b8]="--gemm-config dw1=gather:coop:128x256:s4:tma:c2:b8"
  [b16]="--gemm-config dw1=gather:coop:128x256:s4:tma:c2:b16")
layer_rounds 2 30B-n1024,olmoe-1b-7b,120B-n2048,gpt-oss-20b b1 b8 b16
say "done t=$SECONDS"
