#!/usr/bin/env bash
# Session 25, first device call (an H100: the H200 was refused twice): main's binaries (826d9af).
# The kernel trace tried on a small run, then the layer at 120B-n2048 traced at the steady state
# (per kernel: time, SM clock, power), then main's whole GPU suite (e772cb2's SM-count change has
# not run on a GPU). Carry [".carry/vs", ".carry/s25"]. Returns summary.txt, gpu_tests.log, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/vs/leanmoe.xz gt=.carry/s25/leanmoe_gpu_tests.xz
TR="$(realpath .carry/vs/trace/libkernel_trace.so)"
say "leanmoe $(cat .carry/vs/commit), tests $(cat .carry/s25/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
CUDA_INJECTION64_PATH=$TR KERNEL_TRACE_OUT=$L/trace_small.csv timeout $(cap 40) $B/leanmoe bench --config 7B-n256 \
  --router topk_then_softmax --graph --iters 5 --warmup 2 > $L/small.txt 2>&1
say "trace try rc=$? $(tail -1 $L/small.txt)"
python3 dev/kernel_trace/summary.py $L/trace_small.csv --last 1 --width 80 2>&1 | head -12 | tee -a $S
for c in 120B-n2048 30B-n1024; do
  read -r warm iters < <(python3 bench/steady_iters.py $c)
  CUDA_INJECTION64_PATH=$TR KERNEL_TRACE_OUT=$L/trace_$c.csv timeout $(cap 60) $B/leanmoe bench --config $c \
    --router topk_then_softmax --graph --iters $iters --warmup $warm > $L/layer_$c.txt 2>&1
  say "traced layer $c rc=$?: $(grep -E "^$c" $L/layer_$c.txt)"
  python3 dev/kernel_trace/summary.py $L/trace_$c.csv --last 3 --width 90 2>&1 | head -34 | tee -a $S
done
timeout $(cap 280) $B/gt > $FINAL/gpu_tests.log 2>&1
say "suite rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $FINAL/gpu_tests.log | tr '\n' ' ') (t=$SECONDS)"
say "== done (t=$SECONDS)"
