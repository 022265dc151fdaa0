#!/usr/bin/env bash
# Session 12, device call 1 (issue 17): branch downtma's fragment (.carry/downtma, commit inside): the
# ping-pong 64x256-per-warpgroup schedule for down/dx on the gather kernel (A by TMA), never run before,
# beside the cooperative one and CUTLASS's default; tests and sanitizers (downtma.device.sh says what).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=downtma/downtma . 2>/dev/null' EXIT
source scripts/device_env.sh
mkdir -p "$W/downtma"
CARRY=.carry/downtma W="$W/downtma" FINAL="$FINAL" timeout 560 \
  bash bench/results/archive/2026-12-04-h200-s12/downtma.device.sh 2>&1 | tee "$W/downtma.log" | tail -60
echo "done (t=${SECONDS})"
