#!/usr/bin/env bash
# Session 11, device call 5 (issues 15, 17). Main 8b487d0 (.carry/s11c: leanmoe, leanmoe_gpu_tests; token
# rounding's metadata at 8 tokens per warp and round_tokens' warp bin search): (a) routing GPU tests +
# memcheck/racecheck on the token-rounding ones; (b) bench/token_rounding_speed.py on the four sparse rows,
# one round; (c) helper branch bwdgemm's fragment (.carry/bwdgemm) when carried: backward feed variants.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=bin --exclude=bwdgemm . 2>/dev/null' EXIT
source scripts/device_env.sh
mkdir -p "$W/bin"
for f in leanmoe leanmoe_gpu_tests; do xz -dc .carry/s11c/$f.xz > "$W/bin/$f" && chmod +x "$W/bin/$f"; done
echo "main $(cat .carry/s11c/commit)"
echo "== (a) routing GPU tests (t=${SECONDS})"
timeout 120 "$W/bin/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='CudaRouting*:GemmHeuristics*:GemmConfig*' \
  > "$W/routing_tests.log" 2>&1; echo "rc=$?"; grep -E "PASSED|FAILED|tests ran" "$W/routing_tests.log"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool --print-limit 20 "$W/bin/leanmoe_gpu_tests" --gtest_brief=1 \
    --gtest_filter='CudaRouting.TokenRounding*' > "$W/routing_$tool.log" 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$W/routing_$tool.log"
done
if [ -d .carry/bwdgemm ]; then
  echo "== (c) bwdgemm (t=${SECONDS})"; mkdir -p "$W/bwdgemm"
  CARRY=.carry/bwdgemm W="$W/bwdgemm" FINAL="$FINAL" timeout 300 bash bench/results/archive/2026-12-04-h200-s11/bwdgemm.device.sh \
    > "$W/bwdgemm.log" 2>&1; echo "rc=$?"; tail -45 "$W/bwdgemm.log"
fi
echo "== (b) token rounding speed (t=${SECONDS})"
timeout $((560 - SECONDS)) python3 bench/token_rounding_speed.py --leanmoe "$W/bin/leanmoe" --out "$W/speed" --rounds 1 \
  --budget-s 120 --timeout 45 > "$W/speed.log" 2>&1; echo "rc=$?"
python3 bench/token_rounding_speed.py --from "$W/speed" > "$FINAL/token_rounding_speed.md" 2>/dev/null
grep -E "^## |^\| (topk|nearest|up|down|balanced) |bound [0-9]" "$FINAL/token_rounding_speed.md" | head -40
echo "done (t=${SECONDS})"
