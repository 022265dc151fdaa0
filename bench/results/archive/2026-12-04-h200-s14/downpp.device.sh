# downpp (issue 17, "Ahead of SonicMoE"): down and dx on the gather kernel (A by TMA through one map over
# all rows, branch downtma) with a 128-row ping-pong tile at N = 192, QuACK's and CUTLASS's: each
# consumer warpgroup owns alternate 128x192 tiles (two m64n192k16 per k16 step, 192 fp32 accumulators
# per thread), mainloops ordered by two named barriers, one's epilogue under the other's MMAs. Configs
# gather:pingpong:128x192:s4:warp:c2 (2x1 clusters, W multicast) and :c1; not the default (CUTLASS
# ping-pong 128x192). Branch downpp, commit in $CARRY/commit. BLIND CODE (never ran): a wrong barrier
# hangs, hence the timeouts.
#   0. smoke (timeout 60 s): ExpertGemms.DownDxPingPongOnTheGatherKernel (pingpong 128x192 c2 and c1;
#      both layouts; ragged, empty expert, one expert with all rows, NaN capacity rows, T = 0, d = 448
#      with a 64-column last tile, 3 CTAs). Hang (rc 124/137): ping-pong benches and sanitizers skipped.
#   1. ~3 s warm-up (CUTLASS down,dx on 120B-n2048), then leanmoe_bench_gemms --gemms down,dx on
#      7B-n256, 1.4B-n256, olmoe-1b-7b, 30B-n512, 120B-n2048: default (CUTLASS) then pingpong c2 and c1
#      (interleaved per shape in one run), two rounds; each run capped at 30 s.
#   2. ExpertGemms.* + GemmConfig.* (every compiled config, the cooperative down/dx too) beside
#      compute-sanitizer memcheck and racecheck (gather kernel only) on DownDxPingPongOnTheGatherKernel.
#   3. summary last: per shape and GEMM, ms r1 / r2 per variant, mean % vs CUTLASS (mean of rounds).
# Expected run time ~2.5 min (smoke ~5 s, warm-up + 4 bench runs ~40 s, tests beside sanitizers
# ~90 s); hard cap ~6.5 min (60 + 5 x 30 + 180 s). Returns $FINAL/downpp_gemms.txt (summary + raw
# tables) and $FINAL/downpp_tests.txt (test and sanitizer summaries).
set -uo pipefail
T0=$SECONDS
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/downpp"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "downpp commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

SAN=ExpertGemms.DownDxPingPongOnTheGatherKernel
echo "== 0. smoke: $SAN (t=$((SECONDS - T0)))"
timeout -k 5 60 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter=$SAN > "$W/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE (t=$((SECONDS - T0)))"; tail -6 "$W/smoke.txt"

SHAPES=7B-n256,1.4B-n256,olmoe-1b-7b,30B-n512,120B-n2048
PP2=gather:pingpong:128x192:s4:warp:c2; PP1=gather:pingpong:128x192:s4:warp:c1
PP_OK=$([ $SMOKE -eq 0 ] && echo 1 || echo 0)
echo "== 1. warm-up, then benches down,dx: default / pingpong c2 + c1, two rounds (t=$((SECONDS - T0)))"
# The start of a run sits in the power ramp (docs/kernels.md, s11 call 10): ~3 s of CUTLASS first.
timeout -k 5 30 "$B/leanmoe_bench_gemms" --gemms down,dx --shape 120B-n2048 --iters 150 --warmup 3 > "$W/ramp.txt" 2>&1
echo "warm-up rc=$? (t=$((SECONDS - T0)))"
for round in 1 2; do
  for v in default pp; do
    cfg=""
    [ $v = pp ] && cfg="--config down=$PP2,down=$PP1,dx=$PP2,dx=$PP1"
    if [ $v = pp ] && [ $PP_OK -ne 1 ]; then echo "skip $v (smoke failed or a ping-pong bench hung)"; continue; fi
    timeout -k 5 30 "$B/leanmoe_bench_gemms" --gemms down,dx --shape $SHAPES --iters 20 --warmup 3 $cfg \
      > "$W/gemms_${v}_$round.txt" 2>&1
    rc=$?
    echo "round $round $v rc=$rc (t=$((SECONDS - T0)))"
    [ $v = pp ] && [ $rc -ge 124 ] && PP_OK=0
  done
done

if [ $SMOKE -eq 124 ] || [ $SMOKE -eq 137 ]; then
  echo "== 2. skipped: the smoke test hung (t=$((SECONDS - T0)))"; R1=skip; R2=skip; R3=skip
  : > "$W/tests.txt"; : > "$W/memcheck.txt"; : > "$W/racecheck.txt"
