# Device fragment of branch `transposed` (issue 13: the transposed / gpt-oss weight layout on cuda).
# Run from the root of a checkout with $CARRY (a copy of /work/wt/transposed.carry), $W (scratch),
# $FINAL (files that come back), OpenBLAS on LD_LIBRARY_PATH. Expected run time ~3-3.5 minutes
# (GPU tests ~100-130 s, memcheck ~30 s, racecheck ~30 s, benches ~40 s); every step has a timeout
# and the benches are skipped past 200 s.
#   1. GPU tests: ExpertGemms (both layouts, every compiled config, bands, capped CTAs, every
#      activation x row order x bias x layout), CudaBackend, CudaRoutingGiven (GptOssExperts),
#      GemmHeuristics/GemmConfig, OptimGpuStack (in-backward with a transposed gpt-oss layer).
#   2. compute-sanitizer memcheck + racecheck on the new paths (transposed up/dH/down/dx/dW, the
#      interleaved-pairs epilogue with b1).
#   3. leanmoe_bench_gemms: HF vs transposed at gpt-oss-20b and 7B-n256 (each GEMM timed in both
#      layouts in turn), [gate; up] and interleaved; leanmoe bench (layer) at gpt-oss-20b both layouts.
set -uo pipefail
T0=$SECONDS
B="$W/bin"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms leanmoe; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "transposed: binaries of $(cat "$CARRY/commit")"

FILTER='ExpertGemms.*:CudaBackend.*:CudaRoutingGiven.*:GemmHeuristics.*:GemmConfig.*:OptimGpuStack.*'
timeout 170 "$B/leanmoe_gpu_tests" --gtest_filter="$FILTER" >"$W/gpu_tests.log" 2>&1; tests_rc=$?
grep -E "^\[  FAILED  \]|Failure|error:|got .*want|elements off|rel_error|Expected|Which is|actual" "$W/gpu_tests.log" \
  | head -60 >"$FINAL/transposed_failures.txt"
grep -E "^\[ +(OK|FAILED) +\] .* ms\)$" "$W/gpu_tests.log" | sed 's/^\[ *\(OK\|FAILED\) *\] /\1 /' >"$FINAL/transposed_tests.txt"
tail -3 "$W/gpu_tests.log" >>"$FINAL/transposed_tests.txt"

SAN='ExpertGemms.GptOssExpertFunction:ExpertGemms.TransposedWeights:CudaRoutingGiven.GptOssExperts'
timeout 90 compute-sanitizer --tool memcheck "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter="$SAN" \
  >"$W/memcheck.log" 2>&1; mem_rc=$?
timeout 80 compute-sanitizer --tool racecheck "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemms.GptOssExpertFunction:ExpertGemms.TransposedWeights' >"$W/racecheck.log" 2>&1; race_rc=$?
{ grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log" | tail -3; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$W/racecheck.log" | tail -3; } \
  >"$FINAL/transposed_sanitizers.txt"
grep -m 20 -E "Invalid|Race|Hazard|at 0x|by thread" "$W/memcheck.log" "$W/racecheck.log" >>"$FINAL/transposed_sanitizers.txt"

{
  if [ $((SECONDS - T0)) -le 200 ]; then
    echo "## leanmoe_bench_gemms, [gate; up] (hf = the default path's own up/dH kernels; transposed = the general ones)"
    timeout 45 "$B/leanmoe_bench_gemms" --shape gpt-oss-20b,7B-n256 --layout hf,transposed,hf,transposed --iters 20 2>&1 \
      | grep -E '^\| [0-9a-zA-Z]|rror|^leanmoe'
    echo "## interleaved (both the general kernels): up and dh"
    timeout 30 "$B/leanmoe_bench_gemms" --shape gpt-oss-20b,7B-n256 --gemms up,dh --interleaved \
      --layout hf,transposed,hf,transposed --iters 20 2>&1 | grep -E '^\| [0-9a-zA-Z]|rror|^leanmoe'
  else echo "benches skipped (t=$((SECONDS - T0)) s)"; fi
  if [ $((SECONDS - T0)) -le 215 ]; then
    echo "## leanmoe bench (layer, SwiGLU, top-K), gpt-oss-20b"
    for layout in hf transposed; do
      echo "layout $layout: $(timeout 25 "$B/leanmoe" bench --config gpt-oss-20b --layout $layout --iters 8 --warmup 2 2>&1 \
        | grep -E '^gpt-oss|rror' | tr -s ' ')"
    done
  fi
} >"$FINAL/transposed_bench.txt" 2>&1

echo "== transposed summary (t=$((SECONDS - T0)) s)"
echo "gpu tests rc=$tests_rc: $(grep -c '^OK' "$FINAL/transposed_tests.txt") ok, $(grep -c '^FAILED' "$FINAL/transposed_tests.txt") failed"
grep '^FAILED' "$FINAL/transposed_tests.txt" | head -20
head -15 "$FINAL/transposed_failures.txt"
echo "memcheck rc=$mem_rc racecheck rc=$race_rc"; cat "$FINAL/transposed_sanitizers.txt" | head -12
cat "$FINAL/transposed_bench.txt"
