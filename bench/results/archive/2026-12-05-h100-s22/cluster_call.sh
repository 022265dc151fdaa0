#!/usr/bin/env bash
# Session 22: down and dx on every grid shape on the H100, CUTLASS's two cluster shapes (1x2: pairs of
# n-tiles sharing the A tile; 2x1: pairs of m-tiles sharing the weight tile), each along M (default)
# and along N (rN), bf16 then FP8, interleaved per shape (one leanmoe_bench_gemms call times every
# configuration in turn), 3 rounds; then ncu DRAM bytes of down and dx at 120B-n2048 for each.
# Why: session 22's sonic_ncu call found our dx reading 29.9 GB at 120B-n2048 (SonicMoE's 9.8) and
# the dx_call's 5 shapes had 2x1 7.2-7.7 ms there against 10.8 for the heuristic's 1x2.
# Carry [".carry/dx"] (branch raster's leanmoe_bench_gemms, which has rN). Returns summary.txt, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
C=${CARRY_DIR:-.carry/dx}; B=/tmp/cl; L=/tmp/cl-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-300}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
xz -dc $C/leanmoe_bench_gemms.xz > $B/bg && chmod +x $B/bg || say "MISSING bench_gemms"
source scripts/device_env.sh
say "raster $(cat $C/commit); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader)"
SHAPES="1.4B-n256 1.4B-n512 1.4B-n1024 7B-n256 7B-n512 7B-n1024 30B-n256 30B-n512 30B-n1024 120B-n512 120B-n1024 120B-n2048 olmoe-1b-7b qwen3-30b-a3b granite-3.1-3b-a800m gpt-oss-20b sparse-T16k-d4096-n1024-E256 sparse-T8k-d4096-n1024-E256 sparse-T16k-d2048-n512-E256 sparse-T32k-d4096-n512-E512"
P=cutlass:pingpong:128x192:auto
BF="down=$P:tma:c1x2,down=$P:tma:c2,down=$P:tma:c2:rN,down=$P:tma:c1x2:rN,down=$P:tma64:c1x2,dx=$P:tma:c1x2,dx=$P:tma:c2,dx=$P:tma:c2:rN,dx=$P:tma:c1x2:rN"
Q=cutlass:coop:128x128:auto:tma
F8="down=$Q:c1x2,down=$Q:c2,down=$Q:c2:rN,down=$Q:c1x2:rN,dx=$Q:c1x2,dx=$Q:c2,dx=$Q:c2:rN,dx=$Q:c1x2:rN"
for r in 1 2 3; do
  say "== round $r (t=$SECONDS)"
  for s in $SHAPES; do
    [ $((budget - SECONDS)) -lt 60 ] && break 2
    timeout $(cap 60) $B/bg --shape $s --gemms down,dx --iters 20 --warmup 5 --config "$BF" > $L/bf16_r${r}_$s.txt 2>&1
  done
  for s in $SHAPES; do
    [ $s = gpt-oss-20b ] && continue  # d = 2880 is not a multiple of 128
    [ $((budget - SECONDS)) -lt 60 ] && break 2
    timeout $(cap 60) $B/bg --shape $s --gemms down,dx --precision fp8 --iters 20 --warmup 5 --config "$F8" > $L/fp8_r${r}_$s.txt 2>&1
  done
done
say "== medians over rounds, ms (t=$SECONDS)"
python3 - $L <<'PY' | tee -a $S
import glob, os, re, statistics, sys
t = {}
for fn in sorted(glob.glob(os.path.join(sys.argv[1], "*_r*_*.txt"))):
    prec = os.path.basename(fn).split("_")[0]
    for line in open(fn):
        f = [x.strip() for x in line.split("|")]
        if len(f) > 11 and f[8] in ("down", "dx"):
            cfg = re.sub(r"^cutlass:(pingpong|coop):\d+x\d+:auto:", "", f[9]).replace(":m132", "")
            t.setdefault((prec, f[1], f[8]), {}).setdefault(cfg, []).append(float(f[10]))
for (prec, shape, g), cfgs in t.items():
    med = {c: statistics.median(v) for c, v in cfgs.items()}
    best = min(med, key=med.get)
    print(f"{prec} {shape} {g}: " + "  ".join(f"{c} {m:.3f}({len(cfgs[c])})" for c, m in med.items()) + f"  best {best}")
PY
say "== ncu 120B-n2048 down, dx: DRAM bytes (t=$SECONDS)"
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
for v in "$P:tma:c1x2" "$P:tma:c2" "$P:tma:c2:rN"; do
  [ $((budget - SECONDS)) -lt 25 ] && break
  timeout $(cap 40) ncu --clock-control none --metrics $M --csv --print-units base -k regex:device_kernel \
    $B/bg --shape 120B-n2048 --gemms down,dx --iters 1 --warmup 0 --config "down=$v,dx=$v" > $L/ncu_${v//:/_}.csv 2>&1
  python3 - $L/ncu_${v//:/_}.csv "$v" <<'PY' | tee -a $S
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if not rows: sys.exit(print("  no ncu rows"))
h = rows[0]; m, v, i = h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
per = {}
for r in rows[1:]: per.setdefault(r[i], {})[r[m]] = r[v]
print(sys.argv[2], "; ".join(f"{k}: " + ", ".join(f"{a.split('.')[0].split('__')[1]}={b}" for a, b in sorted(x.items())) for k, x in per.items()))
PY
done
say "== done (t=$SECONDS)"
