#!/usr/bin/env bash
# Session 6, device call 3 (one H200, at most 10 minutes): everything the session's work needs from
# the GPU, in the order of what matters most, each step under its own time limit and skipped once the
# call's deadline nears. Binaries built on the dev machine (nvcc 13, sm_90a), carried xz-packed in
# .carry/s6 (leanmoe, leanmoe_gpu_tests, libleanmoe.a, commit) with .carry/blaslibs.tar.xz.
#   1. the GPU tests (kernel configs as data, token rounding with T < tile, T = 0, aliasing,
#      routing given by the caller), compute-sanitizer memcheck + racecheck on the new paths;
#   2. leanmoe bench over the grid, eager and as CUDA-graph replays (top-K-then-softmax, as SonicMoE's
#      run of calls 1-2 of this session), the four sparse rows with top-K vs token rounding, and
#      routing given by the caller vs the fused router on four rows;
#   3. the PyTorch front built there (in the background from t = 0), then the HF step of
#      Granite-3.1-3B-A800M, standard (b) vs in-backward (c) (issue 14 item 11);
#   4. examples/train_lm.py on the H200 preset within TRAIN_BUDGET seconds (issue 15).
# At most 8 files come back: results are copied to $OUT as they appear, logs in one tarball.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
R="$PWD"; FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
DEADLINE="${DEADLINE:-560}"
left() { echo $((DEADLINE - SECONDS)); }
source scripts/device_env.sh
B=/tmp/s6bin; mkdir -p $B
for f in leanmoe leanmoe_gpu_tests libleanmoe.a; do xz -dc .carry/s6/$f.xz > $B/$f; done; chmod +x $B/leanmoe $B/leanmoe_gpu_tests
commit="$(cat .carry/s6/commit)"; echo "$commit" > $B/commit
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"

# The python front builds on the CPUs while the GPU runs the tests.
(CMAKE_BUILD_PARALLEL_LEVEL=12 timeout 240 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
   ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
   >"$W/python_build.log" 2>&1; echo "rc=$?" >>"$W/python_build.log") &
pybuild=$!

echo "== GPU tests (t=${SECONDS})"
timeout 150 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | tail -12; cp "$W/gpu_tests.log" "$FINAL/"
echo "== memcheck (t=${SECONDS})"
timeout 90 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter="${MEMCHECK_FILTER:-ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.FewPersistentCtas:ExpertGemms.SingleToken:CudaBackend.TokenRoundingFewerTokensThanTheTile:CudaBackend.SingleToken:TrainingLoopGpu.*:CudaRoutingGiven.RandomRouting:CudaRoutingGiven.SentinelsAndATokenWithoutExperts:CudaRoutingGiven.ExpertListedTwiceAndHotAndEmptyExperts:CudaRoutingGiven.SingleTokenAndNoTokens}" \
  >"$W/memcheck.log" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log" | tail -4
echo "== racecheck (t=${SECONDS})"
timeout 50 compute-sanitizer --tool racecheck $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter="${RACECHECK_FILTER:-ExpertGemms.RaggedWithEmptyExpert:CudaRoutingGiven.RandomRouting:CudaRoutingGiven.ExpertListedTwiceAndHotAndEmptyExperts}" >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$W/racecheck.log" | tail -4

echo "== grid, eager and graph (t=${SECONDS})"
timeout 150 $B/leanmoe bench --grid --router topk_then_softmax --graph --iters 10 --warmup 3 --json "$W/leanmoe.json" \
  >"$W/leanmoe.txt" 2>"$W/leanmoe.err"; echo "grid rc=$?"; tail -2 "$W/leanmoe.err"; cp "$W/leanmoe.json" "$FINAL/" 2>/dev/null
cat "$W/leanmoe.txt" | grep -v '^\[' | cut -c1-150
echo "== token rounding vs top-K, sparse rows; routing given vs fused (t=${SECONDS})"
for c in sparse-T16k-d4096-n1024-E256 sparse-T8k-d4096-n1024-E256 sparse-T16k-d2048-n512-E256 sparse-T32k-d4096-n512-E512; do
  for r in topk token-rounding; do
    [ "$(left)" -gt 330 ] && timeout 30 $B/leanmoe bench --config $c --router topk_then_softmax --routing $r --graph --iters 10 --warmup 3 2>/dev/null | tail -1
  done
done >"$W/sparse.txt"; cat "$W/sparse.txt"
for c in 7B-n256 olmoe-1b-7b 120B-n2048 gpt-oss-20b; do
  for r in topk given; do
    [ "$(left)" -gt 320 ] && timeout 30 $B/leanmoe bench --config $c --router topk_then_softmax --routing $r --graph --iters 10 --warmup 3 2>/dev/null | tail -1
  done
done >"$W/given.txt"; cat "$W/given.txt"
tar czf "$FINAL/bench.tgz" -C "$W" leanmoe.txt sparse.txt given.txt gpu.txt 2>/dev/null

wait $pybuild; echo "== python front (t=${SECONDS}): $(tail -1 "$W/python_build.log")"
if grep -q "rc=0" "$W/python_build.log"; then
  if [ "$(left)" -gt 300 ]; then
    echo "== HF step, Granite b vs c (t=${SECONDS})"
    mkdir -p "$W/hf"
    (cd /tmp && PYTHONPATH=/tmp/site timeout 110 python3 "$R/bench/hf_step_bench.py" --out "$W/hf" --commit "$commit" \
       --seq 2048 --models granite --modes b,c --grad-ckpt --steps 6 --repeat 2 ${HF_ARGS:-}) >"$W/hf/hf_step.log" 2>&1
    echo "hf rc=$?"; tail -8 "$W/hf/hf_step.log"; cp "$W/hf/hf_step.md" "$FINAL/" 2>/dev/null
  fi
  budget=$(( $(left) - 60 )); [ "$budget" -gt "${TRAIN_BUDGET:-170}" ] && budget=${TRAIN_BUDGET:-170}
  if [ "$budget" -gt 60 ]; then
    echo "== train_lm, budget ${budget}s (t=${SECONDS})"
    mkdir -p "$W/train"
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout $((budget + 50)) python3 examples/train_lm.py --device cuda \
      --time-budget "$budget" --check-inbackward 200 --check-resume 20 --out "$W/train" \
      --ckpt-dir /tmp/train_lm_checkpoints --commit "$commit" ${TRAIN_ARGS:---batch 8 --train-mb 40} >"$W/train/train.log" 2>&1
    echo "train rc=$?"; tail -15 "$W/train/train.log"
    cp "$W/train/results.md" "$FINAL/train_results.md" 2>/dev/null; cp "$W/train/val_loss.png" "$FINAL/" 2>/dev/null
  fi
fi
echo "done (t=${SECONDS})"
