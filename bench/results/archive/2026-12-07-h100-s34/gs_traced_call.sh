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
declare -A V=([p0]="" [gs]="")
TRACE_LIB=.carry/gs/trace/libkernel_trace.so layer_rounds 2 30B-n1024,olmoe-1b-7b,120B-n2048 p0 gs
trace_summaries
say "done t=$SECONDS"
