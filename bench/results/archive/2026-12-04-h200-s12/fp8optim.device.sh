# fp8optim (issue 16): the expert optimizer's update writes the next step's FP8 weights in the same
# pass (ExpertOptimizer::set_fp8_copy; GPU kernel fused_update_fp8_kernel, branch fp8optim).
# 1. GPU tests: OptimFp8Gpu.* (GPU == CPU bit for bit: parameter, moments, master, codes, scales,
#    transposed copy; GPU with copy == plain GPU update; NaN/Inf; guard bytes), plus OptimGpu.* (the
#    plain update path, unchanged) and Fp8Quantize* (fp8_quantize_blocks after its refactor into
#    encode_block).
# 2. compute-sanitizer memcheck + racecheck on the new kernel (and fp8_quantize_blocks).
# 3. Timing (dev/optim_fp8_bench.cu): 120B-n2048's W2 [64, 4096, 2048] and W1 [64, 4096, 4096],
#    bf16 + fp32 master, AdamW: update alone vs update+copy (one kernel) vs update then
#    fp8_quantize_blocks, and the kernel alone at 1/2/3 CTAs per SM; ~32 GB of device memory at its peak.
# Expected run time: ~1.5-2 min (unpack ~5 s, tests ~30 s, memcheck ~30 s, racecheck ~30 s, bench
# ~10 s). Hard cap ~6.5 minutes (timeouts 150 + 90 + 90 + 60 s).
# Returns $FINAL/fp8optim_tests.log, $FINAL/fp8optim_sanitizers.log, $FINAL/fp8optim_bench.log.
# Pass: all selected tests passed, none of OptimFp8Gpu skipped; memcheck 0 errors; racecheck 0 hazards.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8optim"; mkdir -p "$B"
xz -dc "$CARRY/fp8optim_bins.tar.xz" | tar -x -C "$B" && chmod +x "$B/leanmoe_gpu_tests" "$B/leanmoe_dev_optim_fp8"
echo "fp8optim commit $(cat "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== fp8optim GPU tests (t=${SECONDS})"
timeout 150 "$B/leanmoe_gpu_tests" --gtest_filter='OptimFp8Gpu.*:OptimGpu.*:Fp8Quantize*' > "$W/fp8optim_tests.log" 2>&1
echo "tests rc=$? (t=${SECONDS})"
cp "$W/fp8optim_tests.log" "$FINAL/"

echo "== fp8optim sanitizers (t=${SECONDS})"
# The small cases only (ManyBlocks' 12.6M elements and the stack tests would take minutes there).
SAN='OptimFp8Gpu.AdamWBitwiseEqualsCpu:OptimFp8Gpu.SgdBitwiseEqualsCpu:OptimFp8Gpu.DeviceAndAlignmentRules:Fp8QuantizeGpu.WeightBlocksMatchHost'
: > "$W/fp8optim_sanitizers.log"
for tool in memcheck racecheck; do
  echo "---- $tool" >> "$W/fp8optim_sanitizers.log"
  timeout 90 compute-sanitizer --tool $tool --print-limit 20 \
    "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter="$SAN" >> "$W/fp8optim_sanitizers.log" 2>&1
  echo "$tool rc=$? (t=${SECONDS})"
done
cp "$W/fp8optim_sanitizers.log" "$FINAL/"

echo "== fp8optim bench (t=${SECONDS})"
timeout 60 "$B/leanmoe_dev_optim_fp8" 64 4096 2048 10 > "$W/fp8optim_bench.log" 2>&1
echo "bench rc=$? (t=${SECONDS})"
cp "$W/fp8optim_bench.log" "$FINAL/"

echo "== fp8optim summary (t=${SECONDS})"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\] (OptimFp8Gpu|OptimGpu|Fp8Quantize)" "$W/fp8optim_tests.log" | sed 's/ ([0-9]* ms)//' | awk '!seen[$0]++'
grep -A4 "Failure" "$W/fp8optim_tests.log" | head -40
grep -E "^\[  PASSED  \]|^\[  FAILED  \]" "$W/fp8optim_tests.log"
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$W/fp8optim_sanitizers.log"
grep -m5 -E "Invalid|Race|Hazard|FAILED" "$W/fp8optim_sanitizers.log"
cat "$W/fp8optim_bench.log"
ok=1
grep -q "^\[  FAILED  \]" "$W/fp8optim_tests.log" && ok=0
grep -q "^\[  PASSED  \]" "$W/fp8optim_tests.log" || ok=0
grep -qE "SKIPPED \] OptimFp8Gpu" "$W/fp8optim_tests.log" && ok=0
[ "$(grep -c 'ERROR SUMMARY: 0 errors' "$W/fp8optim_sanitizers.log")" = 1 ] || ok=0
[ "$(grep -c 'RACECHECK SUMMARY: 0 hazards' "$W/fp8optim_sanitizers.log")" = 1 ] || ok=0
grep -q "^OPTIM_FP8 layer" "$W/fp8optim_bench.log" || ok=0
echo "FP8OPTIM VERDICT: $([ $ok = 1 ] && echo PASS || echo FAIL) (needs: tests passed, OptimFp8Gpu not skipped; memcheck 0 errors; racecheck 0 hazards; bench line) t=${SECONDS}s"
