#!/usr/bin/env bash
# Session 7, device call 1 (one H200, at most 10 minutes): measurements on main's binaries (built on
# the dev machine, nvcc 13, sm_90a, carried xz-packed in .carry/s7 with .carry/blaslibs.tar.xz).
#   1. per-kernel times (ncu, gpu__time_duration only, clocks left alone) of one forward + backward
#      at 1.4B-n256, 7B-n256, 120B-n2048 (issue 17: where the small-shape forward and the backward
#      lose to SonicMoE) and of top-K vs token rounding at sparse-T8k-d4096-n1024-E256 (issue 15:
#      where the rounded run still loses to its bound);
#   2. examples/train_lm.py at a larger batch and token budget than session 6 (issue 15: 32 x 1024
#      tokens per step, TRAIN_BUDGET seconds for the five runs; the bitwise checks passed at 200
#      steps in session 6 and are left out here for time), the python front built there first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
R="$PWD"; FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
DEADLINE="${DEADLINE:-570}"
left() { echo $((DEADLINE - SECONDS)); }
source scripts/device_env.sh
B=/tmp/s7bin; mkdir -p $B
for f in leanmoe libleanmoe.a; do xz -dc .carry/s7/$f.xz > $B/$f; done; chmod +x $B/leanmoe
commit="$(cat .carry/s7/commit)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"

(CMAKE_BUILD_PARALLEL_LEVEL=14 timeout 240 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
   ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
   >"$W/python_build.log" 2>&1; echo "rc=$?" >>"$W/python_build.log") &
pybuild=$!

echo "== ncu per-kernel times (t=${SECONDS})"
prof() {  # name, then leanmoe bench flags
  local name=$1; shift
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $B/leanmoe bench "$@" --router topk_then_softmax --iters 1 --warmup 1 >"$W/ncu_$name.csv" 2>"$W/ncu_$name.err"
  echo "$name rc=$?"
}
prof 1.4B-n256 --config 1.4B-n256
prof 7B-n256 --config 7B-n256
prof 120B-n2048 --config 120B-n2048
prof T8k-topk --config sparse-T8k-d4096-n1024-E256 --routing topk
prof T8k-tr --config sparse-T8k-d4096-n1024-E256 --routing token-rounding
tar czf "$FINAL/ncu.tgz" -C "$W" $(cd "$W" && ls ncu_*) 2>/dev/null

wait $pybuild; echo "== python front (t=${SECONDS}): $(tail -1 "$W/python_build.log")"
if grep -q "rc=0" "$W/python_build.log"; then
  budget=$(( $(left) - 45 )); [ "$budget" -gt "${TRAIN_BUDGET:-330}" ] && budget=${TRAIN_BUDGET:-330}
  echo "== train_lm, budget ${budget}s (t=${SECONDS})"
  mkdir -p "$W/train"
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout $((budget + 40)) python3 examples/train_lm.py --device cuda \
    --time-budget "$budget" --out "$W/train" --ckpt-dir /tmp/train_lm_checkpoints --commit "$commit" \
    ${TRAIN_ARGS:---batch 32 --train-mb 120} >"$W/train/train.log" 2>&1
  echo "train rc=$?"; tail -22 "$W/train/train.log"
  cp "$W/train/results.md" "$FINAL/train_results.md" 2>/dev/null; cp "$W/train/val_loss.png" "$FINAL/" 2>/dev/null
  tar czf "$FINAL/train_runs.tgz" -C "$W/train" $(cd "$W/train" && ls *.json train.log) 2>/dev/null
else
  tail -30 "$W/python_build.log"
fi
echo "done (t=${SECONDS})"
