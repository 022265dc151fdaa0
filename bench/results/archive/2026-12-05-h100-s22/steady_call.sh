#!/usr/bin/env bash
# Session 22, after a SETUP call on the same warm machine: the new heuristic (bf16 dx and down in 2x1
# clusters along N on parts under 30 GB/s of DRAM per SM) on the GPU:
#   1. GPU tests of the kernels it picks and of the heuristic (CutlassTilesAlongN: down and dx along N
#      against the CPU loops), memcheck on CutlassTilesAlongN;
#   2. SonicMoE beside leanmoe (new), graph replays, one steady round (bench/vs_sonic.sh STEADY=1),
#      where a SETUP call left SonicMoE on this machine;
#   3. old (4e0f7fb) vs new leanmoe layer, graph replays, alternating rounds, with what is left.
# Carry [".carry/vs", ".carry/s22"] (.carry/vs by scripts/prepare_carry.sh vs-sonic at the new commit;
# .carry/s22: leanmoe_old.xz, leanmoe_gpu_tests.xz, leanmoe_bench_gemms.xz, commit). BUDGET seconds (default 560).
# Returns summary.txt, logs.tar.gz and vs_sonic's files under vs/.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
C=.carry/s22; B=/tmp/s22; L=/tmp/s22-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-560}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
xz -dc $C/leanmoe_gpu_tests.xz > $B/gpu_tests && xz -dc $C/leanmoe_old.xz > $B/leanmoe_old && xz -dc .carry/vs/leanmoe.xz > $B/leanmoe_new &&
  chmod +x $B/* || say "MISSING binaries"
source scripts/device_env.sh
say "$(tr '\n' ' ' < $C/commit); vs $(cat .carry/vs/commit); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"

say "== 1. tests (t=$SECONDS)"
F='ExpertGemms.CutlassTilesAlongN:ExpertGemms.TileBands:GemmConfig.*:GemmHeuristics.*:CudaBackend.EveryActivationBiasAndLayout'
timeout $(cap 120) $B/gpu_tests --gtest_brief=1 --gtest_filter="$F" > $L/tests.log 2>&1
say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/tests.log | tr '\n' ' ')"
timeout $(cap 60) compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu_tests --gtest_brief=1 \
  --gtest_filter=ExpertGemms.CutlassTilesAlongN:ExpertGemms.TileBands > $L/memcheck.log 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/memcheck.log | tr '\n' ' ')"
if [ -d /tmp/site/sonicmoe ]; then
  say "== 2. beside SonicMoE (t=$SECONDS)"
  mkdir -p $FINAL/vs
  OUT=$FINAL/vs SONIC_CARRY=/tmp/sonic_carry STEADY=1 ROUNDS=1 CONFIGS=${ROWS} timeout $(cap 330) bash bench/vs_sonic.sh > $L/vs_sonic.log 2>&1
  say "vs_sonic rc=$?"; tail -40 $L/vs_sonic.log | grep -E '^\|' | tee -a $S
else
  say "== 2. SonicMoE not set up on this machine: skipped"
fi

say "== 2b. dW1 and dW2 tile bands (row units walked together; b1 = the default order), 2 rounds (t=$SECONDS)"
xz -dc $C/leanmoe_bench_gemms.xz > $B/bg && chmod +x $B/bg
G="gather:coop"; BANDS="dw1=$G:256x128:s4:warp:c2:b1,dw1=$G:256x128:s4:warp:c2:b2,dw1=$G:256x128:s4:warp:c2:b4,dw1=$G:256x128:s4:warp:c2:b8,dw1=$G:256x128:s4:warp:c2:b16"
BANDS="$BANDS,dw2=$G:128x256:s4:warp:c2:b1,dw2=$G:128x256:s4:warp:c2:b2,dw2=$G:128x256:s4:warp:c2:b4,dw2=$G:128x256:s4:warp:c2:b8,dw2=$G:128x256:s4:warp:c2:b16"
for r in 1 2; do for s in 120B-n2048 30B-n1024 gpt-oss-20b olmoe-1b-7b 7B-n256 sparse-T16k-d4096-n1024-E256; do
  [ $((budget - SECONDS)) -lt 200 ] && break 2
  timeout $(cap 40) $B/bg --shape $s --gemms dw1,dw2 --iters 10 --warmup 3 --config "$BANDS" > $L/band_r${r}_$s.txt 2>&1
done; done
python3 - $L <<'PY' | tee -a $S
import glob, os, re, statistics, sys
t = {}
for fn in sorted(glob.glob(os.path.join(sys.argv[1], "band_r*_*.txt"))):
    for line in open(fn):
        f = [x.strip() for x in line.split("|")]
        if len(f) > 11 and f[8] in ("dw1", "dw2"):
            t.setdefault((f[1], f[8]), {}).setdefault(re.search(r":b\d+", f[9]).group(0)[1:], []).append(float(f[10]))
for (shape, g), cfgs in t.items():
    med = {c: statistics.median(v) for c, v in cfgs.items()}
    print(f"{shape} {g}: " + "  ".join(f"{c} {m:.3f}" for c, m in med.items()) + f"  best {min(med, key=med.get)}")
PY
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
for b in 1 4; do
  [ $((budget - SECONDS)) -lt 180 ] && break
  timeout $(cap 40) ncu --clock-control none --metrics $M --csv --print-units base -k regex:gather_grouped \
    $B/bg --shape 120B-n2048 --gemms dw1,dw2 --iters 1 --warmup 0 --config "dw1=$G:256x128:s4:warp:c2:b$b,dw2=$G:128x256:s4:warp:c2:b$b" > $L/ncu_band$b.csv 2>&1
  say "ncu b$b: $(python3 -c "
import csv,sys
rows=list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('\"')))
h=rows[0]; m,v,i=h.index('Metric Name'),h.index('Metric Value'),h.index('ID'); per={}
for r in rows[1:]: per.setdefault(r[i],{})[r[m].split('.')[0]]=r[v]
print('; '.join(k+': '+', '.join(a+'='+b for a,b in sorted(x.items())) for k,x in per.items()))" $L/ncu_band$b.csv 2>&1 | tail -1)"
done

if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  # On an H200 the heuristic is unchanged (37 GB/s per SM): re-measure the cluster grid there instead.
  say "== 3. H200: cluster_call.sh instead of the layer A/B (t=$SECONDS)"
  CARRY_DIR=$C OUT=$FINAL/cluster BUDGET=$((budget - SECONDS - 10)) bash bench/results/archive/2026-12-05-h100-s22/cluster_call.sh > $L/cluster.log 2>&1
  grep -E '^(bf16|fp8) .*(120B|30B-n1024|gpt-oss|olmoe|sparse-T8k)' $FINAL/cluster/summary.txt | tee -a $S
  say "== done (t=$SECONDS)"; exit 0
fi
say "== 3. old vs new layer (t=$SECONDS)"
orders=("old new" "new old" "old new")
for r in 1 2 3; do for c in ${AB_ROWS:-120B-n2048 30B-n1024 gpt-oss-20b olmoe-1b-7b}; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for v in ${orders[$((r-1))]}; do
    [ $((budget - SECONDS)) -lt 30 ] && break 3
    timeout $(cap 40) $B/leanmoe_$v bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
      --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
  done
done; done
python3 - $L <<'PY' | tee -a $S
import json, glob, os, statistics, sys
runs = {}
for p in glob.glob(os.path.join(sys.argv[1], "layer_r*.json")):
    _, _, c, v = os.path.basename(p)[:-5].split("_")  # layer_rR_CONFIG_VARIANT
    try: r = json.load(open(p))["results"][0]
    except Exception: continue
    runs.setdefault((c, v), []).append((r["fwd_graph_ms"], r["bwd_graph_ms"]))
for (c, v), xs in sorted(runs.items()):
    print(f"{c} {v}: fwd_graph {' '.join(f'{x[0]:.3f}' for x in xs)} bwd_graph {' '.join(f'{x[1]:.3f}' for x in xs)} median {statistics.median(x[0] for x in xs):.3f} / {statistics.median(x[1] for x in xs):.3f}")
PY
say "== done (t=$SECONDS)"
