#!/usr/bin/env bash
# Session 40: the gather-sum kernel with the loads of up to kRowsInFlight rows issued before the
# first is summed (16-byte loads), 4 (gs4) and 8 (gs8), against main's kernels (p0): the GatherSum
# bitwise tests and the backend tests on gs8's leanmoe_gpu_tests, memcheck and racecheck on GatherSum,
# then the layer at the steady state under dev/kernel_trace, 2 rotating rounds, on three small rows
# (where SonicMoE's token_gather_sum ran 24-47% faster than ours) and 120B-n2048.
# Carry [".carry/gs"], bench/results/archive moved out of the tree. BUDGET=420.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/gs/gt.xz leanmoe_p0=.carry/gs/leanmoe_p0.xz leanmoe_gs4=.carry/gs/leanmoe_gs4.xz leanmoe_gs8=.carry/gs/leanmoe_gs8.xz
header .carry/gs/commit
gpu_tests 'GatherSum.*:CudaBackend.*:BackwardOverlap.*:TrainingLoopGpu.*' 'GatherSum.*'
declare -A V=([p0]="" [gs4]="" [gs8]="")
TRACE_LIB=.carry/gs/trace/libkernel_trace.so layer_rounds 2 1.4B-n256,1.4B-n512,7B-n256,120B-n2048 p0 gs4 gs8
trace_summaries
python3 dev/kernel_trace/summary.py "$L"/trace_*.csv --width 60 2>/dev/null | grep -E "^== |gather_sum" | sed "s|$L/||" | tee -a "$S"
say "done t=$SECONDS"
