# dw1xt (issue 17): the two untried differences to QuACK's dW1, as compiled experiments of the gather
# kernel (docs/kernels.md "dW1 in QuACK's orientation and the wait peeks"), none the default:
#   xt  = dW1 computed as dW1ᵀ = X[tok]ᵀ·dH at 256x128 with the gathered X on the 256 side, dH (TMA,
#         8 KB issued per CTA, multicast) on the 128 side, stored transposed into dW1 [W, d]
#   pk  = try_wait "peeks" one step before each blocking stage wait (dw1, dw1 xt, dw2)
#   dw2 at 256x128 (= with transposed weights dW1ᵀ in QuACK's orientation without a transposed store)
# Branch commit in $CARRY/commit.
#   1. GPU tests ExpertGemms.* (EveryCompiledConfig sweeps the new configs in both layouts, ragged,
#      empty experts, one expert taking all, T = 0), GemmConfig.*, GemmHeuristics.*; a smoke test first
#   2. memcheck + racecheck on ExpertGemms.Issue17Variants (the new configs, both layouts, 5 CTAs)
#   3. leanmoe_bench_gemms, ~3 s warm-up, then two rounds: dw1 base/pk/xt/xtpk, dw2 base/pk/256x128,
#      dh (noise control) on 120B-n2048, 30B-n512, 7B-n256, olmoe-1b-7b (HF layout); and dw1 with
#      transposed weights: today's dw2 128x256 kernel vs 256x128
# Expected run time: ~3 min (tests ~50 s, sanitizers ~45 s, benches ~80 s). Hard caps sum to ~10 min;
# a hang in a variant (a barrier mistake) shows as the smoke test's rc=124 and skips the rest.
# Returns $FINAL/dw1xt_tests.log, $FINAL/dw1xt_sanitizers.log, $FINAL/dw1xt_bench.md.
# Pass: tests all OK, memcheck 0 errors, racecheck 0 hazards; summary table last: ms r1/r2 and the
# mean against base per shape, GEMM and variant.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/dw1xt"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -C "$B" -xf - && chmod +x "$B"/leanmoe_*
echo "dw1xt commit $(head -1 "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
T="$B/leanmoe_gpu_tests"; G="$B/leanmoe_bench_gemms"
LOG="$W/dw1xt_tests.log"; SANLOG="$W/dw1xt_sanitizers.log"; BENCH="$W/dw1xt_bench.md"
: > "$LOG"; : > "$SANLOG"; : > "$BENCH"

echo "== dw1xt smoke: Issue17Variants (t=${SECONDS})"
timeout 60 "$T" --gtest_brief=1 --gtest_filter='ExpertGemms.Issue17Variants' >> "$LOG" 2>&1
smoke=$?
echo "smoke rc=$smoke (t=${SECONDS})"
if [ $smoke -ne 124 ]; then
  echo "== dw1xt tests (t=${SECONDS})"
  timeout 200 "$T" --gtest_brief=1 --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' >> "$LOG" 2>&1
  echo "tests rc=$? (t=${SECONDS})"

  echo "== dw1xt sanitizers (t=${SECONDS})"
  for tool in memcheck racecheck; do
    echo "---- $tool" >> "$SANLOG"
    timeout 120 compute-sanitizer --tool $tool --print-limit 20 "$T" --gtest_brief=1 \
      --gtest_filter='ExpertGemms.Issue17Variants' >> "$SANLOG" 2>&1
    echo "$tool rc=$? (t=${SECONDS})"
  done

  echo "== dw1xt benches (t=${SECONDS})"
  K1='gather:coop:256x128:s4:warp:c2'; K2='gather:coop:128x256:s4:warp:c2'
  CFG="dw1=$K1,dw1=$K1:pk,dw1=$K1:xt,dw1=$K1:xt:pk,dw2=$K2,dw2=$K2:pk,dw2=$K1"
  SHAPES=120B-n2048,30B-n512,7B-n256,olmoe-1b-7b
  # ~3 s at full load (dW1 ~8 ms, dW2 ~4 ms a launch): both rounds at the power-capped steady state.
  timeout 60 "$G" --shape 120B-n2048 --gemms dw1,dw2 --iters 250 --warmup 5 > /dev/null 2>&1
  echo "warm-up done (t=${SECONDS})"
  for round in 1 2; do
    echo "round $round" >> "$BENCH"
    timeout 150 "$G" --shape $SHAPES --gemms dw1,dw2,dh --config "$CFG" --iters 20 --warmup 3 >> "$BENCH" 2>&1
    echo "bench round $round rc=$? (t=${SECONDS})"
    timeout 60 "$G" --shape $SHAPES --layout transposed --gemms dw1 --config "dw1=$K2,dw1=$K1" --iters 20 \
      --warmup 3 >> "$BENCH" 2>&1
    echo "bench round $round transposed rc=$? (t=${SECONDS})"
  done
fi
cp "$LOG" "$SANLOG" "$BENCH" "$FINAL/" 2>/dev/null

echo "== dw1xt summary (t=${SECONDS})"
grep -E "tests? from .* ran|PASSED|FAILED" "$LOG" | tail -4
grep -B2 -A6 "Failure" "$LOG" | head -30
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$SANLOG"
grep -m5 -E "Invalid|Race|Hazard|rror" "$SANLOG" | grep -v SUMMARY
# Per shape, layout, GEMM and variant: median ms of round 1 / round 2, mean against base's mean
# (base: the first configuration of that GEMM and layout; dh has only base).
python3 - "$BENCH" <<'PY'
import re, sys, collections
ms = collections.defaultdict(list)
order = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split('|')]
    if len(f) < 12 or f[1] in ('shape', '') or f[1].startswith('-'): continue
    try: t = float(f[10])
    except ValueError: continue
    cfg = re.sub(r':m\d+$', '', f[9])
    tile = cfg.split(':')[2]
    var = tile + ''.join(':' + x for x in ('xt', 'pk') if f':{x}' in cfg)
    key = (f[1], f[2][:5], f[8])
    if var not in order[key]: order[key].append(var)
    ms[key + (var,)].append(t)
print(f"{'shape':12} {'layout':6} {'gemm':4} {'variant':14} {'ms r1/r2':>15} {'vs base':>8}")
for key, variants in order.items():
    base = ms[key + (variants[0],)]
    for var in variants:
        v = ms[key + (var,)]
        rel = f"{100 * (sum(v) / len(v) / (sum(base) / len(base)) - 1):+.1f}%" if var != variants[0] else 'base'
        print(f"{key[0]:12} {key[1]:6} {key[2]:4} {var:14} {'/'.join(f'{x:.3f}' for x in v):>15} {rel:>8}")
PY
