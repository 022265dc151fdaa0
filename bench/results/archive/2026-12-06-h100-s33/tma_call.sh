#!/usr/bin/env bash
# Session 33, call 2: the varlen-K stage's order of issue, four dev builds of dW's kernels against
# main (p0 = main b6916a3's leanmoe_bench_gemms): rot = the thread that arms the full barrier and
# issues the TMA multicast rotates over the 4 producer warps (QuACK's way; main: thread 0 always),
# late = that thread issues the TMA after its cp.async copies (main: before), both = rot + late,
# w0 = the consumers retire each k-tile (wgmma_wait<0>) and release its stage at once (main: one
# k-tile left in flight, wgmma_wait<1>, the one before released). Branch tmaorder, dev macros
# LEANMOE_EXP_TMA_ROT / _LATE / _W0. ncu at base clocks of dW1 and dW2 at three rows, then the
# bits: --digest of dw1,dw2 at two rows for each build (the same sums of the same products: equal to
# main's). Carry [".carry/tma"], bench/results/archive moved out of the tree. ~150 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p0=.carry/tma/bg_p0.xz rot=.carry/tma/bg_rot.xz late=.carry/tma/bg_late.xz both=.carry/tma/bg_both.xz \
  w0=.carry/tma/bg_w0.xz
header .carry/tma/commit
for r in 120B-n2048 30B-n1024 gpt-oss-20b; do
  for g in dw1 dw2; do
    for p in p0 rot late both w0; do ncu_ms "${r}_${g}_$p" $p --shape $r --layout hf --gemms $g; done
  done
done
for r in 30B-n1024 olmoe-1b-7b; do
  for p in p0 rot late both w0; do
    timeout "$(cap 60)" "$B/$p" --shape $r --gemms dw1,dw2 --layout hf,transposed --digest > "$L/digest_${r}_$p.txt" 2>&1
    say "digest $r $p rc=$? $(grep -E '^\| ' "$L/digest_${r}_$p.txt" | grep -v '^| shape' | md5sum | cut -c1-12) (t=$SECONDS)"
  done
done
say "done t=$SECONDS"
