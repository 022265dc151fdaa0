#!/usr/bin/env bash
# Session 23: on the warm machine SETUP=1 prepared, the side-by-side of main with SonicMoE
# (bench/vs_sonic.sh STEADY=1, one round, DEADLINE seconds, default 330), then inside the layer on the
# same machine, one build with --gemm-config (graph replays, one round, BUDGET seconds in all, default 570):
#   default   the heuristic;
#   alongN    dx in 2x1 clusters along N where d >= 2048, down too where n >= 2048 (the H100's rule; on
#             the H100 it is the default);
#   parity    down and dx by ceil(d / 192)'s parity alone, 1x2 if even else 2x1, along M (the H200's rule);
#   side0     every SM to the backward GEMMs (--bwd-overlap 0; default: 4 SMs to the side work);
#   dyn       the --gemm-config list in DYN (e.g. down and dx with tiles from a counter).
# VARIANTS (default "default alongN parity side0", plus dyn when DYN is set) picks them.
# Carry [".carry/vs"]. Returns vs_sonic's files (side_by_side.md, r1_*.json, logs.tar.gz) and layer.txt, layer_logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
ROWS=30B-n256,30B-n512,30B-n1024,120B-n512,120B-n1024,120B-n2048,olmoe-1b-7b,qwen3-30b-a3b,gpt-oss-20b
SONIC_CARRY=/tmp/sonic_carry STEADY=1 ROUNDS=1 DEADLINE="${DEADLINE:-330}" CONFIGS=$ROWS bash bench/vs_sonic.sh
B=/tmp/lc; L=/tmp/lc-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/layer.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-570}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/layer_logs.tar.gz -C $L . 2>/dev/null' EXIT
xz -dc .carry/vs/leanmoe.xz > $B/leanmoe && chmod +x $B/leanmoe || say "MISSING leanmoe"
source scripts/device_env.sh
say "leanmoe $(cat .carry/vs/commit); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) (t=$SECONDS)"
P=cutlass:pingpong:128x192:auto:tma
declare -A D=([120B-n2048]=4096 [30B-n1024]=4096 [gpt-oss-20b]=2880 [olmoe-1b-7b]=2048)
declare -A N=([120B-n2048]=2048 [30B-n1024]=1024 [gpt-oss-20b]=2880 [olmoe-1b-7b]=1024)
variant() {  # variant row -> extra bench arguments
  local d=${D[$2]} n=${N[$2]} c=c2
  case $1 in
    alongN) local g="dx=$P:c2:rN"; [ $n -ge 2048 ] && g="$g,down=$P:c2:rN"; echo --gemm-config "$g";;
    parity) [ $(( (d + 191) / 192 % 2 )) -eq 0 ] && c=c1x2; echo --gemm-config "down=$P:$c,dx=$P:$c";;
    side0) echo --bwd-overlap 0;;
    dyn) echo --gemm-config "$DYN";;
  esac
}
V="${VARIANTS:-default alongN parity side0${DYN:+ dyn}}"
orders=("$V" "$(echo $V | tr ' ' '\n' | tac | tr '\n' ' ')")
i=0
for c in ${LROWS:-120B-n2048 30B-n1024 gpt-oss-20b olmoe-1b-7b}; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for v in ${orders[$(( i++ % 2 ))]}; do
    [ $((budget - SECONDS)) -lt 25 ] && break 2
    read -r -a extra < <(variant $v $c)
    timeout $(cap 45) $B/leanmoe bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
      "${extra[@]}" --json $L/layer_${c}_$v.json > $L/layer_${c}_$v.txt 2>&1
    say "$c $v rc=$? ${extra[*]} (t=$SECONDS)"
  done
done
python3 bench/layer_ab.py $L | tee -a $S
say "== done (t=$SECONDS)"
