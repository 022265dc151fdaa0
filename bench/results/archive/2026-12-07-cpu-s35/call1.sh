#!/usr/bin/env bash
# Session 35, call 1: branch sdzgs = sparsedz (f0b715a: K-sparse router dz from the saved gates, dz·Wr
# inside the dx gather-sum) + gsbatch (4 rows' loads in flight per gather-sum thread, the dz·Wr rows
# among them), against p0 = main's kernels and host code (mlate 3df2e0e's build).
# With the side chain shorter, is 4 SMs left to the side kernels still right? sdzgs at 2 and 0 SMs
# (`--bwd-overlap N`). The tests sdzgs touches (its gt: sparsedz's RouterGradientWithoutBalancingLosses
# and gsbatch's bitwise GatherSum tests, with a per-row dz·Wr case) with memcheck, `leanmoe check`, then
# the layer: 2 untraced rotating rounds of the four, then one traced round of p0 and sdzgs (--tail).
# Carry [".carry/ovl"], bench/results/archive moved out of the tree. BUDGET=340, ~300 s
# (VARIANTS="p0 sdzgs sdzgso0" BUDGET=250 where less device time is left; VARIANTS="p0 sdzgs" NOCHECK=1
# BUDGET=160 with less still).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/ovl/gt.xz leanmoe_p0=.carry/ovl/leanmoe_p0.xz \
  leanmoe_sdzgs=.carry/ovl/leanmoe_sdzgs.xz
ln -s "$B/leanmoe_sdzgs" "$B/leanmoe_sdzgso2"; ln -s "$B/leanmoe_sdzgs" "$B/leanmoe_sdzgso0"
header .carry/ovl/commit
gpu_tests 'CudaBackend.*:BackwardOverlap.*:CudaRoutingGiven.*:TrainingLoopGpu.*:GatherSum.*' \
  'CudaBackend.RouterGradientWithoutBalancingLosses:GatherSum.*'
if [ -z "${NOCHECK:-}" ]; then
  timeout "$(cap 60)" "$B/leanmoe_sdzgs" check --device cuda > "$L/check.log" 2>&1
  say "check rc=$? $(tail -1 "$L/check.log") (t=$SECONDS)"
fi
declare -A V=([p0]="" [sdzgs]="" [sdzgso2]="--bwd-overlap 2" [sdzgso0]="--bwd-overlap 0")
rows=30B-n1024,olmoe-1b-7b,120B-n2048
layer_rounds 2 "$rows" ${VARIANTS:-p0 sdzgs sdzgso2 sdzgso0}
if [ $((budget - SECONDS)) -gt 70 ]; then
  TRACE_LIB=.carry/ovl/trace/libkernel_trace.so in_logs_subdir traced layer_rounds 1 "$rows" p0 sdzgs
  L="$L/traced" trace_summaries
fi
say "done t=$SECONDS"
