#!/usr/bin/env bash
# Session 4, call 5: GPU tests of the per-warp dH epilogue (now the default), dH epilogue A/B per GEMM
# (warp vs smem, two rounds), then the layer grid beside the anchor with the faster dH epilogue,
# token rounding vs top-K, memcheck + racecheck of the new epilogue.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'for f in results.md leanmoe.json baseline.json; do [ -f "$W/$f" ] && cp "$W/$f" "$FINAL/"; done; cp $W/*.txt "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tar.gz" -C "$W" .' EXIT
mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
[ -e /usr/local/cuda/lib/libnccl.so.2 ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B=.carry/b; commit="$(cat $B/commit)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.txt"
echo "== GPU tests ($commit)"; timeout 150 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | tail -12
C=7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b,30B-n512
for round in 1 2; do for epi in warp smem; do
  echo "### round $round LEANMOE_GEMM_WS_EPI=$epi"
  LEANMOE_GEMM_WS_EPI=$epi timeout 60 $B/leanmoe_bench_gemms --config $C --gemms dh --iters 30 2>&1 | grep '^| [0-9a-z]'
done; done | tee "$W/gemms_dh_epi.txt"
# Sum of dH ms over the configs per epilogue (both rounds); the grid runs with the faster one.
pick=$(awk '/^###/{e=$NF; sub("LEANMOE_GEMM_WS_EPI=","",e)} /^\| /{t[e]+=$(NF-3)} END{print (t["warp"]<=t["smem"]) ? "warp" : "smem"; print "warp " t["warp"] " smem " t["smem"] > "/dev/stderr"}' "$W/gemms_dh_epi.txt")
echo "dH epilogue for the grid: $pick" | tee "$W/pick.txt"
export LEANMOE_GEMM_WS_EPI=$pick
echo "== all six GEMMs"; timeout 60 $B/leanmoe_bench_gemms --config 7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b --iters 20 2>&1 | tee "$W/gemms_default.txt" | grep '^| [0-9]'
echo "== grid"; timeout 200 $B/leanmoe bench --grid --iters 10 --warmup 3 --json "$W/leanmoe.json" >"$W/leanmoe.txt" 2>"$W/leanmoe.err"
echo "grid rc=$?"; tail -3 "$W/leanmoe.err"
echo "== anchor"; NO_LOOP=1 OUT="$W" PYTHONUNBUFFERED=1 timeout 220 python3 .carry/torch_moe_baseline.py >"$W/baseline.log" 2>&1
echo "anchor rc=$?"; tail -1 "$W/baseline.log"
python3 bench/compare.py --leanmoe "$W/leanmoe.json" --anchor "$W/baseline.json" --commit "$commit" \
  --command "LEANMOE_GEMM_WS_EPI=$pick leanmoe bench --grid --iters 10 --warmup 3 --json leanmoe.json; NO_LOOP=1 python3 torch_moe_baseline.py" \
  --out "$W/results.md" && echo "results.md written" && grep -E "120B-n2048|7B-n256 " "$W/results.md" | head -3
echo "== token rounding vs top-K"
for c in 7B-n256 30B-n256; do for r in topk token-rounding; do
  timeout 40 $B/leanmoe bench --config $c --routing $r --iters 10 --warmup 3 --json "$W/tr_${c}_${r}.json" 2>/dev/null | tail -4
done; done > "$W/token_rounding.txt"; cat "$W/token_rounding.txt"
echo "== memcheck / racecheck (per-warp dH epilogue)"
LEANMOE_GEMM_WS_EPI=warp timeout 80 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests \
  --gtest_filter='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.OneExpertTakesAllRows:ExpertGemms.ManyExperts' >"$W/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$W/memcheck.log"
LEANMOE_GEMM_WS_EPI=warp timeout 100 compute-sanitizer --tool racecheck $B/leanmoe_gpu_tests \
  --gtest_filter='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.OneExpertTakesAllRows' >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -1 "$W/racecheck.log"
