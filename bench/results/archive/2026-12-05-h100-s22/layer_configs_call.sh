#!/usr/bin/env bash
# Prepared in session 22 (not run): inside the layer, on whichever part comes (H100 or H200), one
# leanmoe build with `--gemm-config`:
#   default   the heuristic (on an H100: dx, and down at n >= 2048, in 2x1 clusters along N);
#   parity    down and dx by the parity rule alone (1x2 where ceil(d/192) is even, else 2x1, along M):
#             the H200's default, main before session 22 on either part;
#   dw1b16    the heuristic plus dW1 in bands of 16 row units (GEMM alone on the H100: -0.9..-7.4%
#             where d >= 2048, docs/kernels.md "Varlen-K tile bands");
#   side0     the heuristic with every SM to the backward GEMMs (--bwd-overlap 0; default: 4 left to
#             the side work, so dx runs 128 CTAs). Why: at 120B-n2048 the H100's dx alone went 10.3 ->
#             7.5 ms but the backward only 25.5 -> 24.9; 132 CTAs are exactly 3 rows of 22 2x1 n-tile
#             clusters along N, 128 are not (the waves then start at shifted n-tiles).
# First, dx alone at 120B-n2048 and 30B-n1024 with 132 / 130 / 128 / 126 / 110 CTAs, and oversubscribed
# grids of 264 / 528 / 1056 CTAs in both cluster shapes (each CTA walks fewer tiles: less drift) (leanmoe_bench_gemms
# from .carry/s22, if carried), so the layer's figures can be read against them.
# Graph replays, alternating rounds (ROUNDS, default 2), rows ROWS (default below). Carry [".carry/vs",
# ".carry/s22/leanmoe_bench_gemms.xz"]
# (scripts/prepare_carry.sh vs-sonic at a commit with --gemm-config, 70f0c33 or later; the oversubscribed
# grids need leanmoe_bench_gemms from a commit with them: the session's last, whose build .carry/s22 holds).
# BUDGET seconds (default 480). Returns summary.txt and logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
B=/tmp/lc; L=/tmp/lc-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-480}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
xz -dc .carry/vs/leanmoe.xz > $B/leanmoe && chmod +x $B/leanmoe || say "MISSING leanmoe"
source scripts/device_env.sh
say "leanmoe $(cat .carry/vs/commit); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
P=cutlass:pingpong:128x192:auto:tma
parity() {  # d -> down and dx by the parity of ceil(d / 192)
  local c=c2; [ $(( ($1 + 191) / 192 % 2 )) -eq 0 ] && c=c1x2
  echo "down=$P:$c,dx=$P:$c"
}
declare -A D=([120B-n2048]=4096 [30B-n1024]=4096 [120B-n512]=4096 [olmoe-1b-7b]=2048 [gpt-oss-20b]=2880 [qwen3-30b-a3b]=2048)
ROWS="${ROWS:-120B-n2048 30B-n1024 gpt-oss-20b olmoe-1b-7b}"
if [ -f .carry/s22/leanmoe_bench_gemms.xz ]; then
  xz -dc .carry/s22/leanmoe_bench_gemms.xz > $B/bg && chmod +x $B/bg
  X=$P:c2:rN; CFG=""
  for m in 132 130 128 126 110 264 528 1056; do CFG="$CFG,dx=$X:m$m"; done
  for m in 132 528 1056; do CFG="$CFG,dx=$P:c1x2:m$m"; done  # the 1x2 rule oversubscribed (drift test)
  timeout $(cap 60) $B/bg --shape 120B-n2048,30B-n1024 --gemms dx --iters 10 --warmup 3 --config "${CFG#,}" > $L/ctas.txt 2>&1
  say "dx by CTAs (H100 rule's config; on an H200 the same config): $(awk -F'|' '$9 ~ /dx/ {gsub(/ /, "", $2); gsub(/ /, "", $10); gsub(/ /, "", $11); printf "%s %s %s; ", $2, $10, $11}' $L/ctas.txt)"
fi
orders=("default parity dw1b16 side0" "side0 dw1b16 default parity" "parity side0 dw1b16 default")
for r in $(seq 1 "${ROUNDS:-2}"); do for c in $ROWS; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for v in ${orders[$(( (r - 1) % 3 ))]}; do
    [ $((budget - SECONDS)) -lt 30 ] && break 3
    extra=()
    [ $v = parity ] && extra=(--gemm-config "$(parity ${D[$c]})")
    [ $v = dw1b16 ] && extra=(--gemm-config "dw1=gather:coop:256x128:s4:warp:c2:b16")
    [ $v = side0 ] && extra=(--bwd-overlap 0)
    timeout $(cap 45) $B/leanmoe bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
      "${extra[@]}" --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
    say "r$r $c $v rc=$? ${extra[*]}"
  done
done; done
python3 bench/layer_ab.py $L | tee -a $S
say "== done (t=$SECONDS)"
