#!/usr/bin/env bash
# For the session after 25, on branch dwtma (the dW epilogue by TMA store, docs/kernels.md "The dW
# epilogue by TMA store"): the whole GPU suite (with DwTmaStoreMatchesWarpStores, bitwise against the
# warp stores), memcheck / racecheck of that test, then dW1 and dW2 alone at the power cap
# (warp vs tma, --warm-seconds 2, two rounds) and the layer's backward with both kinds on tma against
# the default (three rounds in rotating order). Carry [".carry/dwtma"] (xz of build-device's leanmoe,
# leanmoe_gpu_tests and leanmoe_bench_gemms of the branch, and the commit). ~560 s. Returns summary.txt, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/dwtma/leanmoe.xz gt=.carry/dwtma/leanmoe_gpu_tests.xz bg=.carry/dwtma/leanmoe_bench_gemms.xz
say "dwtma $(cat .carry/dwtma/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
timeout $(cap 230) $B/gt > $L/tests.log 2>&1
say "whole GPU suite rc=$? $(grep -E '^\[ +(FAILED|PASSED) ' $L/tests.log | tr '\n' ' ') $(grep -c '^\[       OK' $L/tests.log) OK (t=$SECONDS)"
for tool in memcheck racecheck; do
  timeout $(cap 90) compute-sanitizer --tool $tool --error-exitcode 9 $B/gt --gtest_filter='ExpertGemms.DwTmaStoreMatchesWarpStores' > $L/$tool.log 2>&1
  say "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ')"
done
G=gather:coop
CFG="dw1=$G:256x128:s4:warp:c2,dw1=$G:256x128:s4:tma:c2,dw2=$G:128x256:s4:warp:c2,dw2=$G:128x256:s4:tma:c2"
for r in 1 2; do
  timeout $(cap 100) $B/bg --shape 120B-n2048,30B-n1024,olmoe-1b-7b,7B-n256 --gemms dw1,dw2 --iters 20 --warmup 3 \
    --warm-seconds 2 --config "$CFG" > $L/gemms_r$r.txt 2>&1
  say "dW alone at the cap, round $r rc=$?:"; grep -E '\| (dw1|dw2) ' $L/gemms_r$r.txt | tee -a $S
done
declare -A V=([default]="" [tma]="--gemm-config dw1=$G:256x128:s4:tma:c2,dw2=$G:128x256:s4:tma:c2")
layer_rounds 3 120B-n2048,30B-n1024 default tma
