# epfp8: FP8 in the CUDA EP layer (refusal lifted). The EP GPU tests (bf16 ones + the new
# EpGpu.Fp8*: P = 2 and 4 ranks as threads on one GPU against the single-GPU FP8 layer, an idle
# rank, per-rank given codes bitwise = per-call quantization), the CPU-side EP tests in the same
# binary if any, then compute-sanitizer memcheck on the new FP8 EP tests only.
# Expected run time: ~50-90 s (tests ~15 s, memcheck ~30-60 s); hard cap 90 + 90 s.
# Returns $FINAL/ep_gpu_tests.log and $FINAL/ep_memcheck.log.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
T="$W/epfp8_gpu_tests"
xz -dc "$CARRY/leanmoe_gpu_tests.xz" > "$T" && chmod +x "$T"
echo "epfp8 commit $(cat "$CARRY/commit" 2>/dev/null)"

echo "== GPU tests: *Ep*:*EP* (t=${SECONDS})"
timeout 90 "$T" --gtest_brief=1 --gtest_filter='*Ep*:*EP*' > "$W/ep_gpu_tests.log" 2>&1
echo "gpu tests rc=$? (t=${SECONDS})"
grep -B2 -A8 "Failure" "$W/ep_gpu_tests.log" | head -40
cp "$W/ep_gpu_tests.log" "$FINAL/"

echo "== memcheck: EpGpu.Fp8* (t=${SECONDS})"
timeout 90 compute-sanitizer --tool memcheck --print-limit 20 "$T" --gtest_brief=1 \
  --gtest_filter='EpGpu.Fp8*' > "$W/ep_memcheck.log" 2>&1
echo "memcheck rc=$? (t=${SECONDS})"
cp "$W/ep_memcheck.log" "$FINAL/"

echo "== summary (t=${SECONDS})"
grep "\[ep-gpu\] FP8" "$W/ep_gpu_tests.log" | head -30
grep -E "tests? from .* ran|PASSED|FAILED" "$W/ep_gpu_tests.log" | head -10
grep -E "ERROR SUMMARY|tests? from .* ran|PASSED|FAILED" "$W/ep_memcheck.log" | head -6
