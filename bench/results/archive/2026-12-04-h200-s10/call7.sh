#!/usr/bin/env bash
# Session 10, device call 7, prepared and NOT run (no device time was left: the start was refused for
# lack of budget): main with topkfast's router kernel and down's 64x64 epilogue subtiles compiled
# (binaries of the working tree in .carry/s10c): the expert-GEMM tests over every compiled configuration
# (tma64 included), the config/heuristic and routing tests; down at n = 256 per GEMM, tma64 vs tma.
# Next session: run it (with compute-sanitizer memcheck on ExpertGemms.EveryCompiledConfig) before
# the heuristic takes tma64 for down at n <= 256.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
B=/tmp/s10c; mkdir -p $B
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc .carry/s10c/$f.xz > $B/$f; chmod +x $B/$f; done
timeout 30 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.EveryCompiledConfig:GemmConfig*:GemmHeuristics*:CudaRouting*' > "$FINAL/gpu_tests.log" 2>&1
echo "tests rc=$?"; grep -E "PASSED|FAILED|tests ran" "$FINAL/gpu_tests.log"
for cfg in "down=cutlass:pingpong:128x192:auto:tma64:c1x2" "down=cutlass:pingpong:128x192:auto:tma:c1x2"; do
  timeout 10 $B/leanmoe_bench_gemms --shape 7B-n256,1.4B-n256,30B-n256 --gemms down --iters 10 --warmup 2 \
    ${cfg:+--config $cfg} 2>&1 | grep "^| [0-9]" | tee -a "$FINAL/bench_down.md"
done
