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
timeout "$(cap 45)" "$B/gt" --gtest_filter="$T" > "$L/gpu_tests.log" 2>&1
say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/gpu_tests.log" | tr '\n' ' ') (t=$SECONDS)"
grep -E '^\[  FAILED  \]' "$L/gpu_tests.log" | head -5 | tee -a "$S"
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do
    for p in p0 new; do
      timeout "$(cap 20)" ncu --metrics gpu__time_duration.sum -k regex:gather_grouped_gemm --launch-skip 1 -c 1 \
        "$B/$p" --shape $shape --gemms $g --iters 1 --warmup 1 > "$L/ncu_${shape}_${g}_$p.txt" 2>&1
      say "ncu $shape $g $p rc=$? $(grep -E 'gpu__time_duration' "$L/ncu_${shape}_${g}_$p.txt" | awk '{print $(NF-1), $NF}') (t=$SECONDS)"
    done
  done
done
for g in dw1 dw2; do
  timeout "$(cap 20)" ncu --metrics gpu__time_duration.sum -k regex:gather_grouped_gemm --launch-skip 1 -c 1 \
    "$B/p5" --shape 120B-n2048 --gemms $g --iters 1 --warmup 1 > "$L/ncu_p5_$g.txt" 2>&1
  say "ncu 120B-n2048 $g p5 rc=$? $(grep -E 'gpu__time_duration' "$L/ncu_p5_$g.txt" | awk '{print $(NF-1), $NF}') (t=$SECONDS)"
  timeout "$(cap 20)" ncu --metrics gpu__time_duration.sum -k regex:gather_grouped_gemm --launch-skip 1 -c 1 \
    "$B/p0" --shape 120B-n2048 --layout transposed --gemms $g --iters 1 --warmup 1 > "$L/ncu_t_$g.txt" 2>&1
  say "ncu 120B-n2048 transposed $g p0 rc=$? $(grep -E 'gpu__time_duration' "$L/ncu_t_$g.txt" | awk '{print $(NF-1), $NF}') (t=$SECONDS)"
done
timeout "$(cap 40)" compute-sanitizer --tool racecheck "$B/gt" --gtest_filter=ExpertGemms.DwStoresSameBitsOnAnyGrid > "$L/racecheck.log" 2>&1
say "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log" | tail -1) (t=$SECONDS)"
timeout "$(cap 30)" compute-sanitizer --tool memcheck "$B/gt" --gtest_filter=ExpertGemms.DwStoresSameBitsOnAnyGrid > "$L/memcheck.log" 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1) (t=$SECONDS)"
say "done t=$SECONDS"
