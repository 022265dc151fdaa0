#!/usr/bin/env bash
# Session 9, device call 6 (one H200, at most 10 minutes), three parts:
#   A. the layer grid (leanmoe bench --grid --router topk_then_softmax --graph, eager and CUDA-graph
#      replays) of main at the session's start (742d6a7, .carry/s9a) and of main now (f095a52,
#      .carry/m5), in the order old, new, new, old: this session's change measured in one call;
#   B. down and dx over the grid, leanmoe_bench_gemms of main before the CUTLASS tiles (53bdf4a,
#      .carry/c6/tiles) and now;
#   C. branch dhepi (dH ping-pong vs cooperative vs tmahs): GPU tests, sanitizers, dH A/B
#      (call6_dhepi.sh, the helper's fragment; .carry/c6/dh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; W="$(mktemp -d)"; T0=$SECONDS
source scripts/device_env.sh
B=/tmp/c6; mkdir -p $B
xz -dc .carry/s9a/leanmoe.xz > $B/leanmoe_old; xz -dc .carry/m5/leanmoe.xz > $B/leanmoe_new
xz -dc .carry/m5/leanmoe_bench_gemms.xz > $B/gemms_new; xz -dc .carry/c6/tiles/leanmoe_bench_gemms_main.xz > $B/gemms_old
chmod +x $B/*
echo "old $(cat .carry/s9a/commit), new $(cat .carry/m5/commit), gemms_old $(cat .carry/c6/tiles/main_commit)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
echo "== A: grid old/new/new/old (t=$((SECONDS - T0)))"
i=0
for v in old new new old; do
  i=$((i + 1))
  timeout 70 $B/leanmoe_$v bench --grid --router topk_then_softmax --graph --iters 10 --warmup 3 \
    --json "$W/grid_${v}_$i.json" > "$W/grid_${v}_$i.txt" 2>&1; echo "$v rc=$? (t=$((SECONDS - T0)))"
done
tar czf "$FINAL/grid_ab.tgz" -C "$W" $(cd "$W" && ls grid_*)
python3 - "$W" > "$W/grid_ab.md" <<'PY'
import json, sys, glob, os, statistics as st
runs = {}
for f in sorted(glob.glob(sys.argv[1] + "/grid_*.json")):
    v = os.path.basename(f).split("_")[1]
    for r in json.load(open(f))["results"]:
        runs.setdefault((r["config"], v), []).append(r)
print("| config | old fwd ms | new fwd ms | fwd new/old | old bwd ms | new bwd ms | bwd new/old | (CUDA-graph replays, mean of 2 runs each) |")
print("|---|---|---|---|---|---|---|---|")
cfgs = []
for (c, v) in runs:
    if c not in cfgs: cfgs.append(c)
for c in cfgs:
    o, n = runs.get((c, "old"), []), runs.get((c, "new"), [])
    if not o or not n: continue
    m = lambda rs, k: st.mean(r[k] for r in rs)
    of, nf, ob, nb = m(o, "fwd_graph_ms"), m(n, "fwd_graph_ms"), m(o, "bwd_graph_ms"), m(n, "bwd_graph_ms")
    print(f"| {c} | {of:.3f} | {nf:.3f} | {nf/of:.3f} | {ob:.3f} | {nb:.3f} | {nb/ob:.3f} | |")
PY
cp "$W/grid_ab.md" "$FINAL/"; cat "$W/grid_ab.md"
echo "== B: down/dx old/new (t=$((SECONDS - T0)))"
for v in old new; do
  timeout 45 $B/gemms_$v --gemms down,dx --shape grid --iters 20 --warmup 3 > "$W/gemms_$v.txt" 2>&1; echo "$v rc=$?"
done
cat "$W/gemms_old.txt" "$W/gemms_new.txt" > "$FINAL/gemms_ab.txt"
echo "== C: dhepi (t=$((SECONDS - T0)))"
[ $((SECONDS - T0)) -lt 380 ] && FINAL="$FINAL" W="$W" CARRY=.carry/c6/dh timeout $((590 - (SECONDS - T0))) bash "$(dirname "${BASH_SOURCE[0]}")/call6_dhepi.sh"
echo "done (t=$((SECONDS - T0)))"
