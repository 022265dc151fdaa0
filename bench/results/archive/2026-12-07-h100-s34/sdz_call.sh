#!/usr/bin/env bash
# Session 34, prepared for the next session (not run): branch sparsedz f0b715a against p0 = main's
# kernels and host code (mlate 3df2e0e's build). Where dz is K-sparse (renormalised gates, the layer's
# top-K routing, no aux or z-loss: the grid's router), the router backward takes dz per row from the
# saved gates (no logits recompute, no router_backward over E) and the dx gather-sum adds
# dz_row * Wr[e] per row (no [T, d] fp32 dz·Wr): the side chain beside dW2 / dx shrinks to one small
# kernel and dWr, so the dx gather-sum can start when dx ends (call 4's trace: it waited up to 191 us
# past dx for the chain and outlasted dW1 by 388 / 280 / 151 us at 30B-n1024 / olmoe-1b-7b /
# 120B-n2048). Here: the GPU tests it touches with memcheck on the new one, `leanmoe check` against the
# naive reference, then the layer: one traced round (--tail: the side kernels past dW1; --gemms) and
# untraced rounds as time allows. Carry [".carry/sdz"], bench/results/archive moved out of the tree.
# BUDGET=360, ~300 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/sdz/gt.xz leanmoe_p0=.carry/sdz/leanmoe_p0.xz leanmoe_sdz=.carry/sdz/leanmoe_sdz.xz
header .carry/sdz/commit
gpu_tests 'CudaBackend.*:BackwardOverlap.*:CudaRoutingGiven.*:TrainingLoopGpu.*' \
  'CudaBackend.RouterGradientWithoutBalancingLosses'
timeout "$(cap 60)" "$B/leanmoe_sdz" check --device cuda > "$L/check.log" 2>&1
say "check rc=$? $(tail -1 "$L/check.log") (t=$SECONDS)"
declare -A V=([p0]="" [sdz]="")
rows=30B-n1024,olmoe-1b-7b,120B-n2048
TRACE_LIB=.carry/sdz/trace/libkernel_trace.so in_logs_subdir traced layer_rounds 1 "$rows" p0 sdz
L="$L/traced" trace_summaries
[ $((budget - SECONDS)) -gt 80 ] && layer_rounds 2 "$rows" p0 sdz
say "done t=$SECONDS"
