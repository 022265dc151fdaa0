# trspeed (issue 15, "token rounding's speed where it pays"): token rounding (nearest, up, down) vs
# top-K on the four sparse grid rows, against a measured padding-free bound (branch trspeed, commit
# in $CARRY/commit; leanmoe built with -DLEANMOE_STATIC_BLAS=ON). Runs only from $CARRY (the two
# python scripts are carried too), so any checkout will do.
#   1. bench/token_rounding_speed.py: per shape, `leanmoe bench --router topk_then_softmax --graph
#      --iters 20 --warmup 3` under topk, given (top-K's picks as routing given), token rounding
#      nearest/up/down and balanced (--routing balanced: every expert T*K/E rows, whole tiles); a
#      second round in reverse order while its 150 s budget allows (pooled). Table: time per mode,
#      speed-up vs top-K, the issue's tile bound, the measured bound t_topk / (t_balanced + t_topk -
#      t_given), each mode's distance to it; rows per expert, top-K's tiles and padding.
#   2. ncu (gpu__time_duration only, clocks left alone) of one forward + backward (--iters 1
#      --warmup 0) at sparse-T8k-d4096-n1024-E256 for topk, nearest and balanced, side by side
#      (dev/ncu_kernel_times.py --whole --side-by-side): kernels matched by name and order, then the
#      expert-GEMM / router-GEMM / other totals and their differences from top-K.
# Expected run time ~3-3.5 min: 24 bench runs of ~3-4 s (~90 s) plus a second round as far as the
# budget goes (<= 150 s for step 1 in all), then 3 ncu runs of ~10-15 s. Hard cap ~5.5 min (200 + 3 x 45).
# Returns $FINAL/token_rounding_speed.md (the table), $FINAL/ncu_side_by_side.txt and
# $FINAL/trspeed_raw.tgz (every bench JSON, the ncu CSVs, logs). Prints the side-by-side, then the table.
set -uo pipefail
T0=$SECONDS
B="$W/trspeed"; mkdir -p "$B"
xz -dc "$CARRY/leanmoe.xz" > "$B/leanmoe" && chmod +x "$B/leanmoe"
echo "trspeed commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== token rounding vs top-K vs balanced, four sparse rows (t=$((SECONDS - T0)))"
timeout 200 python3 "$CARRY/token_rounding_speed.py" --leanmoe "$B/leanmoe" --out "$B/speed" --rounds 2 \
  --budget-s 150 --timeout 45 > "$B/speed.log" 2>&1
echo "rc=$? (t=$((SECONDS - T0)))"; grep -v "^|\|^#\|^- \|^$" "$B/speed.log" | tail -12
python3 "$CARRY/token_rounding_speed.py" --from "$B/speed" > /dev/null  # the table from what ran, even after a timeout

NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
S=sparse-T8k-d4096-n1024-E256
for m in topk nearest balanced; do
  case $m in
    topk) r="--routing topk" ;;
    nearest) r="--routing token-rounding --rounding nearest" ;;
    balanced) r="--routing balanced" ;;
  esac
  echo "== ncu $S $m (t=$((SECONDS - T0)))"
  timeout 45 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$B/leanmoe" bench --config $S --router topk_then_softmax $r --iters 1 --warmup 0 \
    > "$B/ncu_$m.csv" 2> "$B/ncu_$m.err"
  echo "rc=$?"
done
python3 "$CARRY/ncu_kernel_times.py" --whole --side-by-side topk="$B/ncu_topk.csv" nearest="$B/ncu_nearest.csv" \
  balanced="$B/ncu_balanced.csv" > "$FINAL/ncu_side_by_side.txt" 2>&1

cp "$B/speed/token_rounding_speed.md" "$FINAL/" 2>/dev/null || echo "no table (see speed.log in trspeed_raw.tgz)" > "$FINAL/token_rounding_speed.md"
tar czf "$FINAL/trspeed_raw.tgz" -C "$B" speed speed.log $(cd "$B" && ls ncu_*) 2>/dev/null
echo "== ncu side by side, $S, us (t=$((SECONDS - T0)))"; cat "$FINAL/ncu_side_by_side.txt"
echo "== table (t=$((SECONDS - T0)))"; cat "$FINAL/token_rounding_speed.md"
