#!/usr/bin/env bash
# Session 9, device call 2 (one H200): branch tiles' dev/cutlass_tiles bench (15 CUTLASS grouped-GEMM
# variants for down and dx on the 20 grid shapes, memcheck of each; call2_tiles.sh, the helper's
# fragment). Carry: .carry/tiles (the bench binary, xz).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
export FINAL="${OUT:-/tmp/leanmoe-out}" W="$(mktemp -d)" CARRY=.carry/tiles; mkdir -p "$FINAL"
bash "$(dirname "${BASH_SOURCE[0]}")/call2_tiles.sh"
