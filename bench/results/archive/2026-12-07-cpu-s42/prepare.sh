#!/usr/bin/env bash
# Session 42: builds what call.sh and layer_call.sh carry, on a CPU machine with nvcc (about 25 min
# on 2 cores, most of it the first build), from this checkout's HEAD and this folder's patches:
#   main  HEAD as it is (the base);
#   all   HEAD + chunk.patch + fp8alt.patch + fwdgroups.patch. They touch disjoint code (CUTLASS's
#         tile scheduler for down / dx; the gather kernel's FP8 mainloop for FP8 up / dH; the bf16
#         forward's orchestration, off unless `--fwd-overlap G[:S]`), so one build serves the three
#         A/Bs: its down / dx with `:dyn` are the chunks of 4, its FP8 up / dH the alternation, its
#         forward with --fwd-overlap the expert groups, and everything else is main's.
# Into .carry/s42 (call.sh; 36 MB): fp8p (dev/fp8_promotion_bench.cu), eob
# (dev/epilogue_overlap_bench.cu), bg_c1 / bg_all
# (leanmoe_bench_gemms), gt_all (leanmoe_gpu_tests), commit. Into .carry/s42_layer (24 MB;
# layer_call.sh and fwd_call.sh): leanmoe_main / leanmoe_all (the CLI), commit.
# Usage: bash bench/results/archive/2026-12-07-cpu-s42/prepare.sh   (ccache is used when installed)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
head="$(git rev-parse --short HEAD)"
mkdir -p .carry/s42 .carry/s42_layer

# build NAME PATCH...: HEAD with this folder's patches applied, built in /tmp/leanmoe-s42-NAME
# (scripts/build_patched.sh).
build() {
  local name=$1 p patches=()
  shift
  for p in "$@"; do patches+=("$here/$p"); done
  bash scripts/build_patched.sh "s42-$name" "leanmoe leanmoe_bench_gemms leanmoe_gpu_tests" "${patches[@]}"
}
pack() { xz -T2 -6 -c "$1" > "$2"; }

build main
pack /tmp/leanmoe-s42-main/build-device/leanmoe_bench_gemms .carry/s42/bg_c1.xz
pack /tmp/leanmoe-s42-main/build-device/leanmoe .carry/s42_layer/leanmoe_main.xz
build all chunk.patch fp8alt.patch fwdgroups.patch
pack /tmp/leanmoe-s42-all/build-device/leanmoe_bench_gemms .carry/s42/bg_all.xz
pack /tmp/leanmoe-s42-all/build-device/tests/leanmoe_gpu_tests .carry/s42/gt_all.xz
pack /tmp/leanmoe-s42-all/build-device/leanmoe .carry/s42_layer/leanmoe_all.xz
ninja -C /tmp/leanmoe-s42-main/build-device leanmoe_dev_fp8_promotion leanmoe_dev_epilogue_overlap
pack /tmp/leanmoe-s42-main/build-device/leanmoe_dev_fp8_promotion .carry/s42/fp8p.xz
pack /tmp/leanmoe-s42-main/build-device/leanmoe_dev_epilogue_overlap .carry/s42/eob.xz
for d in .carry/s42 .carry/s42_layer; do
  echo "main $head; all = $head + chunk.patch + fp8alt.patch + fwdgroups.patch (bench/results/archive/2026-12-07-cpu-s42)" > "$d/commit"
done
cp "$here/call.sh" .carry/s42/call.sh
cp "$here/layer_call.sh" .carry/s42_layer/call.sh
cp "$here/fwd_call.sh" .carry/s42_layer/fwd_call.sh
du -sh .carry/s42 .carry/s42_layer
