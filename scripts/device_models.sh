#!/usr/bin/env bash
# Issue 13 on the H200 (every transformers MoE model on leanmoe), with binaries built on the dev
# machine: `bash scripts/prepare_carry.sh` fills .carry/bin (leanmoe, leanmoe_gpu_tests,
# libleanmoe.a, commit) and .carry/blaslibs.tar.xz. Two calls (each fits the 10-minute limit):
#
#   PART=layer  bash scripts/device_models.sh   GPU tests (all, incl. CudaRoutingGiven.*), memcheck
#                                               and racecheck of the routing-given kernels, and the
#                                               layer bar: leanmoe bench --grid --graph, fused router
#                                               vs --routing given (given_vs_fused.md). ~5 min.
#   PART=hf     bash scripts/device_models.sh   the PyTorch front built there (against its torch),
#                                               pytest of test_routed.py + test_hf_experts.py (CUDA
#                                               cases), and bench/hf_step_bench.py: experts_implementation
#                                               grouped_mm vs leanmoe vs leanmoe + in-backward on 4-layer
#                                               Qwen3-30B-A3B, gpt-oss-20b, Moonlight-16B-A3B, OLMoE-1B-7B
#                                               at batch 4 x 2048 (hf_step.md). ~8 min.
# carry [".carry/bin", ".carry/blaslibs.tar.xz"] for both. Everything goes to a work folder; the
# result files and one tarball of the logs land in $OUT (the device returns a few files only).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
OUT="$(mktemp -d)"
trap 'for f in given_vs_fused.md fused.json given.json hf_step.md hf_step.json gpu_tests.log pytest.log; do
        [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL/"; done; tar czf "$FINAL/logs.tar.gz" -C "$OUT" .' EXIT
source scripts/device_env.sh
B="${LEANMOE_CARRY_BIN:-.carry/bin}"
commit="$(cat $B/commit 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
PART="${PART:-layer}"

if [ "$PART" = layer ]; then
  echo "== GPU tests"; timeout 200 $B/leanmoe_gpu_tests --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "PASSED|FAILED|tests ran" "$OUT/gpu_tests.log" | tail -12
  for tool in memcheck racecheck; do
    echo "== $tool (routing given)"
    timeout 90 compute-sanitizer --tool $tool $B/leanmoe_gpu_tests \
      --gtest_filter='CudaRoutingGiven.RandomRouting:CudaRoutingGiven.Sentinels*:CudaRoutingGiven.ExpertListedTwice*:CudaRoutingGiven.SingleTokenAndNoTokens' \
      >"$OUT/$tool.log" 2>&1
    echo "$tool rc=$?"; tail -2 "$OUT/$tool.log"
  done
  echo "== layer: fused router vs routing given (grid, eager and graph)"
  timeout 120 $B/leanmoe bench --grid --graph --iters 10 --warmup 3 --json "$OUT/fused.json" >"$OUT/fused.txt" 2>"$OUT/fused.err"
  echo "fused rc=$?"; tail -2 "$OUT/fused.err"
  timeout 120 $B/leanmoe bench --grid --graph --iters 10 --warmup 3 --routing given --json "$OUT/given.json" \
    >"$OUT/given.txt" 2>"$OUT/given.err"
  echo "given rc=$?"; tail -2 "$OUT/given.err"
  python3 bench/given_vs_fused.py --fused "$OUT/fused.json" --given "$OUT/given.json" --commit "$commit" \
    --out "$OUT/given_vs_fused.md"
  echo "== leanmoe check (routing given included)"
  timeout 60 $B/leanmoe check --device cuda --seeds 1 >"$OUT/check.txt" 2>&1; echo "check rc=$?"; tail -3 "$OUT/check.txt"
elif [ "$PART" = hf ]; then
  echo "== PyTorch front"
  R="$PWD"
  CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site ./python \
    -Ccmake.define.LEANMOE_CORE_LIBRARY="$R/$B/libleanmoe.a" -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
    >"$OUT/python_build.log" 2>&1 || { echo "python build failed"; tail -20 "$OUT/python_build.log"; exit 1; }
  (cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q "$R/python/tests/test_routed.py" \
    "$R/python/tests/test_hf_experts.py" -k cuda) >"$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
  (cd /tmp && PYTHONPATH=/tmp/site timeout 280 python3 "$R/bench/hf_step_bench.py" --out "$OUT" --commit "$commit" \
    --models qwen3_30b,gpt_oss_20b,moonlight,olmoe --modes g,l,i --layers 4 --batch 4 --seq 2048 ${HF_ARGS:-}) \
    >"$OUT/hf_step.log" 2>&1
  echo "hf step rc=$?"; tail -16 "$OUT/hf_step.log"
else
  echo "device_models.sh: PART must be layer or hf, got '$PART'" >&2; exit 2
fi
