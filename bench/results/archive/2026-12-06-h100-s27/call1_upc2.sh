#!/usr/bin/env bash
# Session 27, call 1: bf16 up in 2x1 clusters (`gather:coop:128x256:s4:warp:c2`: each CTA of a pair
# loads half of the W1 tile by TMA into both, as FP8 up and dH do) against up alone (`...:c1`, the
# heuristic's), at the power cap. QuACK's up runs 128x256 in 2x1 clusters and led ours by 6-8% at
# gpt-oss-20b and olmoe-1b-7b in s26's trace. The GPU tests of the gather kernel (every compiled
# config, every up config on every expert function), memcheck and racecheck on the new kernel; up
# alone, 3 rounds in rotating order after a throwaway timing; the layer's forward as graph replays,
# 2 rotating rounds. Carry [".carry/upc2"] (leanmoe, leanmoe_bench_gemms, leanmoe_gpu_tests of
# branch upc2, xz). Returns summary.txt, logs.tar.gz. ~420 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/upc2/leanmoe_gpu_tests.xz bg=.carry/upc2/leanmoe_bench_gemms.xz leanmoe=.carry/upc2/leanmoe.xz
say "upc2 $(cat .carry/upc2/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
timeout "$(cap 150)" "$B/gt" --gtest_filter='ExpertGemms*:GemmHeuristics.*:GemmConfig*:LayerGemmConfigs.*' > "$L/gpu_tests.log" 2>&1
say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/gpu_tests.log" | tr '\n' ' ') (t=$SECONDS)"
C2='ExpertGemms/UpConfig.EveryExpertFunction/gather_coop_128x256_s4_warp_c2'
timeout "$(cap 100)" compute-sanitizer --tool memcheck "$B/gt" --gtest_filter="$C2" > "$L/memcheck.log" 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1) (t=$SECONDS)"
timeout "$(cap 100)" compute-sanitizer --tool racecheck "$B/gt" --gtest_filter="ExpertGemms.TransposedWeights:$C2" > "$L/racecheck.log" 2>&1
say "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log" | tail -1) (t=$SECONDS)"
U=gather:coop:128x256:s4:warp
ROWS=120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then cfg="up=$U:c1,up=$U:c2,up=$U:c1,up=$U:c2:b4"; else cfg="up=$U:c2,up=$U:c1,up=$U:c2,up=$U:c2:b4"; fi
  timeout "$(cap 90)" "$B/bg" --shape "$ROWS" --gemms up --iters 20 --warmup 3 --warm-seconds 2 --config "$cfg" \
    > "$L/up_alone_r$r.txt" 2>&1
  say "up alone r$r rc=$? (t=$SECONDS)"; grep -E '^\| ' "$L/up_alone_r$r.txt" | tee -a "$S"
done
declare -A V=([c1]="" [c2]="--gemm-config up=$U:c2")
[ $((budget - SECONDS)) -gt 150 ] && layer_rounds 2 "$ROWS" c1 c2
say "done t=$SECONDS"
