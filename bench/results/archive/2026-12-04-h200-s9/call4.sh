#!/usr/bin/env bash
# Session 9, device call 4 (one H200): branch transposed 93a0efd (issue 13: the gpt-oss weight layout
# on cuda): GPU tests in both layouts, memcheck/racecheck on the transposed paths, HF vs transposed
# per-GEMM and layer benches at gpt-oss-20b and 7B-n256 (call4_transposed.sh, the helper's fragment).
# Carry: .carry/tr (binaries, xz; commit), .carry/blaslibs.tar.xz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
export FINAL="${OUT:-/tmp/leanmoe-out}" W="$(mktemp -d)" CARRY=.carry/tr; mkdir -p "$FINAL"
source scripts/device_env.sh
bash "$(dirname "${BASH_SOURCE[0]}")/call4_transposed.sh"
