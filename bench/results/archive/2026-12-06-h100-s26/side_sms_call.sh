#!/usr/bin/env bash
# Session 26: does leaving 4 SMs to the side stream cost the overlapped backward's dW2 / dx / dW1 more
# than the ~3% of their CTAs? (In the layer dW1 runs 8.05 ms at 120B-n2048 against 7.42 alone, call 2.)
# The layer's backward with the default (128 CTAs for dW2, dx, dW1 beside the router chain) against
# dW1 and dW2 on every SM (m132), and dx too; 3 rounds in rotating order, graph replays.
# Carry [".carry/vs"] (leanmoe of main). ~250 s. Returns summary.txt, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/vs/leanmoe.xz
say "side SMs $(cat .carry/vs/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
DW="dw1=gather:coop:256x128:s4:tma:c2:m132,dw2=gather:coop:128x256:s4:tma:c2:m132"
declare -A V=([default]="" [dw132]="--gemm-config $DW" [all132]="--gemm-config $DW,dx=cutlass:pingpong:128x192:auto:tma:c2:dyn:m132")
layer_rounds 3 120B-n2048,gpt-oss-20b default dw132 all132
