#!/usr/bin/env bash
# For an H100 (where dx was DRAM-bound in session 21/22): branch dyn's layer, the heuristic (dx in 2x1
# clusters along N there) against dx with tiles from a counter, 2x1 and 1x2, at 120B-n2048 and
# 30B-n1024; graph replays, three rounds in rotating order, iterations from bench/steady_iters.py.
# Carry [".carry/dyn"] (xz of branch dyn's build-device/leanmoe and its commit). ~200 s. Returns
# summary.txt and logs.tar.gz (the layer JSONs, summarised by bench/layer_ab.py).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/dyn/leanmoe.xz
say "leanmoe $(cat .carry/dyn/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
P=cutlass:pingpong:128x192:auto:tma
declare -A V=([default]="" [c2dyn]="dx=$P:c2:dyn" [c1x2dyn]="dx=$P:c1x2:dyn")
names=(default c2dyn c1x2dyn)
for r in 1 2 3; do
  for c in 120B-n2048 30B-n1024; do
    read -r warm iters < <(python3 bench/steady_iters.py "$c")
    for k in 0 1 2; do
      v=${names[$(((r + k) % 3))]}; extra=(); [ -n "${V[$v]}" ] && extra=(--gemm-config "${V[$v]}")
      timeout 60 $B/leanmoe bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
        "${extra[@]}" --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
      say "r$r $c $v rc=$? (t=$SECONDS)"
    done
  done
done
python3 bench/layer_ab.py $L | tee -a $S
