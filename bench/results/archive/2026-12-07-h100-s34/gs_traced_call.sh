#!/usr/bin/env bash
# Session 34, prepared for the next session (not run): why the gather-sum with 4 row loads in flight
# (branch gsbatch e256dcc) took 30B-n1024's backward only -0.8% and olmoe-1b-7b's not at all, where
# call 4's trace had the dx gather-sum ending 388 / 280 us after dW1. Both builds (p0 = main's
# kernels, gs) under dev/kernel_trace at the steady state, 2 rotating rounds at three rows: the
# per-kernel medians (--gemms), the overrun past dW1 (--tail) and the per-kernel table of each
# process. Carry [".carry/gs"] (its trace/ holds libkernel_trace.so and libcupti.so.13),
# bench/results/archive moved out of the tree. BUDGET=200, ~130 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe_p0=.carry/gs/leanmoe_p0.xz leanmoe_gs=.carry/gs/leanmoe_gs.xz
header .carry/gs/commit
trace="$(realpath .carry/gs/trace/libkernel_trace.so)"
names=(p0 gs)
for r in 1 2; do
  for c in 30B-n1024 olmoe-1b-7b 120B-n2048; do
    read -r warm iters < <(python3 bench/steady_iters.py "$c")
    for k in 0 1; do
      v=${names[$(((r + k) % 2))]}
      CUDA_INJECTION64_PATH=$trace KERNEL_TRACE_OUT="$L/trace_r${r}_${c}_$v.csv" timeout "$(cap 40)" \
        "$B/leanmoe_$v" bench --config "$c" --router topk_then_softmax --graph --iters "$iters" --warmup "$warm" \
        > "$L/layer_r${r}_${c}_$v.txt" 2>&1
      say "r$r $c $v rc=$? $(grep -E "^$c" "$L/layer_r${r}_${c}_$v.txt" | awk '{print $9, $10, $13, $14}') (t=$SECONDS)"
    done
  done
done
python3 dev/kernel_trace/summary.py "$L"/trace_*.csv --tail --width 50 | sed "s|$L/||" | tee -a "$S"
python3 dev/kernel_trace/summary.py "$L"/trace_*.csv --gemms | sed "s|$L/||" | tee -a "$S"
python3 dev/kernel_trace/summary.py "$L"/trace_*.csv --width 90 > "$L/trace_summary.txt" 2>&1
say "done t=$SECONDS"
