#!/usr/bin/env bash
# Session 22: one 120B-n2048 forward + backward of the old (4e0f7fb) and new leanmoe under ncu, every
# kernel alone, time and DRAM bytes read per step (dev/ncu_vs_sonic.py A B METRIC leanmoe).
# Why: the new heuristic took dx from 10.3 to 7.5 ms alone, but the layer's backward only 25.5 -> 24.9.
# Carry [".carry/vs", ".carry/s22"]. Returns summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; S=$FINAL/summary.txt; W=$(mktemp -d)
xz -dc .carry/s22/leanmoe_old.xz > $W/old && xz -dc .carry/vs/leanmoe.xz > $W/new && chmod +x $W/old $W/new
source scripts/device_env.sh
M=gpu__time_duration.sum,dram__bytes_read.sum
for v in old new; do
  timeout 80 ncu --clock-control none --metrics $M --csv --print-units base $W/$v bench --config 120B-n2048 \
    --router topk_then_softmax --iters 1 --warmup 1 > $W/ncu_$v.csv 2> $W/ncu_$v.err
done
for m in gpu__time_duration.sum dram__bytes_read.sum; do
  python3 dev/ncu_vs_sonic.py $W/ncu_new.csv $W/ncu_old.csv $m leanmoe 2>&1 | sed 's/SonicMoE/old/g; s/leanmoe - old/new - old/' | tee -a $S
done
