#!/usr/bin/env bash
# Session 37, call 3: branch splitring (the varlen-K kernel with split rings: 6 stages of the gathered
# operand's k-tiles, 3 of the TMA operand's, the TMA boxes issued 3 k-tiles behind the gathered rows;
# the partial last k-tile's TMA rows past the expert zeroed by the consumers) against p0 = main
# d199b9c. ncu at base clocks of dW1 and dW2 at three rows, --digest of dW1/dW2 in both layouts at two
# rows (same bits expected), the GEMM and layer GPU tests with memcheck and racecheck on the dW tests,
# then the layer (graph, steady state, 2 rotating rounds, three rows).
# Carry [".carry/spl"], bench/results/archive moved out of the tree. BUDGET=560, ~400 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/spl/gt.xz p0=.carry/spl/bg_p0.xz spl=.carry/spl/bg_spl.xz \
  leanmoe_p0=.carry/spl/leanmoe_p0.xz leanmoe_spl=.carry/spl/leanmoe_spl.xz
header .carry/spl/commit
for r in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do for p in p0 spl; do ncu_ms "${r}_${g}_$p" $p --shape $r --layout hf --gemms $g; done; done
done
for r in 30B-n1024 olmoe-1b-7b; do
  for p in p0 spl; do digest "${r}_dw_$p" $p --shape $r --gemms dw1,dw2 --layout hf,transposed; done
done
gpu_tests 'ExpertGemms.*:LayerGemmConfigs.*:BackwardOverlap.*:CudaBackend.*:GemmConfig.*:GemmHeuristics.*' \
  'ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.WideExperts:ExpertGemms.RaggedWithEmptyExpert'
declare -A V=([p0]="" [spl]="")
layer_rounds 2 120B-n2048,30B-n1024,olmoe-1b-7b p0 spl
say "done t=$SECONDS"
