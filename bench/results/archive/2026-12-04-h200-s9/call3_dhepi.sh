# dhepi (issue 17): dH's epilogue. Binaries of branch dhepi (commit in $CARRY/commit), one build with
# three compiled dH kernels: warp (today's default), tmah (the producer loads the tile's H with TMA
# into the pipeline stages after its last k-tile; stores as today), tmahs (tmah + TMA stores of dH
# and A' from each warpgroup's staging tiles).
#   1. the ExpertGemms / GemmConfig GPU tests (every compiled config incl. the new ones, ragged
#      routings, empty experts, partial m-tiles, 5/2/1 CTAs; every activation x layout x bias for
#      each dH kernel);
#   2. compute-sanitizer memcheck (DhEpiloguesSmall + FewPersistentCtas, whose config 0 is tmahs)
#      and racecheck (DhEpiloguesSmall: every dH kernel, three functions, R = 400);
#   3. dH alone on 6 shapes, the three kernels interleaved, two rounds, one process.
# Expected run time: ~2 minutes (tests ~40-60 s, memcheck ~15 s, racecheck ~10-20 s, bench ~10 s);
# hard cap 90 + 30 + 35 + 25 = 180 s of timeouts. Returns $FINAL/dhepi_tests.log,
# $FINAL/dhepi_sanitizers.log, $FINAL/dhepi_bench.txt; the summary table is printed last.
B="$W/dhepi"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "dhepi commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
echo "== GPU tests (t=${SECONDS})"
timeout 90 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' \
  > "$W/dhepi_tests.log" 2>&1
echo "tests rc=$? (t=${SECONDS})"
grep -E "tests ran|PASSED|FAILED" "$W/dhepi_tests.log" | head -12
grep -E "Failure|kernels:|dh=|got .*want" "$W/dhepi_tests.log" | head -16
cp "$W/dhepi_tests.log" "$FINAL/"
echo "== memcheck (t=${SECONDS})"
timeout 30 compute-sanitizer --tool memcheck --print-limit 20 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemms.DhEpiloguesSmall:ExpertGemms.FewPersistentCtas' > "$W/memcheck.log" 2>&1
echo "memcheck rc=$? (t=${SECONDS})"; grep -E "ERROR SUMMARY|tests ran|PASSED|FAILED" "$W/memcheck.log" | tail -4
echo "== racecheck (t=${SECONDS})"
timeout 35 compute-sanitizer --tool racecheck --print-limit 20 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemms.DhEpiloguesSmall' > "$W/racecheck.log" 2>&1
echo "racecheck rc=$? (t=${SECONDS})"; grep -E "RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$W/racecheck.log" | tail -4
{ echo "### memcheck"; head -c 30000 "$W/memcheck.log"; echo "### racecheck"; head -c 30000 "$W/racecheck.log"; } \
  > "$FINAL/dhepi_sanitizers.log"
echo "== dH bench (t=${SECONDS})"
K=gather:coop:128x256:s4
timeout 25 "$B/leanmoe_bench_gemms" --gemms dh --shape 7B-n256,1.4B-n256,olmoe-1b-7b,120B-n2048,gpt-oss-20b,30B-n512 \
  --iters 20 --warmup 3 --rounds 2 --config dh=$K:warp:c2,dh=$K:tmah:c2,dh=$K:tmahs:c2 > "$W/dhepi_bench.txt" 2>&1
echo "bench rc=$? (t=${SECONDS})"
cp "$W/dhepi_bench.txt" "$FINAL/"
echo "== summary: dH ms per round (TFLOP/s of the faster round), vs warp"
python3 - "$W/dhepi_bench.txt" <<'EOF'
import sys, collections
ms, tf, order = collections.defaultdict(list), {}, []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split('|')[1:-1]]
    if len(f) != 10 or f[6] != 'dh': continue
    shape, epi = f[0], f[7].split(':')[4]
    ms[shape, epi].append(float(f[8])); tf[shape, epi] = max(tf.get((shape, epi), 0), float(f[9]))
    if shape not in order: order.append(shape)
epis = ['warp', 'tmah', 'tmahs']
print('| shape | ' + ' | '.join(epis) + ' | tmah/warp | tmahs/warp |\n|---|---|---|---|---|---|')
tot = collections.Counter()
for s in order:
    best = {e: min(ms[s, e]) for e in epis if ms[s, e]}
    for e in best: tot[e] += best[e]
    cell = lambda e: ' / '.join('%.3f' % v for v in ms[s, e]) + ' (%.0f)' % tf[s, e] if ms[s, e] else '-'
    ratio = lambda e: '%.3f' % (best[e] / best['warp']) if e in best and 'warp' in best else '-'
    print('| %s | %s | %s | %s |' % (s, ' | '.join(cell(e) for e in epis), ratio('tmah'), ratio('tmahs')))
print('| sum of best ms | ' + ' | '.join('%.3f' % tot[e] for e in epis) + ' | %s | %s |' % tuple(
    '%.3f' % (tot[e] / tot['warp']) if tot['warp'] else '-' for e in ('tmah', 'tmahs')))
EOF
echo "dhepi done (t=${SECONDS})"
