# dw1feed (issue 17): QuACK's producer organisation for dW1 / dW2 (varlen-K), as compiled variants of
# the gather kernel, GemmConfig::feed (docs/kernels.md "QuACK's producer for the gathered varlen-K
# operand"): rot = TMA issue rotating over the 4 producer warps per k-tile + QuACK's copy layout
# (each thread loads its own 4 gathered rows, no shuffles); nf = consumers without the per-k-tile
# fence.proxy.async; rotnf = both. Branch commit in $CARRY/commit.
#   1. GPU tests ExpertGemms.* (EveryCompiledConfig now sweeps the variants, plus T = 0), GemmConfig.*,
#      GemmHeuristics.*
#   2. memcheck + racecheck on ExpertGemms.FeedVariants (the variants of dW1 and dW2, ragged, 5 CTAs)
#   3. leanmoe_bench_gemms dw1, dw2 (base, rot, nf, rotnf interleaved per shape) and dh (control) on
#      120B-n2048, 30B-n512, 7B-n256, olmoe-1b-7b: ~3.5 s warm-up, then two rounds.
# Expected run time: ~3.5 min (tests ~70 s, sanitizers ~60 s, benches ~60 s). Hard caps sum to ~9 min;
# a hang in a variant (a barrier mistake) shows as the smoke test's rc=124 and skips the rest.
# Returns $FINAL/dw1feed_tests.log, $FINAL/dw1feed_sanitizers.log, $FINAL/dw1feed_bench.md.
# Pass: tests all OK, memcheck 0 errors, racecheck 0 hazards; the summary table per shape, GEMM and
# feed: ms of both rounds, mean vs base in %.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/dw1feed"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -C "$B" -xf - && chmod +x "$B"/leanmoe_*
echo "dw1feed commit $(head -1 "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
T="$B/leanmoe_gpu_tests"; G="$B/leanmoe_bench_gemms"
LOG="$W/dw1feed_tests.log"; SANLOG="$W/dw1feed_sanitizers.log"; BENCH="$W/dw1feed_bench.md"
: > "$LOG"; : > "$SANLOG"; : > "$BENCH"

echo "== dw1feed smoke: FeedVariants (t=${SECONDS})"
timeout 60 "$T" --gtest_brief=1 --gtest_filter='ExpertGemms.FeedVariants' >> "$LOG" 2>&1
smoke=$?
echo "smoke rc=$smoke (t=${SECONDS})"
if [ $smoke -ne 124 ]; then
  echo "== dw1feed tests (t=${SECONDS})"
  timeout 200 "$T" --gtest_brief=1 --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' >> "$LOG" 2>&1
  echo "tests rc=$? (t=${SECONDS})"

  echo "== dw1feed sanitizers (t=${SECONDS})"
  for tool in memcheck racecheck; do
    echo "---- $tool" >> "$SANLOG"
    timeout 120 compute-sanitizer --tool $tool --print-limit 20 "$T" --gtest_brief=1 \
      --gtest_filter='ExpertGemms.FeedVariants' >> "$SANLOG" 2>&1
    echo "$tool rc=$? (t=${SECONDS})"
  done

  echo "== dw1feed benches (t=${SECONDS})"
  K1='gather:coop:256x128:s4:warp:c2'; K2='gather:coop:128x256:s4:warp:c2'
  CFG="dw1=$K1,dw1=$K1:rot,dw1=$K1:nf,dw1=$K1:rotnf,dw2=$K2,dw2=$K2:rot,dw2=$K2:nf,dw2=$K2:rotnf"
  SHAPES=120B-n2048,30B-n512,7B-n256,olmoe-1b-7b
  # ~3.5 s at full load (dW1 ~8 ms, dW2 ~4 ms a launch): both rounds at the power-capped steady state.
  timeout 60 "$G" --shape 120B-n2048 --gemms dw1,dw2 --iters 300 --warmup 5 > /dev/null 2>&1
  echo "warm-up done (t=${SECONDS})"
  for round in 1 2; do
    echo "round $round" >> "$BENCH"
    timeout 150 "$G" --shape $SHAPES --gemms dw1,dw2,dh --config "$CFG" --iters 20 --warmup 3 >> "$BENCH" 2>&1
    echo "bench round $round rc=$? (t=${SECONDS})"
  done
fi
cp "$LOG" "$SANLOG" "$BENCH" "$FINAL/" 2>/dev/null

echo "== dw1feed summary (t=${SECONDS})"
grep -E "tests? from .* ran|PASSED|FAILED" "$LOG" | tail -4
grep -B2 -A6 "Failure" "$LOG" | head -30
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$SANLOG"
grep -m5 -E "Invalid|Race|Hazard|rror" "$SANLOG" | grep -v SUMMARY
# Per shape, GEMM and feed: median ms of round 1 / round 2, mean against base's mean.
python3 - "$BENCH" <<'EOF'
import re, sys, collections
ms = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split('|')]
    if len(f) < 12 or f[1] in ('shape', '') or f[1].startswith('-'): continue
    try: t = float(f[10])
    except ValueError: continue
    m = re.search(r':(rotnf|rot|nf)(:|$)', f[9])
    ms[(f[1], f[8], m.group(1) if m else 'base')].append(t)
shapes = list(dict.fromkeys(k[0] for k in ms))
print(f"{'shape':12} {'gemm':4} {'feed':6} {'ms r1/r2':>15} {'vs base':>8}")
for sh in shapes:
    for g in ('dw1', 'dw2', 'dh'):
        base = ms.get((sh, g, 'base'))
        for feed in ('base', 'rot', 'nf', 'rotnf'):
            v = ms.get((sh, g, feed))
            if not v: continue
            rel = f"{100 * (sum(v) / len(v) / (sum(base) / len(base)) - 1):+.1f}%" if base and feed != 'base' else ''
            print(f"{sh:12} {g:4} {feed:6} {'/'.join(f'{x:.3f}' for x in v):>15} {rel:>8}")
EOF
