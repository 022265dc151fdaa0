# tiles (issue 17): CUTLASS grouped-GEMM candidates for down and dx on the grid shapes.
# Expected run time: ~2 minutes (bench ~60-90 s for 20 shapes x 15 candidates x 2 raster orders,
# memcheck of every candidate on one small shape ~30-60 s). Hard cap: 200 + 80 s of timeouts.
# Returns $FINAL/tiles.log (full table, ~700 rows) and $FINAL/tiles_memcheck.log.
xz -dc "$CARRY/cutlass_tiles.xz" > "$W/cutlass_tiles" && chmod +x "$W/cutlass_tiles"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
echo "== bench (t=${SECONDS})"
timeout 200 "$W/cutlass_tiles" --shapes grid --iters 20 --warmup 3 --sets 3 > "$W/tiles.log" 2>&1
echo "bench rc=$? (t=${SECONDS})"
cp "$W/tiles.log" "$FINAL/tiles.log"
echo "== memcheck, one small shape, every candidate once (t=${SECONDS})"
timeout 80 compute-sanitizer --tool memcheck --print-limit 20 "$W/cutlass_tiles" --shapes granite-3.1-3b-a800m \
  --iters 1 --warmup 0 --sets 1 --raster m > "$W/tiles_memcheck.log" 2>&1
echo "memcheck rc=$? (t=${SECONDS})"
cp "$W/tiles_memcheck.log" "$FINAL/tiles_memcheck.log"
grep -E "ERROR SUMMARY|WRONG|Invalid|cutlass_tiles:" "$W/tiles_memcheck.log" | head -20
echo "== candidates"; grep '^candidate' "$W/tiles.log"
echo "== wrong results (should be none)"; grep -c WRONG "$W/tiles.log"; grep WRONG "$W/tiles.log" | head
grep "cutlass_tiles:" "$W/tiles.log"
echo "== summary"; sed -n '/^== down/,$p' "$W/tiles.log"
echo "done (t=${SECONDS})"
