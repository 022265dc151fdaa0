# bwdgemm (issue 17): why the gather kernel's cluster kinds (dW1, dH, dW2) starve, four variants,
# none the default: feed split / wide, dW1 through dW2's 128x256 kernel stored transposed ("tt"),
# and the varlen-K tile order ("band"). Branch bwdgemm, commit in $CARRY/commit.
# Expected run time: ~4 minutes (GPU tests ~100 s, bench ~60 s: 5 configurations x 2 rounds x 4
# shapes, sanitizers ~60 s). Hard cap ~9.5 minutes: timeouts 200 + bench (no run started after
# 140 s in it, 60 s each) + 70 + 90 s; the bench runs before the sanitizers so that a slow
# sanitizer cannot cost it.
# Returns $FINAL/gpu_tests.log, $FINAL/sanitizers.log, $FINAL/bench.tgz (raw tables) and
# $FINAL/bwdgemm.txt (the summary table printed last).
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/bwdgemm_bin"; R="$W/bwdgemm_bench"; mkdir -p "$B" "$R"
xz -dc "$CARRY/bins.tar.xz" | tar xf - -C "$B" && chmod +x "$B"/leanmoe_gpu_tests "$B"/leanmoe_bench_gemms
echo "bwdgemm commit $(cat "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== (a) GPU tests: ExpertGemms.* (every compiled config incl. the variants, both layouts), GemmConfig, GemmHeuristics (t=${SECONDS})"
timeout 200 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' \
  > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$? (t=${SECONDS})"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | head -20
grep -B2 -A8 "Failure" "$W/gpu_tests.log" | head -40
cp "$W/gpu_tests.log" "$FINAL/"

echo "== (c) bench: dw1, dh, dw2 alone; default and 4 variants, A B C D E A B C D E (t=${SECONDS})"
SPLIT='dh=gather:coop:128x256:s4:warp:c2:split,dw2=gather:coop:128x256:s4:warp:c2:split,dw1=gather:coop:256x128:s4:warp:c2:split'
WIDE='dw2=gather:coop:128x256:s4:warp:c2:wide,dw1=gather:coop:256x128:s4:warp:c2:wide'
TT='dw1=gather:coop:128x256:s4:warp:c2'
BAND='dw2=gather:coop:128x256:s4:warp:c2:b1,dw1=gather:coop:256x128:s4:warp:c2:b2'
start=$SECONDS
for round in 1 2; do for v in base split wide tt band; do
  if [ $((SECONDS - start)) -gt 140 ]; then echo "skipped $v round $round (time)"; continue; fi
  case $v in base) cfg=();; split) cfg=(--config "$SPLIT");; wide) cfg=(--config "$WIDE");;
             tt) cfg=(--config "$TT");; band) cfg=(--config "$BAND");; esac
  timeout 60 "$B/leanmoe_bench_gemms" --shape 120B-n2048,30B-n512,7B-n256,olmoe-1b-7b --gemms dw1,dh,dw2 "${cfg[@]}" \
    > "$R/$v.$round.md" 2>&1 || { echo "FAILED $v round $round"; tail -3 "$R/$v.$round.md"; }
done; done
echo "bench done (t=${SECONDS})"
tar czf "$FINAL/bench.tgz" -C "$R" . 2>/dev/null

echo "== (b) sanitizers on the variants (ExpertGemms.BackwardFeeds: split, wide, tt on small cases) (t=${SECONDS})"
: > "$W/sanitizers.log"
for tool in memcheck racecheck; do
  echo "---- $tool" >> "$W/sanitizers.log"
  timeout $([ $tool = memcheck ] && echo 70 || echo 90) compute-sanitizer --tool $tool --print-limit 20 \
    "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemms.BackwardFeeds' >> "$W/sanitizers.log" 2>&1
  echo "$tool rc=$? (t=${SECONDS})"
done
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$W/sanitizers.log"
cp "$W/sanitizers.log" "$FINAL/"

python3 - "$R" > "$W/bwdgemm.txt" <<'EOF'
import os, sys
d = sys.argv[1]
ms = {}  # (shape, gemm, variant) -> [ms per round]
kern = {}
for f in sorted(os.listdir(d)):
    if not f.endswith(".md"): continue
    v, rnd, _ = f.split(".")
    for line in open(os.path.join(d, f)):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) != 11 or c[0] in ("shape", "---"): continue
        try: t = float(c[9])
        except ValueError: continue
        ms.setdefault((c[0], c[7], v), {})[rnd] = t
        kern[(c[7], v)] = c[8]
variants = ["base", "split", "wide", "tt", "band"]
print("ms per launch, median of 20, rounds r1/r2; d% = mean vs base mean (negative: faster)")
for g in ("dw1", "dh", "dw2"):
    print(f"  {g}: " + "; ".join(f"{v} {kern[(g, v)]}" for v in variants if (g, v) in kern))
print(f"{'shape':12} {'gemm':4} " + " ".join(f"{v:>21}" for v in variants))
for shape in ["120B-n2048", "30B-n512", "7B-n256", "olmoe-1b-7b"]:
    for g in ["dw1", "dh", "dw2"]:
        base = ms.get((shape, g, "base"), {})
        bm = sum(base.values()) / len(base) if base else None
        cells = []
        for v in variants:
            r = ms.get((shape, g, v))
            if not r: cells.append("-"); continue
            m = sum(r.values()) / len(r)
            dp = "" if v == "base" else (f"{100 * (m / bm - 1):+.1f}%" if bm else "?")
            cells.append(f"{r.get('1', 0):.3f}/{r.get('2', 0):.3f} {dp}")
        print(f"{shape:12} {g:4} " + " ".join(c.rjust(21) for c in cells))
EOF
cp "$W/bwdgemm.txt" "$FINAL/"
echo "== summary (t=${SECONDS})"
grep -E "tests ran|PASSED|FAILED" "$W/gpu_tests.log" | head -5
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$W/sanitizers.log"
cat "$W/bwdgemm.txt"
