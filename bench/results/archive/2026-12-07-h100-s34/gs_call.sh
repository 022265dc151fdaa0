#!/usr/bin/env bash
# Session 34, call 5: the gather-sum with 4 row loads in flight per thread (branch gsbatch e256dcc)
# against p0 = main ee128a7's kernels (mlate 3df2e0e's build). Why: in call 4's trace the dx
# gather-sum on the backward's 4 side SMs ends 389 us after dW1 at 30B-n1024 and 275 us at
# olmoe-1b-7b (one 16-byte load at a time per thread, ~40 GB/s per SM). The GPU tests it touches
# (GatherSum bitwise against a CPU loop, CudaBackend, BackwardOverlap), memcheck on GatherSum, then
# the layer (graph, steady state, 2 rotating rounds). Carry [".carry/gs"], bench/results/archive
# moved out of the tree. BUDGET=200, ~150 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/gs/gt.xz leanmoe_p0=.carry/gs/leanmoe_p0.xz leanmoe_gs=.carry/gs/leanmoe_gs.xz
header .carry/gs/commit
timeout "$(cap 60)" "$B/gt" --gtest_filter='GatherSum.*:CudaBackend.*:BackwardOverlap.*' > "$L/gpu_tests.log" 2>&1
say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/gpu_tests.log" | tr '\n' ' ') (t=$SECONDS)"
grep -E '^\[  FAILED  \]' "$L/gpu_tests.log" | head -5 | tee -a "$S"
timeout "$(cap 40)" compute-sanitizer --tool memcheck "$B/gt" --gtest_filter='GatherSum.*' > "$L/memcheck.log" 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1) (t=$SECONDS)"
declare -A V=([p0]="" [gs]="")
layer_rounds 2 30B-n1024,olmoe-1b-7b,120B-n2048 p0 gs
say "done t=$SECONDS"
