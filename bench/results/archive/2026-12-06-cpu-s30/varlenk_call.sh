#!/usr/bin/env bash
# Prepared in session 30 for a session with device time: branch varlenk (2346eb4 = main b33031f +
# wgepi + dw1t + the one-kernel refactor: dW1 and dW2 both on dW2's 128x256 kernel, the gathered
# operand along M, dW stored transposed where the layout wants it; the 256x128 dW1 kernel gone)
# against main. The whole GPU suite of varlenk; memcheck and racecheck on the dW tests; ncu at base
# clocks of dW1 and dW2 in both layouts at three rows, main (p0) against varlenk (vk); then the layer
# as graph replays at the steady state, 2 rotating rounds at three rows, and gpt-oss-20b in the
# transposed layout (`--layout transposed`, gpt-oss's own).
# Run from the repository root with bench/results/archive moved out of the tree (carry size), carry
# [".carry/vk", ".carry/wgc/bg_p0.xz", ".carry/wgc/leanmoe_p0.xz"] (~62 MB). PART=tests (the suite and
# sanitizers, ~320 s) or PART=timing (ncu and the layer, ~350 s): two calls; unset, both in one.
# Land varlenk if the suite and sanitizers pass and neither dW kind nor the layer's backward is
# slower beyond noise (ncu ~1%, layer 2-5%); it removes a kernel instantiation and its special cases.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/vk/gt.xz vk=.carry/vk/bg_vk.xz p0=.carry/wgc/bg_p0.xz leanmoe_vk=.carry/vk/leanmoe_vk.xz \
  leanmoe_p0=.carry/wgc/leanmoe_p0.xz
say "$(cat .carry/vk/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
part() { [ -z "${PART:-}" ] || [ "$PART" = "$1" ]; }
if part tests; then
  timeout "$(cap 240)" "$B/gt" > "$L/gpu_suite.log" 2>&1
  say "suite rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/gpu_suite.log" | tr '\n' ' ') (t=$SECONDS)"
  grep -E '^\[  FAILED  \]' "$L/gpu_suite.log" | head -5 | tee -a "$S"
  gpu_tests ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights \
    ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights  # + memcheck, racecheck
fi
part timing || { say "done t=$SECONDS"; exit 0; }
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for layout in hf transposed; do
    for g in dw1 dw2; do
      for p in p0 vk; do ncu_ms "${shape}_${layout}_${g}_$p" $p --shape $shape --layout $layout --gemms $g; done
    done
  done
done
declare -A V=([p0]="" [vk]="")
layer_rounds 2 120B-n2048,30B-n1024,gpt-oss-20b p0 vk
V=([p0]="--layout transposed" [vk]="--layout transposed")
L0=$L; L=$L/transposed; mkdir -p "$L"  # its layer_r<R>_gpt-oss-20b_<v> files would overwrite the HF ones
layer_rounds 2 gpt-oss-20b p0 vk
L=$L0
say "done t=$SECONDS"
