#!/usr/bin/env bash
# Session 12, device call 4 (issue 16): branch fp8layer's fragment (.carry/fp8layer, commit inside):
# FP8 down and dx on CUTLASS blockwise in the library, the CUDA layer FP8 path (stubs for up/dH), benches.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=fp8layer/fp8layer . 2>/dev/null' EXIT
source scripts/device_env.sh
mkdir -p "$W/fp8layer"
CARRY=.carry/fp8layer W="$W/fp8layer" FINAL="$FINAL" timeout 560 \
  bash bench/results/archive/2026-12-04-h200-s12/fp8layer.device.sh 2>&1 | tee "$W/fp8layer.log" | tail -70
echo "done (t=${SECONDS})"
