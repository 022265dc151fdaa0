#!/usr/bin/env bash
# Session 25 (H100), branch dyn rebuilt on main (826d9af + the revert of 5b729df): the dyn tests
# (bitwise against the static scheduler, every compiled configuration against the CPU), then the
# layer at 120B-n2048 and 30B-n1024: the heuristic (dx in 2x1 clusters along N on the H100) against
# dx with tiles from a counter (2x1, 1x2), and the backward with no side streams (--bwd-overlap off,
# SonicMoE's serial order); graph replays, three rounds in rotating order. Carry [".carry/dyn"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/dyn/leanmoe.xz gt=.carry/dyn/leanmoe_gpu_tests.xz
say "leanmoe $(cat .carry/dyn/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
timeout $(cap 90) $B/gt --gtest_filter='ExpertGemms.CutlassDynamicTilesMatchStatic:ExpertGemms.EveryCompiledConfig:ExpertGemms.LaunchersRefuseConfigsByName' > $L/dyn_tests.log 2>&1
say "dyn tests rc=$? $(grep -E '^\[ +(OK|FAILED|PASSED) ' $L/dyn_tests.log | tr '\n' ' ')"
P=cutlass:pingpong:128x192:auto:tma
declare -A V=([default]="" [c2dyn]="--gemm-config dx=$P:c2:dyn" [c1x2dyn]="--gemm-config dx=$P:c1x2:dyn" [serial]="--bwd-overlap off")
names=(default c2dyn c1x2dyn serial)
for r in 1 2 3; do
  for c in 120B-n2048 30B-n1024; do
    read -r warm iters < <(python3 bench/steady_iters.py "$c")
    for k in 0 1 2 3; do
      v=${names[$(((r + k) % 4))]}
      timeout $(cap 60) $B/leanmoe bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
        ${V[$v]} --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
      say "r$r $c $v rc=$? $(grep -E "^$c" $L/layer_r${r}_${c}_$v.txt | awk '{print $9, $10, $13, $14}') (t=$SECONDS)"
    done
  done
done
python3 bench/layer_ab.py $L | tail -8 | tee -a $S
