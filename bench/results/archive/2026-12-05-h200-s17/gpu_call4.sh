#!/usr/bin/env bash
# Session 17, device call 4: the python front on the H200 (torch 2.11.0+cu130, transformers 5.17 there),
# built here against torch 2.11.0+cu130 from PyPI and main's CUDA core (carry .carry/s17py/site.tar.xz;
# commit in .carry/s17py/commit). The whole python suite, CPU and cuda tests: the python changes of
# sessions 15-17 (FP8 HF experts, the training-loop fixes, DDP, GradScaler, DeepSeek-V4's clamped
# SwiGLU) had run on the CPU only. Returns pytest.log; the tail on stdout. Cap 420 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
SITE=/tmp/s17site; rm -rf $SITE; mkdir -p $SITE; tar xJf .carry/s17py/site.tar.xz -C $SITE
echo "front $(cat .carry/s17py/commit); $(python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
R="$PWD"
(cd /tmp && PYTHONPATH=$SITE timeout 420 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider --maxfail=30 \
   "$R/python/tests") > $FINAL/pytest.log 2>&1
echo "pytest rc=$? (t=$SECONDS)"
grep -E "passed|failed|error" $FINAL/pytest.log | tail -5
grep -E "^(FAILED|ERROR)" $FINAL/pytest.log | head -30
