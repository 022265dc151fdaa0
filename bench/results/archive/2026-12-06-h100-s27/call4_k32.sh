#!/usr/bin/env bash
# Session 27, call 4: dW1 and dW2 on 32-deep k-tiles in 8 stages (`...:s8`, the same 192 KB) against
# 64-deep in 4 (`...:s4`, the heuristic's). The profile (call 3) has dW1's consumers waiting on full
# stages and its producer on empty ones at once: loads in flight too few for their latency? With 8
# stages the producer owns 6 ahead of the consumers' 2 (144 KB of loads in flight instead of 96).
# Tests of the gather kernel, memcheck and racecheck on both s8 kernels; alone, 2 rounds in rotating
# order; the layer's backward at 120B-n2048 and 30B-n1024, graph replays, 2 rotating rounds.
# Carry [".carry/k32"] (leanmoe, leanmoe_bench_gemms, leanmoe_gpu_tests of branch k32, xz).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/k32/leanmoe_gpu_tests.xz bg=.carry/k32/leanmoe_bench_gemms.xz leanmoe=.carry/k32/leanmoe.xz
say "k32 $(cat .carry/k32/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
timeout "$(cap 150)" "$B/gt" --gtest_filter='ExpertGemms*:GemmHeuristics.*:GemmConfig*:LayerGemmConfigs.*' > "$L/gpu_tests.log" 2>&1
say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/gpu_tests.log" | tr '\n' ' ') (t=$SECONDS)"
grep -E '^\[  FAILED  \]' "$L/gpu_tests.log" | head -5 | tee -a "$S"
F='ExpertGemms/DwConfig.RaggedAndFewCtas/*s8*'
timeout "$(cap 60)" compute-sanitizer --tool memcheck "$B/gt" --gtest_filter="$F" > "$L/memcheck.log" 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1) (t=$SECONDS)"
timeout "$(cap 60)" compute-sanitizer --tool racecheck "$B/gt" --gtest_filter="$F" > "$L/racecheck.log" 2>&1
say "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log" | tail -1) (t=$SECONDS)"
G=gather:coop
A1=$G:256x128:s4:tma:c2; B1=$G:256x128:s8:tma:c2; A2=$G:128x256:s4:tma:c2; B2=$G:128x256:s8:tma:c2
for r in 1 2; do
  if [ $r = 1 ]; then cfg="dw1=$A1,dw1=$B1,dw1=$A1,dw1=$B1,dw2=$A2,dw2=$B2,dw2=$A2,dw2=$B2"
  else cfg="dw1=$B1,dw1=$A1,dw1=$B1,dw1=$A1,dw2=$B2,dw2=$A2,dw2=$B2,dw2=$A2"; fi
  timeout "$(cap 100)" "$B/bg" --shape 120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b --gemms dw1,dw2 --iters 20 --warmup 3 \
    --warm-seconds 2 --config "$cfg" > "$L/dw_r$r.txt" 2>&1
  say "dw alone r$r rc=$? (t=$SECONDS)"; grep -E '^\| ' "$L/dw_r$r.txt" | grep -v '^| shape' | tee -a "$S"
done
declare -A V=([s4]="" [s8]="--gemm-config dw1=$B1,dw2=$B2")
[ $((budget - SECONDS)) -gt 60 ] && layer_rounds 2 120B-n2048,30B-n1024 s4 s8
say "done t=$SECONDS"
