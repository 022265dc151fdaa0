# downtma (issue 17, "Ahead of SonicMoE"): down and dx as varlen-M kinds of the gather kernel, A (A' / dH)
# loaded by TMA through one map over all R rows, B through the all-experts weight map, plain bf16
# warp-staged epilogue. Configs gather:coop:128x256:s4:warp:c2 and :c1 for down and dx, NOT the
# default (branch downtma, commit in $CARRY/commit; binaries built with -DLEANMOE_STATIC_BLAS=ON, stripped).
#   0. smoke: ExpertGemms.DownDxOnTheGatherKernel (both new configs, both layouts, ragged / empty /
#      one-expert / NaN capacity rows). If it fails or hangs, the gather benches are skipped.
#   1. benches on a quiet GPU: leanmoe_bench_gemms --gemms down,dx on 7 shapes, default (CUTLASS) vs
#      down=dx=gather c2 vs gather c1, two interleaved rounds (D C2 C1 D C2 C1) so clock drift shows.
#   2. concurrently (correctness only): ExpertGemms.* (every compiled config incl. the new ones against
#      the CPU loops); compute-sanitizer memcheck on DownDxOnTheGatherKernel (all its kernels), racecheck
#      on the same test with only the gather kernel instrumented (--kernel-name kns=gather_grouped_gemm_kernel).
#   3. summary last: per shape and GEMM, ms of each variant per round, gather best / default.
# Expected run time ~3-3.5 min: smoke ~15 s, 6 bench runs of ~8-12 s (~60 s), then tests ~100-120 s
# beside memcheck (~40-60 s) and racecheck (~60-120 s). Hard cap ~8 min (60 + 6 x 45 + 240).
# Returns $FINAL/downtma_gemms.txt (summary + raw bench tables) and $FINAL/downtma_tests.txt (test and
# sanitizer summaries, failures).
set -uo pipefail
T0=$SECONDS
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/downtma"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "downtma commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== 0. smoke: ExpertGemms.DownDxOnTheGatherKernel (t=$((SECONDS - T0)))"
timeout 60 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter=ExpertGemms.DownDxOnTheGatherKernel > "$W/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE (t=$((SECONDS - T0)))"; tail -4 "$W/smoke.txt"

SHAPES=1.4B-n256,7B-n256,30B-n256,7B-n512,120B-n512,sparse-T8k-d4096-n1024-E256,120B-n2048
C2=gather:coop:128x256:s4:warp:c2; C1=gather:coop:128x256:s4:warp:c1
echo "== 1. benches down,dx: default / gather c2 / gather c1, two rounds (t=$((SECONDS - T0)))"
for round in 1 2; do
  for v in default c2 c1; do
    cfg=""
    [ $v = c2 ] && cfg="--config down=$C2,dx=$C2"
    [ $v = c1 ] && cfg="--config down=$C1,dx=$C1"
    if [ $v != default ] && [ $SMOKE -ne 0 ]; then echo "skip $v (smoke failed)"; continue; fi
    timeout 45 "$B/leanmoe_bench_gemms" --gemms down,dx --shape $SHAPES --iters 20 --warmup 3 $cfg \
      > "$W/gemms_${v}_$round.txt" 2>&1
    echo "round $round $v rc=$? (t=$((SECONDS - T0)))"
  done
done

echo "== 2. ExpertGemms.* beside memcheck and racecheck (t=$((SECONDS - T0)))"
timeout 240 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemms.*' > "$W/tests.txt" 2>&1 &
P1=$!
SAN=ExpertGemms.DownDxOnTheGatherKernel
timeout 150 compute-sanitizer --tool memcheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter=$SAN > "$W/memcheck.txt" 2>&1 &
P2=$!
timeout 150 compute-sanitizer --tool racecheck --print-limit 10 --kernel-name kns=gather_grouped_gemm_kernel \
  "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter=$SAN > "$W/racecheck.txt" 2>&1 &
P3=$!
wait $P1; R1=$?; wait $P2; R2=$?; wait $P3; R3=$?
echo "tests rc=$R1 memcheck rc=$R2 racecheck rc=$R3 (t=$((SECONDS - T0)))"
{
  echo "## smoke (rc=$SMOKE)"; grep -E "PASSED|FAILED|Failure|error|got" "$W/smoke.txt" | head -20
  echo "## ExpertGemms.* (rc=$R1; 124 = timeout)"; grep -E "PASSED|FAILED|Failure|error|got|tests ran" "$W/tests.txt" | head -40
  echo "## memcheck $SAN (rc=$R2)"; grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|Error" "$W/memcheck.txt" | head -20
  echo "## racecheck $SAN, gather kernel only (rc=$R3)"; grep -E "RACECHECK SUMMARY|PASSED|FAILED|Race|Hazard|rror|nrecognized|nknown" "$W/racecheck.txt" | head -20
} > "$FINAL/downtma_tests.txt"

python3 - "$W" > "$W/summary.txt" <<'EOF'
import sys, os
W = sys.argv[1]
def rows(path):
    out = {}
    if not os.path.exists(path): return out
    for line in open(path):
        f = [x.strip() for x in line.split('|')[1:-1]]
        if len(f) == 11 and f[7] in ('down', 'dx'):
            try: out[f[0], f[7]] = (f[8], float(f[9]), float(f[10]))
            except ValueError: pass
    return out
runs = {(v, r): rows(f"{W}/gemms_{v}_{r}.txt") for v in ('default', 'c2', 'c1') for r in (1, 2)}
keys = []
for d in runs.values():
    for k in d:
        if k not in keys: keys.append(k)
print("ms per run (r1 / r2); ratio = best gather (min over rounds) / default (min over rounds); < 1: gather faster")
print("| shape | GEMM | default kernel | default ms | gather c2 ms | gather c1 ms | best gather / default |")
print("|---|---|---|---|---|---|---|")
tot = {'default': 0.0, 'best': 0.0}
for s, g in keys:
    cell, best = {}, {}
    kern = ''
    for v in ('default', 'c2', 'c1'):
        ms = [runs[v, r].get((s, g), (None, None, None))[1] for r in (1, 2)]
        got = [m for m in ms if m is not None]
        cell[v] = ' / '.join('-' if m is None else f"{m:.3f}" for m in ms)
        best[v] = min(got) if got else None
        if v == 'default' and got: kern = next(runs['default', r][(s, g)][0] for r in (1, 2) if (s, g) in runs['default', r])
    gb = [best[v] for v in ('c2', 'c1') if best[v] is not None]
    ratio = f"{min(gb) / best['default']:.3f}" if gb and best['default'] else '-'
    if gb and best['default']: tot['default'] += best['default']; tot['best'] += min(gb)
    short = kern.replace('cutlass:', '').replace(':auto:tma', ':tma').replace(':m132', '')
    print(f"| {s} | {g} | {short} | {cell['default']} | {cell['c2']} | {cell['c1']} | {ratio} |")
if tot['default']: print(f"| sum | | | {tot['default']:.3f} | | | {tot['best'] / tot['default']:.3f} |")
EOF
{ cat "$W/summary.txt"; for f in "$W"/gemms_*_*.txt; do echo "## $(basename $f)"; cat "$f"; done; } > "$FINAL/downtma_gemms.txt"
echo "== tests and sanitizers (t=$((SECONDS - T0)))"; cat "$FINAL/downtma_tests.txt"
echo "== summary (t=$((SECONDS - T0)))"; cat "$W/summary.txt"
