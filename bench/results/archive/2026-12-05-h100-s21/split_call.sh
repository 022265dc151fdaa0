#!/usr/bin/env bash
# Prepared in session 21 (not run): which chained boundary gives the backward its 5% (docs/kernels.md
# "Kernel boundaries")? base (58d1ec6's kernels, no chaining), main (504c1ad: every kernel but up's and
# CUTLASS's chained), nogemm (main with no gather kind chained: only the routing kernels,
# fill_group_args and the gather-sums are), nofill (main with fill_group_args and the gather-sums
# ordinary launches), alternating, graph replays, 3 rounds on 120B-n2048 and 30B-n1024. The variants
# are main with one line changed each (chained_gather_launch returning false; launch_chained defined
# as an ordinary cudaLaunchKernelEx in cutlass_grouped_gemm.cu and aggregate.cu), built in a worktree.
# Carry [".carry/split"]. BUDGET seconds in all (default 300). Returns summary.txt and logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
C=.carry/split; B=/tmp/split; L=/tmp/split-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-300}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
for f in leanmoe_base leanmoe_main leanmoe_nogemm leanmoe_nofill; do xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f || say "MISSING $f"; done
source scripts/device_env.sh
say "main $(cat $C/commit) (nogemm: no gather kind chained; nofill: fill_group_args and the gather-sums ordinary launches), base c315c70 (58d1ec6's src); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
orders=("base main nogemm nofill" "nofill nogemm main base" "main nofill base nogemm")
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
    _, _, c, v = os.path.basename(p)[:-5].split("_")  # layer_rR_CONFIG_VARIANT
    try: r = json.load(open(p))["results"][0]
    except Exception: continue
    runs.setdefault((c, v), []).append((r["fwd_graph_ms"], r["bwd_graph_ms"]))
for (c, v), xs in sorted(runs.items()):
    print(f"median {c} {v}: fwd_graph {statistics.median(x[0] for x in xs):.3f} bwd_graph {statistics.median(x[1] for x in xs):.3f} (n={len(xs)})")
PY
say "== done (t=$SECONDS)"
