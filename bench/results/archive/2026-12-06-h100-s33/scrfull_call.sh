#!/usr/bin/env bash
# Session 33 (prepared for the next session, after scr_call.sh): build VARIANT (mlate or idxlate,
# README "Prepared, not run") against main 02a6828 in the layer (graph, steady state, 2 rotating rounds,
# three rows), then its whole GPU suite with memcheck and racecheck on the GEMM tests it changes
# (mlate: up and dH; idxlate: dW). Carry [".carry/scrfull/call.sh", ".carry/scrfull/leanmoe_p0.xz",
# ".carry/scrfull/VARIANT"], bench/results/archive moved out of the tree. BUDGET=400, ~380 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
v="${VARIANT:?VARIANT=mlate|idxlate}"
unpack gt=.carry/scrfull/$v/gt.xz leanmoe_p0=.carry/scrfull/leanmoe_p0.xz "leanmoe_$v=.carry/scrfull/$v/leanmoe.xz"
echo "$v (branch $v of s33) against p0 main 02a6828" > "$L/commit"; header "$L/commit"
declare -A V=([p0]="" [$v]="")
layer_rounds 2 120B-n2048,30B-n1024,gpt-oss-20b p0 "$v"
if [ "$v" = mlate ]; then
  sanitized=ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.TransposedWeights:ExpertGemmsFp8.SwiGLUDefaultPath:ExpertGemmsFp8.SwiGLUInterleaved
else
  sanitized=ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights:ExpertGemms.WideExperts
fi
gpu_tests "*" "$sanitized"
say "done t=$SECONDS"
