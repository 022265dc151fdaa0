#!/usr/bin/env bash
# Session 9, device call 5 (one H200, at most 10 minutes): main with this session's branches merged
# (backward overlap, transposed layout, CUTLASS tiles for down/dx, FP8 CPU reference); binaries built
# on the dev machine (nvcc 13, sm_90a, OpenBLAS linked statically), xz-packed in .carry/m5 with the
# commit; .carry/blaslibs.tar.xz for the python front built there.
#   1. every GPU test; compute-sanitizer memcheck on the transposed paths under the overlapped
#      backward (the new CUTLASS configs passed memcheck in call 2), racecheck on the overlap tests;
#   2. leanmoe bench over the grid, eager and as CUDA-graph replays (top-K-then-softmax);
#   3. the python front built there (from t = 0), pytest -k cuda on the routed op, the transformers
#      experts seam, the optimizer and the training loop.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
R="$PWD"; FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=site . 2>/dev/null' EXIT
source scripts/device_env.sh
B=/tmp/m5; mkdir -p $B
for f in leanmoe leanmoe_gpu_tests leanmoe_bench_gemms libleanmoe.a; do xz -dc .carry/m5/$f.xz > $B/$f; done
chmod +x $B/leanmoe $B/leanmoe_gpu_tests $B/leanmoe_bench_gemms
echo "commit $(cat .carry/m5/commit)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
(CMAKE_BUILD_PARALLEL_LEVEL=14 timeout 240 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
   ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
   >"$W/python_build.log" 2>&1; echo "rc=$?" >>"$W/python_build.log") &
pybuild=$!

echo "== GPU tests (t=${SECONDS})"
timeout 240 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | head -20; grep -B3 -A12 "Failure" "$W/gpu_tests.log" | head -40
cp "$W/gpu_tests.log" "$FINAL/"
echo "== memcheck (t=${SECONDS})"
timeout 60 compute-sanitizer --tool memcheck --print-limit 20 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.TransposedWeights:CudaRoutingGiven.GptOssExperts:BackwardOverlap.BiasesHotAndEmptyExpertsBitwise' \
  >"$W/memcheck.log" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log" | tail -4
echo "== racecheck (t=${SECONDS})"
timeout 50 compute-sanitizer --tool racecheck $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='BackwardOverlap.InBackward*:ExpertGemms.GptOssExpertFunction' >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$W/racecheck.log" | tail -4
cat "$W/memcheck.log" "$W/racecheck.log" > "$FINAL/sanitizers.log"

echo "== grid, eager and graph (t=${SECONDS})"
timeout 180 $B/leanmoe bench --grid --router topk_then_softmax --graph --iters 10 --warmup 3 --json "$W/leanmoe.json" \
  >"$W/leanmoe.txt" 2>"$W/leanmoe.err"; echo "grid rc=$?"; tail -2 "$W/leanmoe.err"; cp "$W/leanmoe.json" "$FINAL/" 2>/dev/null
grep -v '^\[' "$W/leanmoe.txt" | cut -c1-150 | tail -24

wait $pybuild; echo "== python front (t=${SECONDS}): $(tail -1 "$W/python_build.log")"
if grep -q "rc=0" "$W/python_build.log"; then
  (cd /tmp && PYTHONPATH=/tmp/site timeout $((585 - SECONDS)) python3 -m pytest -q "$R/python/tests/test_routed.py" \
    "$R/python/tests/test_hf_experts.py" "$R/python/tests/test_optim.py" "$R/python/tests/test_training_loop.py" -k cuda) >"$W/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -6 "$W/pytest.log"; cp "$W/pytest.log" "$FINAL/"
else tail -20 "$W/python_build.log"; fi
echo "done (t=${SECONDS})"