else
  echo "== 2. ExpertGemms.* GemmConfig.* beside memcheck and racecheck (t=$((SECONDS - T0)))"
  timeout -k 5 180 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemms.*:GemmConfig.*' > "$W/tests.txt" 2>&1 &
  P1=$!
  timeout -k 5 180 compute-sanitizer --tool memcheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
    --gtest_filter=$SAN > "$W/memcheck.txt" 2>&1 &
  P2=$!
  timeout -k 5 180 compute-sanitizer --tool racecheck --print-limit 10 --kernel-name kns=gather_grouped_gemm_kernel \
    "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter=$SAN > "$W/racecheck.txt" 2>&1 &
  P3=$!
  wait $P1; R1=$?; wait $P2; R2=$?; wait $P3; R3=$?
fi
echo "tests rc=$R1 memcheck rc=$R2 racecheck rc=$R3 (t=$((SECONDS - T0)))"
{
  echo "## smoke (rc=$SMOKE; 124 = hung)"; grep -E "PASSED|FAILED|Failure|error|got|config|Which" "$W/smoke.txt" | head -30
  echo "## ExpertGemms.* GemmConfig.* (rc=$R1; 124 = timeout)"; grep -E "PASSED|FAILED|Failure|error|got|tests ran" "$W/tests.txt" | head -40
  echo "## memcheck $SAN (rc=$R2)"; grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|Error" "$W/memcheck.txt" | head -20
  echo "## racecheck $SAN, gather kernel only (rc=$R3)"; grep -E "RACECHECK SUMMARY|PASSED|FAILED|Race|Hazard|rror|nrecognized|nknown" "$W/racecheck.txt" | head -20
} > "$FINAL/downpp_tests.txt"

python3 - "$W" > "$W/summary.txt" <<'EOF'
import sys, os
W = sys.argv[1]
def rows(path):
    out = {}  # (shape, gemm, variant) -> (kernel, ms)
    if not os.path.exists(path): return out
    for line in open(path):
        f = [x.strip() for x in line.split('|')[1:-1]]
        if len(f) == 11 and f[7] in ('down', 'dx'):
            try: ms = float(f[9])
            except ValueError: continue
            k = f[8]
            v = 'pp2' if k.startswith('gather:pingpong:128x192:s4:warp:c2') else \
                'pp1' if k.startswith('gather:pingpong:128x192:s4:warp:c1') else 'default'
            out[f[0], f[7], v] = (k, ms)
    return out
runs = {}
for r in (1, 2):
    for v in ('default', 'pp'):
        for key, val in rows(f"{W}/gemms_{v}_{r}.txt").items():
            runs[key + (r,)] = val
keys = []
for (s, g, v, r) in runs:
    if (s, g) not in keys: keys.append((s, g))
print("ms per run (r1 / r2); % = mean of the two rounds vs CUTLASS's mean (negative: ping-pong faster)")
print("| shape | GEMM | CUTLASS kernel | CUTLASS | pingpong c2 | pingpong c1 | c2 vs CUTLASS | c1 vs CUTLASS |")
print("|---|---|---|---|---|---|---|---|")
tot = {'default': 0.0, 'pp2': 0.0, 'pp1': 0.0}
for s, g in keys:
    cell, mean = {}, {}
    for v in ('default', 'pp2', 'pp1'):
        ms = [runs.get((s, g, v, r), (None, None))[1] for r in (1, 2)]
        got = [m for m in ms if m is not None]
        cell[v] = ' / '.join('-' if m is None else f"{m:.3f}" for m in ms)
        mean[v] = sum(got) / len(got) if got else None
    kern = next((runs[s, g, 'default', r][0] for r in (1, 2) if (s, g, 'default', r) in runs), '')
    pct = {v: (f"{100 * (mean[v] / mean['default'] - 1):+.1f}%" if mean[v] and mean['default'] else '-') for v in ('pp2', 'pp1')}
    if all(mean[v] for v in tot):
        for v in tot: tot[v] += mean[v]
    short = kern.replace('cutlass:', '').replace(':auto:tma', ':tma').replace(':m132', '')
    print(f"| {s} | {g} | {short} | {cell['default']} | {cell['pp2']} | {cell['pp1']} | {pct['pp2']} | {pct['pp1']} |")
if tot['default']:
    print(f"| sum (means) | | | {tot['default']:.3f} | {tot['pp2']:.3f} | {tot['pp1']:.3f} | "
          f"{100 * (tot['pp2'] / tot['default'] - 1):+.1f}% | {100 * (tot['pp1'] / tot['default'] - 1):+.1f}% |")
EOF
{ cat "$W/summary.txt"; for f in "$W"/gemms_*_*.txt; do echo "## $(basename $f)"; cat "$f"; done; } > "$FINAL/downpp_gemms.txt"
echo "== tests and sanitizers (t=$((SECONDS - T0)))"; cat "$FINAL/downpp_tests.txt"
echo "== summary (t=$((SECONDS - T0)))"; cat "$W/summary.txt"
