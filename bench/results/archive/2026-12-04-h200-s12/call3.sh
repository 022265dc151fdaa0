#!/usr/bin/env bash
# Session 12, device call 3 (issue 16): branch fp8gather's fragment (.carry/fp8gather, commit inside):
# the FP8 gather kernel for up and dH, its tests, sanitizers and fp8-vs-bf16 benches.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=fp8gather/fp8gather . 2>/dev/null' EXIT
source scripts/device_env.sh
mkdir -p "$W/fp8gather"
CARRY=.carry/fp8gather W="$W/fp8gather" FINAL="$FINAL" timeout 500 \
  bash bench/results/archive/2026-12-04-h200-s12/fp8gather.device.sh 2>&1 | tee "$W/fp8gather.log" | tail -70
echo "done (t=${SECONDS})"
