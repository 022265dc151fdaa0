#!/usr/bin/env bash
# Session 33 (prepared for the next session), on a warm machine after `SETUP=1 CONFIGS=$ROWS DEADLINE=280
# bash bench/vs_sonic.sh`: beside SonicMoE at the steady state on ROWS, one traced round (per-kernel
# medians, TRACE=) and, as time allows, untraced rounds (the tables); main's whole GPU suite and the dW
# sanitizers first only when .carry/fin is carried (s32's vs_call.sh with the suite made optional).
# Carry [".carry/vs"] (scripts/prepare_carry.sh vs-sonic) and optionally ".carry/fin" (xz of
# build-device's leanmoe_gpu_tests and the commit). Returns runs.tar.gz and the side-by-side tables.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
ROWS="${ROWS:-120B-n2048,30B-n1024,olmoe-1b-7b,gpt-oss-20b}"
FINAL="${OUT:-/tmp/leanmoe-out}"; W="$(mktemp -d)"; mkdir -p "$FINAL" "$W/traced" "$W/untraced"
trap 'tar czf "$FINAL/runs.tar.gz" -C "$W" --exclude=gt .; cp "$W"/traced/side_by_side_r1.md "$FINAL/traced_side_by_side.md" 2>/dev/null; for f in "$W"/untraced/side_by_side_r*.md; do [ -f "$f" ] && cp "$f" "$FINAL/untraced_$(basename "$f")"; done' EXIT
echo "$(cat .carry/vs/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
if [ -f .carry/fin/leanmoe_gpu_tests.xz ]; then
  xz -dc .carry/fin/leanmoe_gpu_tests.xz > "$W/gt" && chmod +x "$W/gt"
  timeout 220 "$W/gt" > "$W/gpu_tests.log" 2>&1
  echo "suite rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$W/gpu_tests.log" | tr '\n' ' ') (t=$SECONDS)"
  grep -E '^\[  FAILED  \]' "$W/gpu_tests.log" | head -5
  DW=ExpertGemms.DwStoresSameBitsOnAnyGrid:ExpertGemms.TransposedWeights
  timeout 90 compute-sanitizer --tool memcheck "$W/gt" --gtest_filter=$DW > "$W/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$W/memcheck.log" | tail -1) (t=$SECONDS)"
  timeout 90 compute-sanitizer --tool racecheck "$W/gt" --gtest_filter=$DW > "$W/racecheck.log" 2>&1
  echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$W/racecheck.log" | tail -1) (t=$SECONDS)"
  rm -f "$W/gt"
fi
OUT="$W/traced" SONIC_CARRY=/tmp/sonic_carry STEADY=1 ROUNDS=1 TRACE=.carry/vs/trace/libkernel_trace.so CONFIGS="$ROWS" \
  DEADLINE=$((${TRACED_BY:-420} - SECONDS)) bash bench/vs_sonic.sh 2>&1 | tail -40
echo "traced done t=$SECONDS"
left=$((${BUDGET:-580} - SECONDS))
if [ "$left" -gt 150 ]; then
  OUT="$W/untraced" SONIC_CARRY=/tmp/sonic_carry STEADY=1 ROUNDS=${UNTRACED_ROUNDS:-1} CONFIGS="$ROWS" DEADLINE=$((left - 10)) \
    bash bench/vs_sonic.sh 2>&1 | tail -25
fi
echo "done t=$SECONDS"
