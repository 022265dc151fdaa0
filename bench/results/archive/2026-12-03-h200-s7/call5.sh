#!/usr/bin/env bash
# Session 7, device call 5 (one H200, ~5 minutes): the seed noise of call 1's train_lm comparison
# (issue 15): top-K and token rounding nearest at call 1's budget (790 steps x 32 x 1024 tokens),
# seeds 1 and 2 (call 1 was seed 0). Python front built there against the carried core (.carry/s7m).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
B=/tmp/s7m; mkdir -p $B; xz -dc .carry/s7m/libleanmoe.a.xz > $B/libleanmoe.a
commit="$(cat .carry/s7m/commit)"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 120 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
  ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
  >/tmp/python_build.log 2>&1 || { tail -20 /tmp/python_build.log; exit 1; }
for s in 1 2; do
  echo "== seed $s (t=${SECONDS})"
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 140 python3 examples/train_lm.py --device cuda --batch 32 --train-mb 120 \
    --steps 790 --runs topk,tr-nearest --seed $s --out /tmp/seed$s --ckpt-dir /tmp/ck$s --commit "$commit" >/tmp/seed$s.log 2>&1
  echo "rc=$?"; grep -E "final val loss" /tmp/seed$s.log
  cp /tmp/seed$s/results.md "$FINAL/train_seed$s.md" 2>/dev/null
done
echo "done (t=${SECONDS})"
