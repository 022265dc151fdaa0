#!/usr/bin/env bash
# Session 36, call 2: sdzgs with the cancellation-free sparse dz (g_e sum_k g_k (dS_e - dS_k)): the
# tests call 1 failed and the ones around them, memcheck on the router test. Carry [".carry/fix"], ~60 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/fix/gt.xz
header .carry/fix/commit
gpu_tests 'CudaBackend.*:BackwardOverlap.*:GatherSum.*' 'CudaBackend.RouterGradientWithoutBalancingLosses'
say "done t=$SECONDS"
