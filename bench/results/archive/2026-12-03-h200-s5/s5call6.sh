#!/usr/bin/env bash
# Session 5, call 6: dH with the producer's L2 prefetch of H at the tile's last k-tile (the default,
# commit cbd5a3339a40), without it, and 8 k-tiles before the end: three leanmoe_bench_gemms builds
# of the same commit differing only in that line (sm90_ws_grouped_gemm.cuh, prefetch_h_row_l2's call),
# two rounds, interleaved. The builds (.carry/w, git-ignored): bench_gemms_default = build-device/
# leanmoe_bench_gemms after `bash scripts/prepare_carry.sh`; bench_gemms_noprefetch with that call's
# condition `kt == tile.num_k - 1` made `false && kt == tile.num_k - 1`, bench_gemms_early8 with it made
# `kt == max(tile.num_k - 8, 0)` (each: `cmake --build build-device --target leanmoe_bench_gemms`);
# leanmoe_gpu_tests and tests_commit from .carry/bin. Carry [".carry/w", ".carry/blaslibs.tar.xz"].
set -uo pipefail
source scripts/device_env.sh
C=7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b,30B-n512
for round in 1 2; do for v in default noprefetch early8; do
  echo "### round $round $v"
  timeout 50 .carry/w/bench_gemms_$v --config $C --gemms dh --iters 20 2>&1 | grep '^| [0-9a-z]'
done; done > "$OUT/gemms_dh_prefetch.txt"
awk '/^###/{v=$NF} /^\| [0-9a-z]/ && $2!="config"{t[v]+=$(NF-3)} END{for (k in t) print k, t[k]}' "$OUT/gemms_dh_prefetch.txt" | sort | tee "$OUT/sums.txt"
grep -E "120B-n2048|7B-n256" "$OUT/gemms_dh_prefetch.txt"
# Then the GPU tests of the final commit (.carry/w/tests_commit: RoutingScratch's pointers default to null).
echo "== GPU tests ($(cat .carry/w/tests_commit))"
timeout 150 .carry/w/leanmoe_gpu_tests --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$OUT/gpu_tests.log" | tail -5
