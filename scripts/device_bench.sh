#!/usr/bin/env bash
# The one command for the GPU machine (after scripts/prepare_carry.sh here, carrying .carry):
# builds leanmoe with the CUDA backend, runs the grid, runs the PyTorch anchor on the same GPU, and
# writes $OUT/results.md (plus leanmoe.json, baseline.json and logs). Extra arguments go to
# `leanmoe bench`, e.g. --iters 10. SKIP_ANCHOR=1 skips the anchor (e.g. to fit a 10-minute call);
# GRID=0 drops --grid (then pass --config NAME for a quick single-shape run).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT="${OUT:-$PWD/build/device-out}"
mkdir -p "$OUT"
rm -f "$OUT/leanmoe.json" "$OUT/baseline.json" "$OUT/results.md"  # never compare a stale file
cutlass="$PWD/.carry/cutlass"
if [ ! -f "$cutlass/include/cutlass/cutlass.h" ]; then
  echo "device_bench: $cutlass is missing: run bash scripts/prepare_carry.sh first and carry .carry" >&2
  exit 1
fi
commit="$(cat .carry/commit 2>/dev/null || git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"

# Build: only the CLI (no GoogleTest needed there); the build folder survives between warm calls.
start=$SECONDS
LEANMOE_CUDA=ON bash scripts/build.sh -DLEANMOE_CUTLASS_DIR="$cutlass" -DLEANMOE_BUILD_TESTS=OFF \
  >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "device_bench: built in $((SECONDS - start)) s" >&2
"$BUILD_DIR/leanmoe" version >&2

grid=(--grid)
[ "${GRID:-1}" = 1 ] || grid=()
cmd="leanmoe bench${grid[*]:+ ${grid[*]}} --json leanmoe.json $*"
"$BUILD_DIR/leanmoe" bench "${grid[@]}" --json "$OUT/leanmoe.json" "$@" | tee "$OUT/leanmoe.txt" ||
  echo "device_bench: leanmoe bench reported failures (see leanmoe.txt)" >&2
[ -f "$OUT/leanmoe.json" ] || { echo "device_bench: leanmoe wrote no JSON" >&2; exit 1; }

anchor_args=()
if [ "${SKIP_ANCHOR:-0}" != 1 ]; then
  NO_LOOP=1 OUT="$OUT" PYTHONUNBUFFERED=1 python3 .carry/torch_moe_baseline.py >"$OUT/baseline.log" 2>&1 ||
    { echo "device_bench: the anchor failed, see baseline.log" >&2; tail -20 "$OUT/baseline.log" >&2; }
  [ -f "$OUT/baseline.json" ] && anchor_args=(--anchor "$OUT/baseline.json")
  cmd="$cmd; NO_LOOP=1 python3 torch_moe_baseline.py"
fi
python3 bench/compare.py --leanmoe "$OUT/leanmoe.json" "${anchor_args[@]}" --command "$cmd" --commit "$commit" \
  --out "$OUT/results.md"
cat "$OUT/results.md"
