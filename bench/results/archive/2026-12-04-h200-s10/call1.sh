#!/usr/bin/env bash
# Session 10, device call 1 (one H200, at most 10 minutes): where SonicMoE's time goes, kernel by
# kernel, beside leanmoe in the same call (issue 17). SonicMoE compiled at 7B-n256 (cold: ~6.5 min),
# timed eagerly and as CUDA-graph replays, then one forward + backward under ncu; leanmoe main
# (commit in .carry/s10a) timed as graph replays and under ncu at 7B-n256 and 120B-n2048; SonicMoE
# at 120B-n2048 if time is left; SonicMoE's kernel cache packed for later calls.
# Carry: .carry/sonicmoe (a copy of ../shared/anchors/sonicmoe), .carry/s10a (leanmoe, static OpenBLAS, xz).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
xz -dc .carry/s10a/leanmoe.xz > /tmp/leanmoe && chmod +x /tmp/leanmoe; echo "leanmoe $(cat .carry/s10a/commit)"
mkdir -p /tmp/site && tar xJf $S/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/*.whl >"$W/install.log" 2>&1 || cat "$W/install.log"
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
mkdir -p /tmp/quack_cache "$W/s1" "$W/s2" "$W/ncu_s"
ncu_csv() { ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base "$@"; }
echo "== sonic_bench 7B-n256 (t=${SECONDS})"
GRAPH=1 CONFIGS=7B-n256 ROUTER=topk_then_softmax OUT="$W/s1" PYTHONUNBUFFERED=1 \
  timeout 450 python3 $S/sonic_bench.py >"$W/sonic_7B.log" 2>&1; echo "sonic rc=$?"
grep '^{' "$W/sonic_7B.log" | cut -c1-400
echo "== ncu sonic 7B-n256 (t=${SECONDS})"
CONFIGS=7B-n256 ITERS=1 WARM=1 ROUTER=topk_then_softmax OUT="$W/ncu_s" timeout $((520 - SECONDS)) \
  ncu_csv python3 $S/sonic_bench.py >"$W/ncu_sonic_7B-n256.csv" 2>"$W/ncu_sonic_7B-n256.err"; echo "rc=$?"
grep -c '^"' "$W/ncu_sonic_7B-n256.csv"
echo "== leanmoe graph (t=${SECONDS})"
for c in 7B-n256 120B-n2048; do
  timeout 40 /tmp/leanmoe bench --config $c --router topk_then_softmax --graph --iters 10 --warmup 3 \
    --json "$W/leanmoe_$c.json" 2>&1 | grep -v '^\[' | tail -2
  echo "== ncu leanmoe $c (t=${SECONDS})"
  timeout 30 ncu_csv /tmp/leanmoe bench --config $c --router topk_then_softmax --iters 1 --warmup 1 \
    >"$W/ncu_leanmoe_$c.csv" 2>"$W/ncu_leanmoe_$c.err"; echo "rc=$?"
done
if [ $SECONDS -lt 470 ]; then
  echo "== sonic_bench 120B-n2048 (t=${SECONDS})"
  GRAPH=1 CONFIGS=120B-n2048 ROUTER=topk_then_softmax OUT="$W/s2" PYTHONUNBUFFERED=1 \
    timeout $((540 - SECONDS)) python3 $S/sonic_bench.py >"$W/sonic_120B.log" 2>&1; echo "sonic rc=$?"
  grep '^{' "$W/sonic_120B.log" | cut -c1-400
fi
cp "$W"/s1/sonic.json "$FINAL/sonic_7B.json" 2>/dev/null; cp "$W"/s2/sonic.json "$FINAL/sonic_120B.json" 2>/dev/null
(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_*.csv leanmoe_*.json 2>/dev/null)
echo "== cache (t=${SECONDS}): $(find /tmp/quack_cache -type f | wc -l) files, $(du -sh /tmp/quack_cache | cut -f1)"
tar cf - -C /tmp quack_cache | XZ_OPT="-T0 -6" timeout 25 xz >"$FINAL/quack_cache.tar.xz"; ls -la "$FINAL"
echo "done (t=${SECONDS})"
