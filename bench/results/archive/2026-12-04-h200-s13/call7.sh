#!/usr/bin/env bash
# Session 13, device call 7 (issue 16): where test_fp8.py::test_code_arguments_are_checked segfaults on
# the H200 (calls 5, 6; it passes on CPU-only machines with torch 2.11 and 2.15): the test under gdb,
# backtrace of the crashing thread; and test_fp8_on_cuda_matches_cpu with its MoEOutput fix.
# Carry [".carry/s13ft", ".carry/blaslibs.tar.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; R="$PWD"
source scripts/device_env.sh
xz -dc .carry/s13ft/libleanmoe.a.xz > "$W/libleanmoe.a"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 python3 -m pip install -q --no-build-isolation --no-deps --target "$W/site" \
  ./python -Ccmake.define.LEANMOE_CORE_LIBRARY="$W/libleanmoe.a" -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
  > "$W/build.log" 2>&1; echo "python build rc=$? (t=${SECONDS})"
(cd /tmp && PYTHONPATH="$W/site" timeout 60 python3 -m pytest -q -rfE -p no:cacheprovider "$R/python/tests/test_fp8.py::test_fp8_on_cuda_matches_cpu") > "$FINAL/cuda_vs_cpu.log" 2>&1
echo "cuda vs cpu rc=$? (t=${SECONDS})"; tail -2 "$FINAL/cuda_vs_cpu.log"
if command -v gdb >/dev/null; then
  (cd /tmp && PYTHONPATH="$W/site" timeout 120 gdb -q -batch -ex run -ex bt -ex "info sharedlibrary leanmoe" --args python3 -m pytest -q -p no:cacheprovider \
    "$R/python/tests/test_fp8.py::test_code_arguments_are_checked") > "$FINAL/gdb.log" 2>&1
  echo "gdb rc=$?"; grep -E "^#[0-9]+ " "$FINAL/gdb.log" | head -30
else
  echo "no gdb"; (cd /tmp && PYTHONPATH="$W/site" python3 -X faulthandler -c "
import torch, leanmoe
from leanmoe import _fp8_codes
m = leanmoe.MoE(256, 128, 4, 2, precision='fp8', dtype=torch.bfloat16)
codes = _fp8_codes.codes_for_call(m)
p = m.down_proj.detach().clone()
st = (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32))
h = (1e-3, 0.9, 0.999, 0.01, 1e-8)
for name, args in [('no copy', (None, 'leanmoe')), ('good copy', (None, 'leanmoe', codes[4:])), ('bad copy', (None, 'leanmoe', codes[:4]))]:
    print(name, flush=True)
    try: torch.ops.leanmoe.adamw_step_(p, torch.randn_like(p), *st, torch.zeros(()), *h, *args); print(' ok', flush=True)
    except Exception as e: print(' ', type(e).__name__, str(e)[:200], flush=True)
") > "$FINAL/probe.log" 2>&1; tail -12 "$FINAL/probe.log"
fi
echo "done (t=${SECONDS})"
