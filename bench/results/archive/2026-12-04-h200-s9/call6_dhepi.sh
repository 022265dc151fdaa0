# dhepi (issue 17): dH ping-pong. Binaries of branch dhepi (commit in $CARRY/commit; main with the
# transposed layout merged in), built with -DLEANMOE_STATIC_BLAS=ON, three compiled dH kernels:
#   coop:warp    gather:coop:128x256:s4:warp:c2      today's default
#   pingpong     gather:pingpong:128x256:s4:warp:c2  NEW: each consumer warpgroup runs alternate 64-row
#                halves of the 128x256 tiles, one's epilogue under the other's MMAs (docs/kernels.md
#                "dH ping-pong")
#   coop:tmahs   gather:coop:128x256:s4:tmahs:c2     H by TMA through the stages + TMA stores (s9 call 3: -2..-3%)
#   1. GPU tests: ExpertGemms.* (every compiled config of every kind in both weight layouts, ragged
#      routings, empty experts, partial tiles, 5/2/1 CTAs; every activation x row order x bias x
#      layout for each dH kernel), GemmConfig.*, GemmHeuristics.*;
#   2. compute-sanitizer memcheck (DhEpiloguesSmall + FewPersistentCtas, whose config 0 is ping-pong)
#      and racecheck (DhEpiloguesSmall: every dH kernel, four functions incl. gpt-oss's transposed);
#   3. dH alone on 6 shapes (HF layout, the default path), the three kernels interleaved, 4 rounds in
#      one process; then gpt-oss-20b in its own layout (transposed, interleaved), 3 rounds.
# Expected run time: ~2 minutes (tests ~60 s, memcheck ~5 s, racecheck ~10 s, bench ~25 s); hard
# cap 95 + 20 + 25 + 30 + 15 = 185 s of timeouts. Returns $FINAL/dhepi_tests.log,
# $FINAL/dhepi_sanitizers.log, $FINAL/dhepi_bench.txt; the summary (per-shape medians) is printed last.
B="$W/dhepi"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "dhepi commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
echo "== GPU tests (t=${SECONDS})"
timeout 95 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' \
  > "$W/dhepi_tests.log" 2>&1
echo "tests rc=$? (t=${SECONDS})"
grep -E "tests ran|PASSED|FAILED" "$W/dhepi_tests.log" | head -12
grep -E "Failure|kernels:|dh=|got .*want" "$W/dhepi_tests.log" | head -16
cp "$W/dhepi_tests.log" "$FINAL/"
echo "== memcheck (t=${SECONDS})"
timeout 20 compute-sanitizer --tool memcheck --print-limit 20 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemms.DhEpiloguesSmall:ExpertGemms.FewPersistentCtas' > "$W/memcheck.log" 2>&1
echo "memcheck rc=$? (t=${SECONDS})"; grep -E "ERROR SUMMARY|tests ran|PASSED|FAILED" "$W/memcheck.log" | tail -4
echo "== racecheck (t=${SECONDS})"
timeout 25 compute-sanitizer --tool racecheck --print-limit 20 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemms.DhEpiloguesSmall' > "$W/racecheck.log" 2>&1
echo "racecheck rc=$? (t=${SECONDS})"; grep -E "RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$W/racecheck.log" | tail -4
{ echo "### memcheck"; head -c 30000 "$W/memcheck.log"; echo "### racecheck"; head -c 30000 "$W/racecheck.log"; } \
  > "$FINAL/dhepi_sanitizers.log"
echo "== dH bench (t=${SECONDS})"
C=dh=gather:coop:128x256:s4:warp:c2,dh=gather:pingpong:128x256:s4:warp:c2,dh=gather:coop:128x256:s4:tmahs:c2
timeout 30 "$B/leanmoe_bench_gemms" --gemms dh --shape 7B-n256,1.4B-n256,7B-n512,olmoe-1b-7b,120B-n2048,gpt-oss-20b \
  --iters 20 --warmup 3 --rounds 4 --config $C > "$W/dhepi_bench.txt" 2>&1
echo "bench rc=$? (t=${SECONDS})"
timeout 15 "$B/leanmoe_bench_gemms" --gemms dh --shape gpt-oss-20b --layout transposed --interleaved \
  --iters 20 --warmup 3 --rounds 3 --config $C >> "$W/dhepi_bench.txt" 2>&1
echo "bench (gpt-oss layout) rc=$? (t=${SECONDS})"
cp "$W/dhepi_bench.txt" "$FINAL/"
echo "== summary: dH ms, median over rounds [min-max] (TFLOP/s of the median), ratio to coop:warp"
python3 - "$W/dhepi_bench.txt" <<'EOF'
import sys, collections, statistics
ms, tf, order = collections.defaultdict(list), collections.defaultdict(list), []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split('|')[1:-1]]
    if len(f) != 11 or f[7] != 'dh': continue
    k = f[8].split(':')
    shape, var = f[0] + ('' if f[1] == 'hf' else ' (' + f[1] + ')'), k[1] + ':' + k[4]
    ms[shape, var].append(float(f[9])); tf[shape, var].append(float(f[10]))
    if shape not in order: order.append(shape)
vs = ['coop:warp', 'pingpong:warp', 'coop:tmahs']
med = {key: statistics.median(v) for key, v in ms.items()}
print('| shape | ' + ' | '.join(vs) + ' | pingpong/warp | tmahs/warp |\n|---|---|---|---|---|---|')
tot = collections.Counter()
for s in order:
    for v in vs:
        if (s, v) in med: tot[v] += med[s, v]
    cell = lambda v: '%.3f [%.3f-%.3f] (%.0f)' % (med[s, v], min(ms[s, v]), max(ms[s, v]),
                                                  statistics.median(tf[s, v])) if (s, v) in med else '-'
    ratio = lambda v: '%.3f' % (med[s, v] / med[s, 'coop:warp']) if (s, v) in med and (s, 'coop:warp') in med else '-'
    print('| %s | %s | %s | %s |' % (s, ' | '.join(cell(v) for v in vs), ratio('pingpong:warp'), ratio('coop:tmahs')))
print('| sum of medians | ' + ' | '.join('%.3f' % tot[v] for v in vs) + ' | %s | %s |' % tuple(
    '%.3f' % (tot[v] / tot['coop:warp']) if tot['coop:warp'] else '-' for v in ('pingpong:warp', 'coop:tmahs')))
EOF
echo "dhepi done (t=${SECONDS})"
