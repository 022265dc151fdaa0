#!/usr/bin/env bash
# Session 25, the last call: main's whole GPU suite of the final build (dyn back, the H100's dx rule),
# on whichever part comes. Carry [".carry/fin"] (xz of build-device's leanmoe_gpu_tests and the
# commit). Returns summary.txt, gpu_tests.log, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/fin/leanmoe_gpu_tests.xz
say "tests $(cat .carry/fin/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
timeout $(cap 280) $B/gt > $FINAL/gpu_tests.log 2>&1
say "suite rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $FINAL/gpu_tests.log | tr '\n' ' ') (t=$SECONDS)"
