#!/usr/bin/env bash
# Session 11, device call 2 (issue 17): ncu --set full on SonicMoE's six expert GEMMs (QuACK 0.4.1) of one
# forward + backward at 120B-n2048 and 7B-n256, from its kernel cache (.carry/qc, no compile), beside
# call 1's leanmoe profiles. Carry: .carry/sonicmoe, .carry/qc.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
[ -d /tmp/site/sonicmoe ] || { mkdir -p /tmp/site && tar xJf $S/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/*.whl >"$W/install.log" 2>&1; }
[ -d /tmp/quack_cache ] || xz -dc .carry/qc/quack_cache.tar.xz | tar xf - -C /tmp
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
NCU=(ncu --set full --csv --page details --print-units base)
for c in 120B-n2048 7B-n256; do
  echo "-- ncu sonic $c (t=${SECONDS})"; mkdir -p "$W/o_$c"
  CONFIGS=$c ITERS=1 WARM=0 ROUTER=topk_then_softmax OUT="$W/o_$c" timeout 200 \
    "${NCU[@]}" -k 'regex:quackgemm' -c 6 python3 $S/sonic_bench.py > "$W/ncu_sonic_$c.csv" 2> "$W/ncu_sonic_$c.err"
  echo "rc=$?"; grep -c '^"' "$W/ncu_sonic_$c.csv"; tail -2 "$W/ncu_sonic_$c.err"
done
(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_*.csv 2>/dev/null); ls -la "$FINAL"; echo "done (t=${SECONDS})"
