#!/usr/bin/env bash
# Branch pdl split: base (main's kernels), new (pdl: every gather kernel and the forward chain chained),
# noup (pdl with the up-projection's gather kernel launched as an ordinary launch), alternating,
# graph replays, 3 rounds on 120B-n2048 and 30B-n1024; then ncu per-kernel times (serialised: no
# launch overlap, so a kernel's own time) of base and new at 120B-n2048. Carry [".carry/pdl"].
# BUDGET seconds in all (default 420). Returns summary.txt (also on stdout) and logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
C=.carry/pdl; B=/tmp/pdl; L=/tmp/pdl-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-420}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
for f in leanmoe_new leanmoe_base leanmoe_noup; do xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f || say "MISSING $f"; done
source scripts/device_env.sh
say "new $(cat $C/commit), base $(cat $C/commit_base), noup = new with up unchained; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
orders=("base new noup" "noup base new" "new noup base")
for r in 1 2 3; do for c in 120B-n2048 30B-n1024; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for v in ${orders[$((r-1))]}; do
    [ $((budget - SECONDS)) -lt 40 ] && break 3
    timeout $(cap 40) $B/leanmoe_$v bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
      --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
    say "r$r $c $v rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print(f\"fwd_graph {r['fwd_graph_ms']:.3f} bwd_graph {r['bwd_graph_ms']:.3f} fwd {r['fwd_ms']:.3f} bwd {r['bwd_ms']:.3f}\")" $L/layer_r${r}_${c}_$v.json 2>&1 | tail -1) (t=$SECONDS)"
  done
done; done
python3 - $L <<'PY' | tee -a $S
import json, glob, os, statistics, sys
runs = {}
for p in glob.glob(os.path.join(sys.argv[1], "layer_r*.json")):
    _, c, v = os.path.basename(p)[:-5].split("_", 2)
    try: r = json.load(open(p))["results"][0]
    except Exception: continue
    runs.setdefault((c, v), []).append((r["fwd_graph_ms"], r["bwd_graph_ms"]))
for (c, v), xs in sorted(runs.items()):
    print(f"median {c} {v}: fwd_graph {statistics.median(x[0] for x in xs):.3f} bwd_graph {statistics.median(x[1] for x in xs):.3f} (n={len(xs)})")
PY
for v in base new; do
  [ $((budget - SECONDS)) -lt 50 ] && break
  timeout $(cap 60) ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $B/leanmoe_$v bench --config 120B-n2048 --router topk_then_softmax --iters 1 --warmup 1 > $L/ncu_$v.csv 2> $L/ncu_$v.err
  say "ncu $v rc=$? (t=$SECONDS)"
done
python3 dev/ncu_kernel_times.py --side-by-side base=$L/ncu_base.csv new=$L/ncu_new.csv 2>&1 | tee -a $S | tail -40
say "== done (t=$SECONDS)"
