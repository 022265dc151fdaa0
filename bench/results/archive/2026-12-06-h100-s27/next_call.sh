#!/usr/bin/env bash
# Prepared in session 27, not run (no device time left). One call, ~420 s:
# (a) what the gathered rows' scattered addresses cost: the gather kernels (up, dH, dW2, dW1) alone
#     under uniform routing and `--routing contiguous` (each expert's rows runs of consecutive tokens);
# (b) branch k32q2 (main bab27fc + the 32-deep varlen-K k-tiles in 8 stages, now keeping two of them
#     in flight, wgmma_wait<2>: the 64 rows of MMAs a 64-deep tile queues, with 5 stages of 24 KB left
#     to the producer instead of 2 of 48): its tests, memcheck and racecheck on the s8 kernels, then
#     dW alone s4 vs s8 and, if s8 wins somewhere, the layer. s27 call 4 lost 10-19% with one 32-deep
#     k-tile in flight; this asks whether the queue depth or the per-k-tile cost was the loss.
# Carry [".carry/k32q2"] (leanmoe, leanmoe_bench_gemms, leanmoe_gpu_tests of branch k32q2, xz, and
# commit): `git worktree add ../k32wt k32q2`, build there as scripts/prepare_carry.sh does, xz -6 the
# three binaries.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/k32q2/leanmoe_gpu_tests.xz bg=.carry/k32q2/leanmoe_bench_gemms.xz leanmoe=.carry/k32q2/leanmoe.xz
say "next $(cat .carry/k32q2/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
for pass in 1 2; do  # the routings by turns
  for r in uniform contiguous; do
    gemm_rounds 1 "routing_${r}_$pass" --shape 120B-n2048,gpt-oss-20b,olmoe-1b-7b --gemms dw2,up,dh,dw1 --routing $r \
      --iters 20 --warmup 3 --warm-seconds 2
  done
done
gpu_tests 'ExpertGemms*:GemmHeuristics.*:GemmConfig*' 'ExpertGemms/DwConfig.RaggedAndFewCtas/*s8*'
G=gather:coop
A1=$G:256x128:s4:tma:c2; B1=$G:256x128:s8:tma:c2; A2=$G:128x256:s4:tma:c2; B2=$G:128x256:s8:tma:c2
gemm_rounds 2 dw --shape 120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b --gemms dw1,dw2 --iters 20 --warmup 3 \
  --warm-seconds 2 --config "dw1=$A1,dw1=$B1,dw2=$A2,dw2=$B2"
declare -A V=([s4]="" [s8]="--gemm-config dw1=$B1,dw2=$B2")
[ $((budget - SECONDS)) -gt 60 ] && layer_rounds 2 120B-n2048,30B-n1024 s4 s8
say "done t=$SECONDS"
