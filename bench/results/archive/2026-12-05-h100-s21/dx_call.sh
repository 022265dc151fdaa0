#!/usr/bin/env bash
# Prepared in session 21 (not run): why is dx slow on the H100, and does CUTLASS's tile order along N
# (GemmConfig rN, branch raster: bench/results/archive/2026-12-05-h100-s21/raster.patch) change it?
# Session 21's ncu of one 120B-n2048 layer on an H100 (pdl_ab/): dx 9.77 ms = 450 TFLOP/s while
# up, dW1 and dW2 ran at 645-657 and down at 583; on the H200 at base clocks dx was 6.44 ms (683).
# Carry [".carry/dx"] holding leanmoe_bench_gemms.xz and leanmoe_gpu_tests.xz built from branch
# raster (sm_90a), and commit. Most needed first (a cut call keeps what it wrote):
#   1. the GPU tests of the new field (CutlassTilesAlongN: down and dx with rN against the CPU loops,
#      every compiled config, both layouts) and of every activation (main's act::backward returning a,
#      c68ba98, first run on a GPU here), memcheck on CutlassTilesAlongN;
#   2. digests: rN must give bit for bit the default's outputs (a tile's math does not depend on when
#      it runs), for down and dx on five shapes;
#   3. down and dx: default, rN, the other compiled cluster shape (1x2 <-> 2x1) and that with rN,
#      alternating, 3 rounds, five shapes (CUDA events, median of 20 launches);
#   4. ncu on up, down and dx alone at 120B-n2048 (default, rN): time, SM clock, DRAM bytes, L2 hit
#      rate, tensor pipe activity: is dx DRAM-bound or clock-bound on this part? (H100/H200 dx time
#      1.48 = about their DRAM bandwidth ratio 4.8/3.35 = 1.43: the lead to test.)
# BUDGET seconds in all (default 540). Returns summary.txt (also on stdout) and logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
C=.carry/dx; B=/tmp/dx; L=/tmp/dx-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-540}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
for f in leanmoe_bench_gemms leanmoe_gpu_tests; do xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f || say "MISSING $f"; done
source scripts/device_env.sh
say "raster $(cat $C/commit); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader)"
SHAPES="120B-n2048 30B-n1024 olmoe-1b-7b gpt-oss-20b 7B-n256"

say "== 1. tests (t=$SECONDS)"
F='ExpertGemms.CutlassTilesAlongN:ExpertGemms.EveryActivationLayoutAndBias:ExpertGemms.GptOssExpertFunction:ExpertGemms.DeepSeekV4ExpertFunction:CudaBackend.EveryActivationBiasAndLayout:GemmConfig.*:GemmHeuristics.*'
timeout $(cap 150) $B/leanmoe_gpu_tests --gtest_brief=1 --gtest_filter="$F" > $L/tests.log 2>&1
say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/tests.log | tr '\n' ' ')"
timeout $(cap 120) compute-sanitizer --tool memcheck --error-exitcode 9 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter=ExpertGemms.CutlassTilesAlongN > $L/memcheck.log 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/memcheck.log | tr '\n' ' ')"

# The heuristic's down and dx configs per shape (the kernel column of a default run), and the same with rN.
configs() {  # shape variant -> "down=...,dx=...": rN inserted before :m; other: the other cluster (c1x2 <-> c2)
  python3 - "$L/default_$1.txt" "$2" <<'PY'
import sys
cfg = {}
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split("|")]
    if len(f) > 10 and f[8] in ("down", "dx"): cfg[f[8]] = f[9]
def vary(c, v):
    if "other" in v:
        c = c.replace(":tma64:", ":tma:")  # tma64 is compiled for 1x2 alone
        c = c.replace(":c1x2:", ":c2:") if ":c1x2:" in c else c.replace(":c2:", ":c1x2:")
    return c.replace(":m", ":rN:m") if "rn" in v else c
print(",".join(f"{k}={vary(v, sys.argv[2])}" for k, v in sorted(cfg.items())))
PY
}
say "== 2. digests, default vs rN (t=$SECONDS)"
for s in $SHAPES; do
  timeout $(cap 60) $B/leanmoe_bench_gemms --shape $s --gemms down,dx --iters 3 --warmup 1 > $L/default_$s.txt 2>&1
  for v in rn other other_rn; do configs $s $v > $L/${v}_$s.txt; done; rn="$(cat $L/rn_$s.txt)"
  timeout $(cap 60) $B/leanmoe_bench_gemms --shape $s --gemms down,dx --digest > $L/digest_default_$s.txt 2>&1
  timeout $(cap 60) $B/leanmoe_bench_gemms --shape $s --gemms down,dx --digest --config "$rn" > $L/digest_rn_$s.txt 2>&1
  a="$(grep -E '^\| ' $L/digest_default_$s.txt | awk -F'|' 'NR>1{print $4, $6}')"
  b="$(grep -E '^\| ' $L/digest_rn_$s.txt | awk -F'|' 'NR>1{print $4, $6}')"
  [ -n "$a" ] && [ "$a" = "$b" ] && say "$s digests IDENTICAL ($rn)" || { say "$s digests DIFFER or missing ($rn)"; echo "$a" | tee -a $S; echo "$b" | tee -a $S; }
done

say "== 3. down and dx (ms, TFLOP/s): default, rN, the other cluster shape, both (configs: rn_/other_/other_rn_SHAPE.txt in the logs); alternating, 3 rounds (t=$SECONDS)"
orders=("default rn other other_rn" "other_rn other rn default" "rn default other_rn other")
for r in 1 2 3; do for s in $SHAPES; do
  for v in ${orders[$((r-1))]}; do
    [ $((budget - SECONDS)) -lt 90 ] && break 3
    extra=(); [ $v != default ] && extra=(--config "$(cat $L/${v}_$s.txt)")
    timeout $(cap 60) $B/leanmoe_bench_gemms --shape $s --gemms down,dx --iters 20 --warmup 5 "${extra[@]}" > $L/bench_r${r}_${s}_$v.txt 2>&1
    say "r$r $s $v $(awk -F'|' '$9 ~ /down|dx/ {gsub(/ /, "", $9); gsub(/ /, "", $11); gsub(/ /, "", $12); printf "%s %s ms %s; ", $9, $11, $12}' $L/bench_r${r}_${s}_$v.txt)"
  done
done; done

say "== 4. ncu, up, down and dx alone at 120B-n2048 (t=$SECONDS)"
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
for v in default rn; do
  [ $((budget - SECONDS)) -lt 40 ] && break
  extra=(); [ $v = rn ] && extra=(--config "$(cat $L/rn_120B-n2048.txt)")
  timeout $(cap 90) ncu --clock-control none --metrics $M --csv --print-units base -k regex:'device_kernel|gather_grouped' \
    $B/leanmoe_bench_gemms --shape 120B-n2048 --gemms up,down,dx --iters 1 --warmup 0 "${extra[@]}" > $L/ncu_$v.csv 2> $L/ncu_$v.err
  say "ncu $v rc=$?"
  python3 - $L/ncu_$v.csv <<'PY' | tee -a $S
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if not rows: sys.exit(print("  no ncu rows"))
h = rows[0]; k, m, v, i = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
per = {}
for r in rows[1:]: per.setdefault((r[i], r[k][:60]), {})[r[m]] = r[v]
for (kid, name), ms in per.items(): print(f"  {kid} {name}: " + ", ".join(f"{a.split('.')[0].split('__')[1]}={b}" for a, b in sorted(ms.items())))
PY
done
say "== done (t=$SECONDS)"
