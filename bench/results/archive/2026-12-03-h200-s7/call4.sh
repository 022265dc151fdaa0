#!/usr/bin/env bash
# Session 7, device call 4 (one H200, at most 10 minutes): call 3's script on the binaries of the
# fully merged session (branch gpuact included), with the grid instead of the HF step; binaries (built on the dev machine, nvcc 13, sm_90a; carried xz-packed in .carry/s7m with
# .carry/blaslibs.tar.xz, and main b976f4f's leanmoe_bench_gemms in .carry/s7g for the A/B):
#   1. every GPU test (activations/biases/interleaved, the new routing chain, EP through the
#      routing-given entry point); compute-sanitizer memcheck + racecheck on the new paths;
#   2. per-kernel ncu times at 7B-n256 and 1.4B-n256 (the routing chain, against call 1's);
#   3. up/dH A/B of the default SwiGLU kernels, b976f4f vs now;
#   4. leanmoe bench over the grid, eager and as CUDA-graph replays (top-K-then-softmax);
#   5. the python front built there (from t = 0), pytest test_routed + test_hf_experts on cuda.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
R="$PWD"; FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
DEADLINE="${DEADLINE:-560}"
left() { echo $((DEADLINE - SECONDS)); }
source scripts/device_env.sh
B=/tmp/s7m; mkdir -p $B
for f in leanmoe leanmoe_gpu_tests leanmoe_bench_gemms libleanmoe.a; do xz -dc .carry/s7m/$f.xz > $B/$f; done
xz -dc .carry/s7g/main_bench_gemms.xz > $B/old_bench_gemms
chmod +x $B/leanmoe $B/leanmoe_gpu_tests $B/leanmoe_bench_gemms $B/old_bench_gemms
commit="$(cat .carry/s7m/commit)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
(CMAKE_BUILD_PARALLEL_LEVEL=14 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
   ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
   >"$W/python_build.log" 2>&1; echo "rc=$?" >>"$W/python_build.log") &
pybuild=$!

echo "== GPU tests (t=${SECONDS})"
timeout 200 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | head -20; grep -c Failure "$W/gpu_tests.log"
grep '\[ep-gpu\]' "$W/gpu_tests.log" | grep -v " 0 of " | head -8; cp "$W/gpu_tests.log" "$FINAL/"
SAN='CudaRouting.*:CudaBackend.TokenRoundingAllModes:CudaBackend.EmptyExpertAndHotExpert:CudaRoutingGiven.RandomRouting:EpGpu.IdleRankAndHotExpert:EpGpu.FourRanksRaggedMatchOneGpu:ExpertGemms.EveryActivationLayoutAndBias:CudaRoutingGiven.EveryActivationBiasAndLayout'
echo "== memcheck (t=${SECONDS})"
timeout 130 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests --gtest_brief=1 --gtest_filter="$SAN" >"$W/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log" | tail -5
echo "== racecheck (t=${SECONDS})"
timeout 80 compute-sanitizer --tool racecheck $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='CudaRouting.*:CudaRoutingGiven.RandomRouting:ExpertGemms.EveryActivationLayoutAndBias' >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$W/racecheck.log" | tail -5

echo "== ncu (t=${SECONDS})"
for c in 7B-n256 1.4B-n256; do
  timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $B/leanmoe bench --config $c --router topk_then_softmax --iters 1 --warmup 1 >"$W/ncu_$c.csv" 2>"$W/ncu_$c.err"
  python3 dev/ncu_kernel_times.py "$W/ncu_$c.csv" | head -12
done
tar czf "$FINAL/ncu.tgz" -C "$W" $(cd "$W" && ls ncu_*)
if [ "${AB:-1}" = 1 ]; then echo "== up/dh A/B (t=${SECONDS})"
for round in 1 2; do for bin in old_bench_gemms leanmoe_bench_gemms; do
  echo "-- round $round $bin"
  timeout 40 $B/$bin --shape 7B-n256,olmoe-1b-7b,120B-n2048,gpt-oss-20b --gemms up,dh,dw2,dw1 --iters 20 --warmup 3 2>&1 | grep '^| [0-9a-z]'
done; done >"$W/ab.txt" 2>&1; cat "$W/ab.txt" | cut -c1-140; cp "$W/ab.txt" "$FINAL/"; fi

echo "== grid, eager and graph (t=${SECONDS})"
timeout 170 $B/leanmoe bench --grid --router topk_then_softmax --graph --iters 10 --warmup 3 --json "$W/leanmoe.json" \
  >"$W/leanmoe.txt" 2>"$W/leanmoe.err"; echo "grid rc=$?"; tail -2 "$W/leanmoe.err"; cp "$W/leanmoe.json" "$FINAL/" 2>/dev/null
grep -v '^\[' "$W/leanmoe.txt" | cut -c1-150

wait $pybuild; echo "== python front (t=${SECONDS}): $(tail -1 "$W/python_build.log")"
if grep -q "rc=0" "$W/python_build.log"; then
  (cd /tmp && PYTHONPATH=/tmp/site timeout 120 python3 -m pytest -q "$R/python/tests/test_routed.py" \
    "$R/python/tests/test_hf_experts.py" -k cuda) >"$W/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -4 "$W/pytest.log"; cp "$W/pytest.log" "$FINAL/"
else tail -20 "$W/python_build.log"; fi
echo "done (t=${SECONDS})"
