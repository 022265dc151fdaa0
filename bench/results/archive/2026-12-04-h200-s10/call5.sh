#!/usr/bin/env bash
# Session 10, device call 5 (one H200, ~4 minutes; issue 17): the library with CUTLASS ping-pong
# 192x128 (1x2 clusters) compiled for down and dx beside 128x192 (binaries of the working tree in
# .carry/s10b, heuristic unchanged):
#   1. GPU tests of the expert GEMMs (every compiled configuration, both layouts) and of the configs;
#      compute-sanitizer memcheck over every compiled configuration;
#   2. leanmoe_bench_gemms over the grid, down and dx: the heuristic's configuration, then 192x128 1x2;
#   3. dev/cutlass_tiles: wider epilogue subtiles for down's 128x192 on the small-n shapes;
#   4. the fragments of branches topkfast (router top-K kernel) and fp8gpu (CUTLASS's FP8 blockwise
#      grouped GEMM beside the library's bf16 one: dev/fp8_grouped), as carried in .carry/<branch>.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
source scripts/device_env.sh
B=/tmp/s10b; mkdir -p $B
for f in leanmoe_gpu_tests leanmoe_bench_gemms cutlass_tiles; do xz -dc .carry/s10b/$f.xz > $B/$f; chmod +x $B/$f; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
echo "== 1. GPU tests (t=${SECONDS})"
timeout 70 $B/leanmoe_gpu_tests --gtest_brief=1 --gtest_filter='ExpertGemms.*:GemmConfig*' >"$W/gpu_tests.log" 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | head; grep -B2 -A8 "Failure" "$W/gpu_tests.log" | head -30
timeout 50 compute-sanitizer --tool memcheck --print-limit 10 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.EveryCompiledConfig' >"$W/memcheck.log" 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log" | tail -3
echo "== 2. bench_gemms down, dx (t=${SECONDS})"
for cfg in "" "down=cutlass:pingpong:192x128:auto:tma:c1x2,dx=cutlass:pingpong:192x128:auto:tma:c1x2"; do
  timeout 50 $B/leanmoe_bench_gemms --shape grid --gemms down,dx --iters 10 --warmup 2 ${cfg:+--config $cfg} \
    >>"$W/bench_gemms.md" 2>&1; echo "rc=$?"
done
echo "== 3. cutlass_tiles (t=${SECONDS})"
[ $SECONDS -lt 150 ] && timeout 25 $B/cutlass_tiles --shapes 1.4B-n256,7B-n256,30B-n256,granite-3.1-3b-a800m,7B-n512 --kinds down --only e \
  --raster m --iters 10 --warmup 2 --sets 3 >"$W/tiles.log" 2>&1; echo "rc=$?"; grep -c WRONG "$W/tiles.log"
cp "$W"/bench_gemms.md "$W"/tiles.log "$W"/gpu_tests.log "$FINAL/" 2>/dev/null
for b in topkfast fp8gpu; do
  [ -f .carry/$b/fragment.sh ] || continue
  echo "== 4. branch $b (t=${SECONDS})"; mkdir -p "$W/$b"
  [ $SECONDS -lt 270 ] || { echo "skipped: time"; continue; }
  CARRY=.carry/$b W="$W/$b" FINAL="$FINAL" timeout 75 bash .carry/$b/fragment.sh 2>&1 | tail -40
done
echo "done (t=${SECONDS})"
