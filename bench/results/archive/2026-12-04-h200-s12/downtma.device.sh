# downtma (issue 17, "Ahead of SonicMoE"): down and dx as varlen-M kinds of the gather kernel, A (A' / dH)
# loaded by TMA through one map over all R rows. NEW this call: a ping-pong schedule (each consumer
# warpgroup owns alternate 64x256 tiles, one's epilogue under the other's MMAs; two named barriers
# order the mainloops), configs gather:pingpong:64x256:s4:warp:c2 and :c1, beside the cooperative
# gather:coop:128x256:s4:warp:c2 measured last session. None is the default (CUTLASS ping-pong 128x192).
# Branch downtma, commit in $CARRY/commit; binaries -DLEANMOE_STATIC_BLAS=ON, stripped. BLIND CODE:
# the ping-pong kernel has never run; a wrong barrier would hang, hence the timeouts below.
#   0. smoke (timeout 40 s): ExpertGemms.DownDxOnTheGatherKernel (every gather down/dx config: coop
#      c2, c1, pingpong c2, c1; both layouts, ragged / empty / one-expert / NaN capacity rows, 3 CTAs).
#      Hang (rc 124): ping-pong benches and step 2 are skipped (they would hang too). Failure (rc 1):
#      ping-pong benches skipped, step 2 still runs (which configs fail, memcheck).
#   1. benches on a quiet GPU: leanmoe_bench_gemms --gemms down,dx on 7 shapes, variants default
#      (CUTLASS) / coop c2 / pingpong c2 / pingpong c1, two interleaved rounds; a ping-pong bench that
#      times out (25 s) skips the other ping-pong runs.
#   2. concurrently (correctness): ExpertGemms.* (every compiled config against the CPU loops);
#      compute-sanitizer memcheck and racecheck (gather kernel only) on DownDxOnTheGatherKernel.
#   3. summary last: per shape and GEMM, ms per variant and round, best pingpong / default and / coop c2.
# Expected run time ~2.5 min (last call's coop-only version took 80 s: smoke 2 s, 6 benches 8 s, tests
# beside sanitizers 70 s; now twice the gather configs under the sanitizers, 8 benches). Hard cap
# ~7.5 min (40 + 9 x 25 + 180). Returns $FINAL/downtma_gemms.txt (summary + raw bench tables) and
# $FINAL/downtma_tests.txt (test and sanitizer summaries, failures).
set -uo pipefail
T0=$SECONDS
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/downtma"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "downtma commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== 0. smoke: ExpertGemms.DownDxOnTheGatherKernel (t=$((SECONDS - T0)))"
timeout -k 5 40 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter=ExpertGemms.DownDxOnTheGatherKernel > "$W/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE (t=$((SECONDS - T0)))"; tail -6 "$W/smoke.txt"

SHAPES=1.4B-n256,7B-n256,30B-n256,7B-n512,120B-n512,sparse-T8k-d4096-n1024-E256,120B-n2048
CC2=gather:coop:128x256:s4:warp:c2; PP2=gather:pingpong:64x256:s4:warp:c2; PP1=gather:pingpong:64x256:s4:warp:c1
PP_OK=$([ $SMOKE -eq 0 ] && echo 1 || echo 0)
echo "== 1. benches down,dx: default / coop c2 / pingpong c2 / pingpong c1, two rounds (t=$((SECONDS - T0)))"
# A throwaway default run first: the start of a run sits in the power ramp (docs/kernels.md, s11 call 10).
timeout -k 5 25 "$B/leanmoe_bench_gemms" --gemms down,dx --shape $SHAPES --iters 20 --warmup 3 > "$W/ramp.txt" 2>&1
for round in 1 2; do
  for v in default cc2 pp2 pp1; do
    cfg=""
    [ $v = cc2 ] && cfg="--config down=$CC2,dx=$CC2"
    [ $v = pp2 ] && cfg="--config down=$PP2,dx=$PP2"
    [ $v = pp1 ] && cfg="--config down=$PP1,dx=$PP1"
    if [ ${v:0:2} = pp ] && [ $PP_OK -ne 1 ]; then echo "skip $v (smoke failed or a ping-pong bench hung)"; continue; fi
    timeout -k 5 25 "$B/leanmoe_bench_gemms" --gemms down,dx --shape $SHAPES --iters 20 --warmup 3 $cfg \
      > "$W/gemms_${v}_$round.txt" 2>&1
    rc=$?
    echo "round $round $v rc=$rc (t=$((SECONDS - T0)))"
    [ ${v:0:2} = pp ] && [ $rc -ge 124 ] && PP_OK=0
  done
