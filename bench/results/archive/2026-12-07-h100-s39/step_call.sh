#!/usr/bin/env bash
# s39: branch stepi = main 1dc1c49 + two independent experiments, each on its own kernels:
#  - dW1 / dW2 (varlen-K): the epilogue stages the tile's dW in a pipeline stage of its own (one
#    pseudo-item per tile in the producer's stream, nothing loaded into it) plus two of the three
#    staging tiles, and releases it after the next tile's first wgmmas are issued, once its TMA stores
#    have read it: the epilogue waits on no store (main: a 3-deep ring per warp, each chunk waiting for
#    the store three back to have read its tile);
#  - up / dH (varlen-M): the gathered A-row copies with the L2::256B prefetch-size hint (s37's l2hint.patch).
# GEMM suite + memcheck/racecheck on the dW tests; ncu at base clocks main (bg_p0: main a4c811a's
# leanmoe_bench_gemms, the kernels of main 1dc1c49) against stepi; output digests; the layer (graph,
# steady state, 2 rotating rounds) main (leanmoe_p0: 91330d1, the same kernels) against stepi.
# Run as .carry/stepi/step_call.sh (this copy: the same from here), carry [".carry/stepi"] with
# bench/results/archive moved out (59 MiB of binaries); BUDGET=400 in s39 call 1 (262 s).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/stepi/gt.xz bg=.carry/stepi/bg.xz bg_p0=.carry/stepi/bg_p0.xz leanmoe=.carry/stepi/leanmoe.xz \
  leanmoe_p0=.carry/stepi/leanmoe_p0.xz
header .carry/stepi/commit
for g in dw1 dw2; do for b in bg_p0 bg; do ncu_ms "120B-n2048_${g}_$b" $b --shape 120B-n2048 --layout hf --gemms $g; done; done
for b in bg_p0 bg; do digest "30B-n1024_$b" $b --shape 30B-n1024 --gemms up,dh,dw1,dw2 --layout hf,transposed; done
gpu_tests 'ExpertGemms.*:LayerGemmConfigs.*:BackwardOverlap.*:GemmConfig.*:GemmHeuristics.*' \
  'ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights:ExpertGemms.RaggedWithEmptyExpert'
for g in up dh; do for b in bg_p0 bg; do ncu_ms "120B-n2048_${g}_$b" $b --shape 120B-n2048 --layout hf --gemms $g; done; done
for g in dw1 dw2 up; do for b in bg_p0 bg; do ncu_ms "gpt-oss-20b_${g}_$b" $b --shape gpt-oss-20b --layout hf --gemms $g; done; done
declare -A V=([p0]="" [stepi]="")
mv "$B/leanmoe" "$B/leanmoe_stepi"
layer_rounds 2 120B-n2048,gpt-oss-20b p0 stepi
for b in bg_p0 bg; do digest "olmoe-1b-7b_$b" $b --shape olmoe-1b-7b --gemms up,dh,dw1,dw2 --layout hf,transposed; done
say "done t=$SECONDS"
