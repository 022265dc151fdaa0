#!/usr/bin/env bash
# Session 28: the dW epilogue per warpgroup (branch wgepi): one 64x32 TMA store per chunk of a
# consumer warpgroup's slice (named barrier, 4 KB staging tiles) instead of one 16x32 store per warp.
# The gather kernel's GPU tests, ncu at base clocks against main (dW1, dW2 at three rows), racecheck
# and memcheck on DwStoresSameBitsOnAnyGrid. Also under ncu: p5 (probe.patch: no loads, no epilogue,
# the MMAs and barriers alone) and main's dW1 in the transposed layout (dW1ᵀ = X[tok]ᵀ·dH through dW2's
# 128x256 kernel: QuACK's arrangement, m64n256 wgmmas, in our kernel) beside the HF one. Carry
# [".carry/wgepi"] (leanmoe_gpu_tests and leanmoe_bench_gemms of wgepi, leanmoe_bench_gemms of main
# 122a5b0 and of probe p5). ~170 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/wgepi/gt.xz new=.carry/wgepi/bg_new.xz p0=.carry/wgepi/bg_p0.xz p5=.carry/wgepi/bg_p5.xz
say "wgepi $(cat .carry/wgepi/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
T='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.SingleToken:ExpertGemms.OneExpertTakesAllRows:ExpertGemms.ManyExperts'
T="$T:ExpertGemms.WideExperts:ExpertGemms.TransposedWeights:ExpertGemms.FewPersistentCtas:ExpertGemms.TileBands"
T="$T:ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.EveryActivationLayoutAndBias:ExpertGemms.GptOssExpertFunction"
gpu_tests "$T"
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do
    for p in p0 new; do ncu_ms "${shape}_${g}_$p" $p --shape $shape --gemms $g; done
  done
done
for g in dw1 dw2; do
  ncu_ms "120B-n2048_${g}_p5" p5 --shape 120B-n2048 --gemms $g
  ncu_ms "120B-n2048_transposed_${g}_p0" p0 --shape 120B-n2048 --layout transposed --gemms $g
done
gpu_tests ExpertGemms.DwStoresSameBitsOnAnyGrid ExpertGemms.DwStoresSameBitsOnAnyGrid  # + memcheck, racecheck
say "done t=$SECONDS"
