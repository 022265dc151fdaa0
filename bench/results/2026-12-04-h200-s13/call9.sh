#!/usr/bin/env bash
# Session 13, device call 9 (issue 16): branch fp8wgrad ac7cb1e (hardware e4m3 convert, rewritten column pass) (dW1/dW2 in FP8: transposed 128x1
# quantization + CUTLASS FP8 blockwise grouped GEMM), the fragment fp8wgrad2.device.sh beside this
# script. Carry [".carry/s13wg2", ".carry/blaslibs.tar.xz"] (.carry/s13wg2 = /work/wt/fp8wgrad.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; CARRY=.carry/s13wg2
source scripts/device_env.sh
source bench/results/2026-12-04-h200-s13/fp8wgrad2.device.sh
echo "done (t=${SECONDS})"
