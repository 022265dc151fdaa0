#!/usr/bin/env bash
# Session 10, device call 4 (one H200, at most 10 minutes), leanmoe main (commit in .carry/s10a), python
# front built there (issue 15): train_lm seed 2, top-K, in-backward and token rounding up and down at call 3's budget
# (790 steps x 32 x 1024 tokens), with the in-backward twin check over 200 steps and the resume check
# over 20; then seed 1 token rounding nearest, to check that seed 1's runs at this commit repeat those of
# session 7 (89064672; top-K repeated to the last digit in call 3).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
source scripts/device_env.sh
B=/tmp/s10a; mkdir -p $B; xz -dc .carry/s10a/libleanmoe.a.xz > $B/libleanmoe.a
commit="$(cat .carry/s10a/commit)"; echo "commit $commit"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
  ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
  >"$W/python_build.log" 2>&1 || { tail -20 "$W/python_build.log"; exit 1; }
echo "== seed 2 (t=${SECONDS})"
PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 400 python3 examples/train_lm.py --device cuda --batch 32 --train-mb 120 \
  --steps 790 --runs topk,in-backward,tr-up,tr-down --seed 2 --check-inbackward 200 --check-resume 20 --out "$W/seed2" \
  --ckpt-dir /tmp/ck2 --commit "$commit" >"$W/seed2.log" 2>&1; echo "rc=$?"
grep -E "final val loss|PASS|FAIL|bitwise|resume" "$W/seed2.log" | tail -12; cp "$W/seed2/results.md" "$FINAL/train_seed2.md" 2>/dev/null
if [ $SECONDS -lt 500 ]; then
  echo "== seed 1 nearest (t=${SECONDS})"
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout $((590 - SECONDS)) python3 examples/train_lm.py --device cuda --batch 32 \
    --train-mb 120 --steps 790 --runs tr-nearest --seed 1 --out "$W/seed1n" --ckpt-dir /tmp/ck1 --commit "$commit" \
    >"$W/seed1n.log" 2>&1; echo "rc=$?"; grep -E "final val loss" "$W/seed1n.log"
fi
echo "done (t=${SECONDS})"
