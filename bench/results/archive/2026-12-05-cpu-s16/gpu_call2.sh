#!/usr/bin/env bash
# Prepared in session 16 (no GPU), NOT RUN yet: the python front on cuda with sessions 15-16's python
# (s16py.device.sh, ~5-6 min). Carry [".carry/s16py", ".carry/blaslibs.tar.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
export FINAL
W="$(mktemp -d)" CARRY=.carry/s16py timeout -k 5 590 bash -c "source bench/results/archive/2026-12-05-cpu-s16/s16py.device.sh"
echo "s16py fragment rc=$? (t=${SECONDS})"
