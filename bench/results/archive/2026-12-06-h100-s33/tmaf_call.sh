#!/usr/bin/env bash
# Session 33, call 3 (run on the warm machine after call 2 when a build won there): build VARIANT of
# branch tmaorder (rot, both, late or w0; call 2's README says what each is) against main b6916a3 in
# the layer (graph, steady state, 2 rotating rounds, three rows), then its whole GPU suite with
# memcheck and racecheck on the dW tests. Carry [".carry/tmaf", ".carry/tmafull_VARIANT",
# ".carry/fp2/leanmoe_p0.xz"], bench/results/archive moved out of the tree. ~300 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
v="${VARIANT:?VARIANT=rot|both|late|w0}"
unpack gt=.carry/tmafull_$v/gt.xz leanmoe_p0=.carry/fp2/leanmoe_p0.xz "leanmoe_$v=.carry/tmafull_$v/leanmoe.xz"
echo "tmaorder 4551717a0 build $v, p0 main b6916a3" > "$L/commit"; header "$L/commit"
declare -A V=([p0]="" [$v]="")
layer_rounds 2 120B-n2048,30B-n1024,gpt-oss-20b p0 "$v"
gpu_tests "*" ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights:ExpertGemms.WideExperts
say "done t=$SECONDS"
