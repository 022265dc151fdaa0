#!/usr/bin/env bash
# Session 13, device call 8 (issue 16): the FP8 copy's argument check with its message built as plain
# strings (python/csrc/ops.cpp fp8_copy_of; calls 6-7 crashed there), and the FP8 python tests again.
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
PT="python3 -m pytest -q -rfEs -p no:cacheprovider"
(cd /tmp && PYTHONPATH="$W/site" timeout 60 $PT "$R/python/tests/test_fp8.py::test_code_arguments_are_checked") > "$FINAL/tests_args.log" 2>&1
echo "args test rc=$? (t=${SECONDS})"; tail -2 "$FINAL/tests_args.log"
(cd /tmp && PYTHONPATH="$W/site" timeout 200 $PT "$R/python/tests/test_fp8.py" "$R/python/tests/test_optim.py" \
   "$R/python/tests/test_compile.py" -k "fp8 or cuda") > "$FINAL/tests.log" 2>&1
echo "pytest rc=$? (t=${SECONDS})"; grep -E "passed|failed" "$FINAL/tests.log" | tail -1; grep -E "^(FAILED|ERROR|SKIPPED)" "$FINAL/tests.log" | head
echo "done (t=${SECONDS})"
