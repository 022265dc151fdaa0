#!/usr/bin/env bash
# Session 13, device call 3 (issue 16): branch fp8wgrad stage A (dW1/dW2 in FP8: transposed 128x1
# quantization + CUTLASS FP8 blockwise grouped GEMM), the fragment fp8wgrad.device.sh beside this
# script. Carry [".carry/s13wg", ".carry/blaslibs.tar.xz"] (.carry/s13wg = /work/wt/fp8wgrad.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; CARRY=.carry/s13wg
source scripts/device_env.sh
source bench/results/archive/2026-12-04-h200-s13/fp8wgrad.device.sh
echo "done (t=${SECONDS})"
