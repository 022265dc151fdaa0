#!/usr/bin/env bash
# Session 7, device call 2 (one H200): the first GPU run of branch gpuact (issue 13 items 2-4: every
# activation, expert biases and the interleaved layout in the CUDA backend). Binaries built on the
# dev machine (nvcc 13, sm_90a) from gpuact's commit, carried xz-packed in .carry/s7g with gpuact's
# python/ tree (gpuact_src.tgz) and main's leanmoe_bench_gemms (b976f4f) for the A/B.
#   1. every GPU test; compute-sanitizer memcheck + racecheck on the new paths;
#   2. the default SwiGLU GEMMs A/B, main vs gpuact (its up/dH kernels now branch per tile on bias
#      and row order): leanmoe_bench_gemms --gemms up,dh on four shapes, interleaved, two rounds;
#   3. the python front of gpuact built there (in the background from t = 0), then test_routed.py
#      and test_hf_experts.py on cuda.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
R="$PWD"; FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
source scripts/device_env.sh
B=/tmp/s7g; mkdir -p $B/src
for f in leanmoe_gpu_tests leanmoe_bench_gemms libleanmoe.a main_bench_gemms; do xz -dc .carry/s7g/$f.xz > $B/$f; done
chmod +x $B/leanmoe_gpu_tests $B/leanmoe_bench_gemms $B/main_bench_gemms
tar xzf .carry/s7g/gpuact_src.tgz -C $B/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
(cd $B/src && CMAKE_BUILD_PARALLEL_LEVEL=14 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
   ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
   >"$W/python_build.log" 2>&1; echo "rc=$?" >>"$W/python_build.log") &
pybuild=$!

echo "== GPU tests (t=${SECONDS})"
timeout 200 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran|Failure|error" "$W/gpu_tests.log" | head -30; cp "$W/gpu_tests.log" "$FINAL/"
echo "== memcheck (t=${SECONDS})"
timeout 100 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.EveryActivationLayoutAndBias:CudaRoutingGiven.EveryActivationBiasAndLayout' >"$W/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log" | tail -4
echo "== racecheck (t=${SECONDS})"
timeout 60 compute-sanitizer --tool racecheck $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.EveryActivationLayoutAndBias' >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$W/racecheck.log" | tail -4

echo "== up/dh A/B, main vs gpuact (t=${SECONDS})"
for round in 1 2; do
  for bin in main_bench_gemms leanmoe_bench_gemms; do
    echo "-- round $round $bin"
    timeout 60 $B/$bin --shape 7B-n256,olmoe-1b-7b,120B-n2048,gpt-oss-20b --gemms up,dh --iters 20 --warmup 3 2>&1 | grep -v '^\['
  done
done >"$W/ab.txt" 2>&1; cat "$W/ab.txt"; cp "$W/ab.txt" "$FINAL/"

wait $pybuild; echo "== python front (t=${SECONDS}): $(tail -1 "$W/python_build.log")"
if grep -q "rc=0" "$W/python_build.log"; then
  (cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q -x "$B/src/python/tests/test_routed.py" \
    "$B/src/python/tests/test_hf_experts.py" -k cuda) >"$W/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -15 "$W/pytest.log"; cp "$W/pytest.log" "$FINAL/"
else tail -20 "$W/python_build.log"; fi
echo "done (t=${SECONDS})"
