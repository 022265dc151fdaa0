#!/usr/bin/env bash
# Session 14, device call 4 (issue 16; its first attempt as call 3 was refused: no machine): branch fp8epi 4685116: A and dH quantized in the FP8 up / dH
# epilogues (hardware encode), selectable against the separate pass: tests, sanitizers, GEMM and
# layer benches. Carry [".carry/s14ep", ".carry/blaslibs.tar.xz"] (= /work/wt/fp8epi.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
W="$(mktemp -d)"; CARRY=.carry/s14ep
source bench/results/archive/2026-12-04-h200-s14/fp8epi.device.sh
echo "done (t=${SECONDS})"
