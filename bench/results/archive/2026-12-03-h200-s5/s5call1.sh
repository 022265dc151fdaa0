#!/usr/bin/env bash
# Session 5, call 1: the final check of the defaults of commit 07017233333a (session 4's call 7 ran that
# commit, but its files were lost) as built at 0a6abcd8ec24 (the same GEMMs; one routing sequence shared by
# the single-GPU and EP layers, whose GPU tests this call also runs): GPU tests, memcheck + racecheck of the per-warp dW epilogue, each
# GEMM on its own, the layer grid beside the anchor (twice when time allows, to see the run-to-run
# spread), token rounding vs top-K; SM clock and power sampled once a second throughout.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'kill $SMI 2>/dev/null; for f in results.md results2.md leanmoe.json baseline.json; do [ -f "$W/$f" ] && cp "$W/$f" "$FINAL/"; done; cp $W/*.txt "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tar.gz" -C "$W" .' EXIT
mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
[ -e /usr/local/cuda/lib/libnccl.so.2 ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B=.carry/b; commit="$(cat $B/commit)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -l 1 >"$W/smi_log.csv" 2>&1 &
SMI=$!
echo "== GPU tests ($commit)"; timeout 150 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | tail -12
echo "== memcheck / racecheck (per-warp dW epilogue)"
timeout 80 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests --gtest_filter='ExpertGemms.WsDwEpilogues' >"$W/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$W/memcheck.log"
timeout 60 compute-sanitizer --tool racecheck $B/leanmoe_gpu_tests --gtest_filter='ExpertGemms.RaggedWithEmptyExpert' >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -1 "$W/racecheck.log"
echo "== all six GEMMs"; timeout 60 $B/leanmoe_bench_gemms --config 7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b,30B-n512 --iters 20 2>&1 | tee "$W/gemms_default.txt" | grep '^| [0-9]'
CMD="leanmoe bench --grid --iters 10 --warmup 3 --json leanmoe.json; NO_LOOP=1 python3 torch_moe_baseline.py"
grid() {  # $1: suffix of this pass's files
  echo "== grid $1 (t=${SECONDS}s)"; timeout 200 $B/leanmoe bench --grid --iters 10 --warmup 3 --json "$W/leanmoe$1.json" >"$W/leanmoe$1.txt" 2>"$W/leanmoe$1.err"
  echo "grid rc=$?"; tail -2 "$W/leanmoe$1.err"
  mkdir -p "$W/a$1"; NO_LOOP=1 OUT="$W/a$1" PYTHONUNBUFFERED=1 timeout 220 python3 .carry/torch_moe_baseline.py >"$W/baseline$1.log" 2>&1
  echo "anchor rc=$? (t=${SECONDS}s)"; cp "$W/a$1/baseline.json" "$W/baseline$1.json"
  python3 bench/compare.py --leanmoe "$W/leanmoe$1.json" --anchor "$W/baseline$1.json" --commit "$commit" --command "$CMD" \
    --out "$W/results$1.md" && grep -E "120B-n2048|7B-n256 " "$W/results$1.md" | head -3
}
grid ""
echo "== token rounding vs top-K"
for c in 7B-n256 30B-n256; do for r in topk token-rounding; do
  timeout 40 $B/leanmoe bench --config $c --routing $r --iters 10 --warmup 3 --json "$W/tr_${c}_${r}.json" 2>/dev/null | tail -4
done; done > "$W/token_rounding.txt"; cat "$W/token_rounding.txt"
if [ "$SECONDS" -lt 300 ]; then grid 2; else echo "no time for a second grid pass (t=${SECONDS}s)"; fi
