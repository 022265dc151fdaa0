#!/usr/bin/env bash
# Session 10, device call 2: call 1's ncu steps again (call 1 ran ncu through a shell function under
# `timeout`, which cannot exec it: rc 127). SonicMoE's kernel cache from call 1 (.carry/qc), so no
# compile: one SonicMoE forward + backward under ncu at 7B-n256 and 120B-n2048, leanmoe (.carry/s10a) too.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
xz -dc .carry/s10a/leanmoe.xz > /tmp/leanmoe && chmod +x /tmp/leanmoe
[ -d /tmp/site/sonicmoe ] || { mkdir -p /tmp/site && tar xJf $S/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/*.whl >"$W/install.log" 2>&1; }
[ -d /tmp/quack_cache ] || xz -dc .carry/qc/quack_cache.tar.xz | tar xf - -C /tmp
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
NCU=(ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base)
for c in 7B-n256 120B-n2048; do
  echo "== ncu sonic $c (t=${SECONDS})"; mkdir -p "$W/o_$c"
  CONFIGS=$c ITERS=1 WARM=1 ROUTER=topk_then_softmax OUT="$W/o_$c" timeout 150 \
    "${NCU[@]}" python3 $S/sonic_bench.py >"$W/ncu_sonic_$c.csv" 2>"$W/ncu_sonic_$c.err"; echo "rc=$?"
  grep -c '^"' "$W/ncu_sonic_$c.csv"; tail -3 "$W/ncu_sonic_$c.err"
  echo "== ncu leanmoe $c (t=${SECONDS})"
  timeout 40 "${NCU[@]}" /tmp/leanmoe bench --config $c --router topk_then_softmax --iters 1 --warmup 1 \
    >"$W/ncu_leanmoe_$c.csv" 2>"$W/ncu_leanmoe_$c.err"; echo "rc=$?"; grep -c '^"' "$W/ncu_leanmoe_$c.csv"
done
(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_*.csv 2>/dev/null); ls -la "$FINAL"; echo "done (t=${SECONDS})"
