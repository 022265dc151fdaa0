#!/usr/bin/env bash
# Session 9, device call 1 (one H200): branch bwdoverlap (backward's dW2/dx/dW1 on a high-priority
# GEMM stream beside the router chain and the dx gather-sum): its GPU tests, compute-sanitizer on
# the overlap tests, and `leanmoe bench --bwd-overlap off|0|4|8|16` at four shapes, two rounds
# (call1_bwdoverlap.sh, the helper's fragment). Carry: .carry/bwd (its binaries, xz; commit),
# .carry/blaslibs.tar.xz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
export FINAL="${OUT:-/tmp/leanmoe-out}" W="$(mktemp -d)" CARRY=.carry/bwd; mkdir -p "$FINAL"
source scripts/device_env.sh
bash "$(dirname "${BASH_SOURCE[0]}")/call1_bwdoverlap.sh"
