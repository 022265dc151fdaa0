#!/usr/bin/env bash
# Session 29, call 1: wgepi (2ea9d99: the dW epilogue per consumer warpgroup, one 64x32 TMA store per
# chunk of its 64-row slice after a named barrier, instead of one 16x32 store per warp) against main,
# and dw1t (5835bd9, on wgepi: dW1 on dW2's 128x256 kernel, the gathered X along M, stored transposed
# through stmatrix .trans; `--config dw1=gather:coop:128x256:s4:tma:c2`). The tests, the
# leanmoe_bench_gemms "new" and the leanmoe CLI are dw1t's (its defaults are wgepi's).
# s28's prepared wgepi_call.sh less probe p5, plus the layer A/B in the same call:
# the gather kernel's GPU tests; ncu at base clocks, main (p0) against wgepi (new), dW1 and dW2 at
# three rows; main's dW1 in the transposed layout; memcheck and racecheck on DwStoresSameBitsOnAnyGrid;
# then the layer as graph replays at the steady state, 2 rotating rounds at three rows: main (p0),
# wgepi (new: dw1t's CLI, defaults) and dw1t (t: dW1 on dW2's kernel).
# Run from the repository root with bench/results/archive moved out of the tree (carry size), carry
# [".carry/wgc"] (the script itself as .carry/wgc/call.sh; leanmoe_gpu_tests of dw1t,
# leanmoe_bench_gemms and the leanmoe CLI of dw1t and main, xz). ~350 s.
set -uo pipefail
source scripts/device_call.sh
C=.carry/wgc
unpack gt=$C/gt.xz new=$C/bg_new.xz p0=$C/bg_p0.xz leanmoe=$C/leanmoe_new.xz leanmoe_p0=$C/leanmoe_p0.xz
say "$(cat $C/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
T='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.SingleToken:ExpertGemms.OneExpertTakesAllRows:ExpertGemms.ManyExperts'
T="$T:ExpertGemms.WideExperts:ExpertGemms.TransposedWeights:ExpertGemms.FewPersistentCtas:ExpertGemms.TileBands"
T="$T:ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.EveryActivationLayoutAndBias:ExpertGemms.GptOssExpertFunction"
T="$T:ExpertGemms.EveryCompiledConfig"
gpu_tests "$T"
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do
    for p in p0 new; do ncu_ms "${shape}_${g}_$p" $p --shape $shape --gemms $g; done
  done
  ncu_ms "${shape}_dw1_t" new --shape $shape --gemms dw1 --config dw1=gather:coop:128x256:s4:tma:c2
done
ncu_ms "120B-n2048_transposed_dw1_p0" p0 --shape 120B-n2048 --layout transposed --gemms dw1
gpu_tests ExpertGemms.DwStoresSameBitsOnAnyGrid ExpertGemms.DwStoresSameBitsOnAnyGrid  # + memcheck, racecheck
declare -A V=([p0]="" [new]="" [t]="--gemm-config dw1=gather:coop:128x256:s4:tma:c2")
layer_rounds 2 120B-n2048,30B-n1024,gpt-oss-20b p0 new t
say "done t=$SECONDS"
