#!/usr/bin/env bash
# Session 33, call 5: two more orders of issue in the gather kernel's producers against main 02a6828
# (p0, the varlen-K TMA after thread 0's copies): mlate (branch mlate 3df2e0e) = the varlen-M
# producer (up, dH) issues its gathered A-row copies before thread 0 arms the stage and issues the
# weight TMA; idxlate (branch idxlate 8c74598) = the varlen-K producer loads the next k-tile's
# row_token after the copies and arrive, not before the empty wait. ncu at base clocks (up, dH for
# mlate; dW1, dW2 for idxlate) at three rows, then --digest of every GEMM kind both builds change
# (bf16 and FP8 up/dH; dW1/dW2 in both layouts) at two rows: equal to main's for the same bits.
# Carry [".carry/scr"], bench/results/archive moved out of the tree. ~100 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p0=.carry/scr/bg_p0.xz mlate=.carry/scr/bg_mlate.xz idxlate=.carry/scr/bg_idxlate.xz
header .carry/scr/commit
for r in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in up dh; do for p in p0 mlate; do ncu_ms "${r}_${g}_$p" $p --shape $r --layout hf --gemms $g; done; done
  for g in dw1 dw2; do for p in p0 idxlate; do ncu_ms "${r}_${g}_$p" $p --shape $r --layout hf --gemms $g; done; done
done
digest() {  # digest NAME BIN ARGS...
  local name=$1 bin=$2; shift 2
  timeout "$(cap 60)" "$B/$bin" "$@" --digest > "$L/digest_$name.txt" 2>&1
  say "digest $name rc=$? $(grep -E '^\| ' "$L/digest_$name.txt" | grep -v '^| shape' | md5sum | cut -c1-12) (t=$SECONDS)"
}
for r in 30B-n1024 olmoe-1b-7b; do
  for p in p0 mlate; do digest "${r}_updh_$p" $p --shape $r --gemms up,dh --layout hf,transposed --precision bf16,fp8; done
  for p in p0 idxlate; do digest "${r}_dw_$p" $p --shape $r --gemms dw1,dw2 --layout hf,transposed; done
done
say "done t=$SECONDS"
