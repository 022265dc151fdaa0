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
names=(default dw132 all132)
for r in 1 2 3; do
  for c in 120B-n2048 gpt-oss-20b; do
    read -r warm iters < <(python3 bench/steady_iters.py "$c")
    for k in 0 1 2; do
      v=${names[$(((r + k) % 3))]}
      timeout $(cap 60) $B/leanmoe bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
        ${V[$v]} --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
      say "r$r $c $v rc=$? $(grep -E "^$c" $L/layer_r${r}_${c}_$v.txt | awk '{print $9, $10, $13, $14}') (t=$SECONDS)"
    done
  done
done
python3 bench/layer_ab.py $L | tail -6 | tee -a $S
