#!/usr/bin/env bash
# Issue 15 in one device call on the H200 (about 8 minutes): builds the PyTorch front there
# against the carried CUDA core (like device_all.sh's HF=1 step, ~2.5 min), then runs
# examples/train_lm.py with its H200 preset: top-K, token rounding nearest / up / down and
# in-backward at one token budget, whose step count a calibration sets so that all runs and checks
# take TRAIN_BUDGET seconds (default 300); the in-backward run is checked bitwise against a
# standard twin over its first 250 steps, and the top-K run resumed from a checkpoint 50 steps
# before its end. Files back in $OUT (8): results.md, val_loss.png, run_<name>.json x5, train.log.
#
# Here first: bash scripts/prepare_carry.sh (fills .carry/bin with libleanmoe.a and commit, and
# .carry/blaslibs.tar.xz); then the device command `bash scripts/device_train.sh` with carry
# [".carry/bin/libleanmoe.a", ".carry/bin/commit", ".carry/blaslibs.tar.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$OUT"
log="$OUT/train.log"
source scripts/device_env.sh  # OpenBLAS and NCCL on LD_LIBRARY_PATH (the core links both)
B="${LEANMOE_CARRY_BIN:-.carry/bin}"
commit="$(cat "$B/commit" 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$log"

start=$SECONDS
echo "== python front" | tee -a "$log"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
  ./python -Ccmake.define.LEANMOE_CORE_LIBRARY="$PWD/$B/libleanmoe.a" \
  -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 >/tmp/python_build.log 2>&1 ||
  { echo "python build failed" | tee -a "$log"; tail -30 /tmp/python_build.log | tee -a "$log"; exit 1; }
echo "built in $((SECONDS - start)) s" | tee -a "$log"

echo "== train_lm" | tee -a "$log"
PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout "${TRAIN_TIMEOUT:-380}" python3 examples/train_lm.py --device cuda \
  --time-budget "${TRAIN_BUDGET:-300}" --check-inbackward 250 --check-resume 50 --out "$OUT" \
  --ckpt-dir /tmp/train_lm_checkpoints --commit "$commit" ${TRAIN_ARGS:-} 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
echo "train_lm rc=$rc after $((SECONDS - start)) s" | tee -a "$log"
exit "$rc"
