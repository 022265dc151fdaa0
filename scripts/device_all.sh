#!/usr/bin/env bash
# One batched call on the H200 with binaries built on the dev machine and carried in .carry/bin
# (leanmoe, leanmoe_gpu_tests, leanmoe_bench_inbackward) plus .carry/blaslibs.tar.xz (OpenBLAS for
# the CPU reference) and .carry/torch_moe_baseline.py (the anchor). Writes everything under $OUT:
# GPU tests, a memcheck run, the grid benchmark beside the PyTorch anchor (results.md), token
# rounding vs top-K, and the in-backward stack benchmark. Each step has its own time limit so one
# failure does not cost the rest. The device returns at most 8 files from $OUT, so everything is
# written to a work folder and only the results plus one tarball of the logs land in $OUT.
# HF=1 also builds the PyTorch front there (against its torch, linking .carry/bin/libleanmoe.a) and
# runs bench/hf_step_bench.py (issue #5's step benchmark, ~150 s). GRID=0 skips the layer
# benchmarks (grid, anchor, token rounding, in-backward stack: ~4 min). PYTEST=1 also runs pytest there
# (~2 min); MEMCHECK=0 skips compute-sanitizer; HF_ARGS passes flags to hf_step_bench.py;
# HF_SEQS lists its sequence lengths (default 2048; HF_SEQS= runs none: build and pytest only).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
OUT="$(mktemp -d)"
trap 'for f in results.md leanmoe.json baseline.json inbackward.md inbackward.json hf_step.md hf_step.json; do
        [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL/"; done; tar czf "$FINAL/logs.tar.gz" -C "$OUT" .' EXIT
source scripts/device_env.sh  # OpenBLAS and NCCL (the tests link both) on LD_LIBRARY_PATH
B="${LEANMOE_CARRY_BIN:-.carry/bin}"  # or a folder with just the binaries used here (the carry limit is 64 MiB)
commit="$(cat $B/commit 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

echo "== GPU tests"; timeout 150 $B/leanmoe_gpu_tests --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$OUT/gpu_tests.log" | tail -8
if [ "${MEMCHECK:-1}" = 1 ]; then
  echo "== memcheck"; timeout 90 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests \
    --gtest_filter='CudaBackend.SingleToken*:CudaBackend.TokenRounding*:ExpertGemms.*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -2 "$OUT/memcheck.log"
fi

if [ "${GRID:-1}" = 1 ]; then
  echo "== grid"; timeout 200 $B/leanmoe bench --grid --iters 10 --warmup 3 --json "$OUT/leanmoe.json" >"$OUT/leanmoe.txt" 2>"$OUT/leanmoe.err"
  echo "grid rc=$?"; tail -3 "$OUT/leanmoe.err"
  echo "== anchor"; NO_LOOP=1 OUT="$OUT" PYTHONUNBUFFERED=1 timeout 200 python3 .carry/torch_moe_baseline.py >"$OUT/baseline.log" 2>&1
  echo "anchor rc=$?"; tail -1 "$OUT/baseline.log"
  python3 bench/compare.py --leanmoe "$OUT/leanmoe.json" --anchor "$OUT/baseline.json" --commit "$commit" \
    --command "leanmoe bench --grid --iters 10 --warmup 3 --json leanmoe.json; NO_LOOP=1 python3 torch_moe_baseline.py" \
    --out "$OUT/results.md" && echo "results.md written"

  echo "== token rounding vs top-K"
  for c in 7B-n256 30B-n256; do for r in topk token-rounding; do
    timeout 40 $B/leanmoe bench --config $c --routing $r --iters 10 --warmup 3 --json "$OUT/tr_${c}_${r}.json" 2>/dev/null | tail -4
  done; done > "$OUT/token_rounding.txt"; cat "$OUT/token_rounding.txt"
fi

echo "== each expert GEMM on its own"
timeout 60 $B/leanmoe_bench_gemms --shape 7B-n256,120B-n2048,olmoe-1b-7b >"$OUT/gemms.txt" 2>&1; echo "gemms rc=$?"; cat "$OUT/gemms.txt"

if [ "${GRID:-1}" = 1 ]; then
  echo "== in-backward stack"; timeout 150 $B/leanmoe_bench_inbackward --device cuda --commit "$commit" --out "$OUT" >"$OUT/inbackward.log" 2>&1
  echo "inbackward rc=$?"; tail -25 "$OUT/inbackward.log"
fi

if [ "${HF:-0}" = 1 ]; then
  echo "== HF training step (python front)"
  R="$PWD"
  CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 180 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site ./python \
    -Ccmake.define.LEANMOE_CORE_LIBRARY="$R/$B/libleanmoe.a" -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
    >"$OUT/python_build.log" 2>&1 || { echo "python build failed"; tail -20 "$OUT/python_build.log"; exit 1; }
  if [ "${PYTEST:-0}" = 1 ]; then
    (cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 -m pytest -q -x "$R/python/tests") >"$OUT/pytest.log" 2>&1
    echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
  fi
  # One run per sequence length in HF_SEQS; the first one's hf_step.md/json come back as files,
  # every run's files are in logs.tar.gz under hf_seq<S>/.
  first=1
  for seq in ${HF_SEQS-2048}; do
    mkdir -p "$OUT/hf_seq$seq"
    (cd /tmp && PYTHONPATH=/tmp/site timeout 240 python3 "$R/bench/hf_step_bench.py" --out "$OUT/hf_seq$seq" \
      --commit "$commit" --seq "$seq" ${HF_ARGS:-}) >"$OUT/hf_seq$seq/hf_step.log" 2>&1
    echo "hf step seq $seq rc=$?"; tail -12 "$OUT/hf_seq$seq/hf_step.log"
    [ "$first" = 1 ] && cp "$OUT/hf_seq$seq"/hf_step.{md,json} "$OUT/" 2>/dev/null; first=0
  done
fi
