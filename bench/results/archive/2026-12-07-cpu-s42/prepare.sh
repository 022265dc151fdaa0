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
cutlass="$(python3 -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))')/source"
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
head="$(git rev-parse --short HEAD)"
mkdir -p .carry/s42 .carry/s42_layer

# build NAME PATCH...: a detached worktree of HEAD under /tmp with the patches applied, built.
build() {
  local name=$1 wt=/tmp/leanmoe-s42-$1 p
  shift
  git worktree remove --force "$wt" 2> /dev/null || rm -rf "$wt"
  git worktree add --detach "$wt" HEAD > /dev/null
  for p in "$@"; do git -C "$wt" apply "$here/$p"; done
  (
    cd "$wt"
    export CCACHE_BASEDIR="$wt"
    cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DLEANMOE_CUDA=ON -DLEANMOE_STATIC_BLAS=ON \
      -DLEANMOE_CUTLASS_DIR="$cutlass" -DLEANMOE_NCCL_INCLUDE=/usr/local/cuda/include \
      -DLEANMOE_NCCL_LIBRARY=/usr/local/cuda/lib/libnccl.so "${launcher[@]}" > /dev/null
    ninja -C build-device leanmoe leanmoe_bench_gemms leanmoe_gpu_tests
  )
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
