#!/usr/bin/env bash
# Session 13, device call 2 (issue 16): examples/train_lm.py, top-K in bf16 against the same model with
# FP8 expert GEMMs (run "fp8": leanmoe.MoE precision="fp8", weights quantized per call), seeds 0, 1, 2,
# at session 10's budget (--steps 790, h200 preset: 32 x 1024 tokens per step, 25.9 M tokens per run).
# The three seeds run as three processes at once on the one GPU (the d = 768 model leaves it mostly
# idle): losses are a function of seed and flags, the step times are not those of a run alone.
# Right after call 1 (its python front in /tmp/site); builds it again when absent.
# Carry [".carry/s13a", ".carry/blaslibs.tar.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
if ! PYTHONPATH=/tmp/site python3 -c "import leanmoe" 2>/dev/null; then
  mkdir -p /tmp/core && xz -dc .carry/s13a/libleanmoe.a.xz > /tmp/core/libleanmoe.a
  CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
    ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=/tmp/core/libleanmoe.a \
    -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 > /tmp/python_build.log 2>&1
  echo "python front built again rc=$? (t=${SECONDS})"
fi
commit="$(cat .carry/s13a/commit)"
for s in 0 1 2; do
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 500 python3 examples/train_lm.py --device cuda --steps 790 --seed $s \
    --runs topk,fp8 --out /tmp/train_s$s --ckpt-dir /tmp/ckpt_s$s --commit "$commit" > /tmp/train_s$s.log 2>&1 &
  eval "P$s=\$!"
done
for s in 0 1 2; do eval "wait \$P$s"; echo "seed $s rc=$? (t=${SECONDS})"; done
for s in 0 1 2; do cp /tmp/train_s$s/results.md "$FINAL/results_seed$s.md" 2>/dev/null; done
cp /tmp/train_s0/val_loss.png "$FINAL/val_loss_seed0.png" 2>/dev/null
tar czf "$FINAL/runs.tgz" -C /tmp train_s0 train_s1 train_s2 train_s0.log train_s1.log train_s2.log --exclude='*.pt' 2>/dev/null
for s in 0 1 2; do echo "== seed $s"; grep -E "^\| (topk|fp8) |\- fp8:" /tmp/train_s$s/results.md; tail -2 /tmp/train_s$s.log; done | tee "$FINAL/summary.txt"
echo "done (t=${SECONDS})"
