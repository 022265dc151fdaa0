#!/usr/bin/env bash
# Session 14, device call 6 (issue 16): branch fp8epi 73f3779: the FP8 layer quantizes A and dH only
# in the up / dH epilogues (no bf16 A in the forward workspace): GPU tests beside memcheck, the layer
# in bf16 and FP8 on 4 rows. Carry [".carry/s14e2", ".carry/blaslibs.tar.xz"] (= /work/wt/fp8epi2.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
W="$(mktemp -d)"; CARRY=.carry/s14e2; LAYER_ONLY=1; ROWS="30B-n256 30B-n512 120B-n512 120B-n1024"  # the other 4 FP8 rows with d >= 2048, no tests
source bench/results/archive/2026-12-04-h200-s14/fp8epi2.device.sh
echo "done (t=${SECONDS})"