done

SAN=ExpertGemms.DownDxOnTheGatherKernel
if [ $SMOKE -eq 124 ] || [ $SMOKE -eq 137 ]; then
  echo "== 2. skipped: the smoke test hung (t=$((SECONDS - T0)))"; R1=skip; R2=skip; R3=skip
  : > "$W/tests.txt"; : > "$W/memcheck.txt"; : > "$W/racecheck.txt"
else
  echo "== 2. ExpertGemms.* beside memcheck and racecheck (t=$((SECONDS - T0)))"
  timeout -k 5 180 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemms.*' > "$W/tests.txt" 2>&1 &
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
  echo "## ExpertGemms.* (rc=$R1; 124 = timeout)"; grep -E "PASSED|FAILED|Failure|error|got|tests ran" "$W/tests.txt" | head -40
  echo "## memcheck $SAN (rc=$R2)"; grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|Error" "$W/memcheck.txt" | head -20
  echo "## racecheck $SAN, gather kernel only (rc=$R3)"; grep -E "RACECHECK SUMMARY|PASSED|FAILED|Race|Hazard|rror|nrecognized|nknown" "$W/racecheck.txt" | head -20
} > "$FINAL/downtma_tests.txt"

python3 - "$W" > "$W/summary.txt" <<'EOF'
import sys, os
W = sys.argv[1]
V = ('default', 'cc2', 'pp2', 'pp1')
def rows(path):
    out = {}
    if not os.path.exists(path): return out
    for line in open(path):
        f = [x.strip() for x in line.split('|')[1:-1]]
        if len(f) == 11 and f[7] in ('down', 'dx'):
            try: out[f[0], f[7]] = (f[8], float(f[9]), float(f[10]))
            except ValueError: pass
    return out
runs = {(v, r): rows(f"{W}/gemms_{v}_{r}.txt") for v in V for r in (1, 2)}
keys = []
for d in runs.values():
    for k in d:
        if k not in keys: keys.append(k)
print("ms per run (r1 / r2); best = min over rounds; pp/def = best pingpong (c2 or c1) / default, pp/cc2 = / coop c2; < 1: pingpong faster")
print("| shape | GEMM | default kernel | default | coop c2 | pingpong c2 | pingpong c1 | pp/def | pp/cc2 |")
print("|---|---|---|---|---|---|---|---|---|")
tot = {'default': 0.0, 'cc2': 0.0, 'pp': 0.0}
for s, g in keys:
    cell, best = {}, {}
    kern = ''
    for v in V:
        ms = [runs[v, r].get((s, g), (None, None, None))[1] for r in (1, 2)]
        got = [m for m in ms if m is not None]
        cell[v] = ' / '.join('-' if m is None else f"{m:.3f}" for m in ms)
        best[v] = min(got) if got else None
        if v == 'default' and got: kern = next(runs['default', r][(s, g)][0] for r in (1, 2) if (s, g) in runs['default', r])
    pb = [best[v] for v in ('pp2', 'pp1') if best[v] is not None]
    pp = min(pb) if pb else None
    r_def = f"{pp / best['default']:.3f}" if pp and best['default'] else '-'
    r_cc = f"{pp / best['cc2']:.3f}" if pp and best['cc2'] else '-'
    if pp and best['default'] and best['cc2']:
        tot['default'] += best['default']; tot['cc2'] += best['cc2']; tot['pp'] += pp
    short = kern.replace('cutlass:', '').replace(':auto:tma', ':tma').replace(':m132', '')
    print(f"| {s} | {g} | {short} | {cell['default']} | {cell['cc2']} | {cell['pp2']} | {cell['pp1']} | {r_def} | {r_cc} |")
if tot['default']:
    print(f"| sum (best) | | | {tot['default']:.3f} | {tot['cc2']:.3f} | | {tot['pp']:.3f} | {tot['pp'] / tot['default']:.3f} | {tot['pp'] / tot['cc2']:.3f} |")
EOF
{ cat "$W/summary.txt"; for f in "$W"/gemms_*_*.txt; do echo "## $(basename $f)"; cat "$f"; done; } > "$FINAL/downtma_gemms.txt"
echo "== tests and sanitizers (t=$((SECONDS - T0)))"; cat "$FINAL/downtma_tests.txt"
echo "== summary (t=$((SECONDS - T0)))"; cat "$W/summary.txt"
