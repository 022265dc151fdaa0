#!/usr/bin/env bash
# Prepared in session 15 (no GPU that session), NOT RUN yet: session 15's python changes on the GPU
# (transformers "leanmoe_fp8" with the weights' codes on the routed operators; branch breakit's 17
# fixes): pytest's cuda-parametrized tests with the front built in session 15 against torch
# 2.11.0+cu130 (s15py.device.sh, ~3 min), then bench/torch_fp8_step.py against s14 call 2 (~2 min). Carry [".carry/s15py", ".carry/blaslibs.tar.xz"]
# (= /work/wt/s15py.carry, 8 MB). If main's python/ changed since d78af67, rebuild the front first
# (the .so is torch-ABI only: /tmp/v211's torch 2.11, `pip install --no-build-isolation --target`).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
export FINAL
W="$(mktemp -d)" CARRY=.carry/s15py timeout -k 5 590 bash -c "source bench/results/archive/2026-12-04-cpu-s15/s15py.device.sh"
echo "s15py fragment rc=$? (t=${SECONDS})"
