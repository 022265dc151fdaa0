#!/usr/bin/env bash
# Session 44: everything the next device session carries, in one command on a CPU machine with nvcc
# (about 35 min cold on 2 cores, most of it the two builds of expert_gemms.cu), from this checkout's
# HEAD and the patches:
#   main  HEAD as it is (the base);
#   all   HEAD + s42's chunk.patch, fp8alt.patch, fwdgroups.patch + this folder's pingpong.patch.
#         They touch disjoint code or add kernels beside the default ones (CUTLASS's tile scheduler
#         for down / dx; the gather kernel's FP8 mainloop; the bf16 forward's orchestration, off
#         unless `--fwd-overlap G[:S]`; ping-pong up / dH, run only where a configuration names it:
#         the cooperative kernels' SASS is unchanged by it), so one build serves every A/B.
# Into .carry/s44 (call.sh): fp8p, eob (the dev benches), bg_c1 / bg_all (leanmoe_bench_gemms),
# gt_all (leanmoe_gpu_tests), commit. Into .carry/s44_layer: leanmoe_all (the CLI). Into .carry/vs
# and .carry/sonicmoe (scripts/prepare_carry.sh vs-sonic): the H200 side-by-side beside SonicMoE
# (bench/vs_sonic.sh; README).
# Usage: bash bench/results/archive/2026-12-08-cpu-s44/prepare.sh   (ccache is used when installed)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
s42="$root/bench/results/archive/2026-12-07-cpu-s42"
cd "$root"
bash scripts/install-deps.sh
head="$(git rev-parse --short HEAD)"
rm -rf .carry/s44 .carry/s44_layer
mkdir -p .carry/s44 .carry/s44_layer
pack() { xz -T2 -6 -c "$1" > "$2"; }

bash scripts/build_patched.sh s44-main "leanmoe leanmoe_bench_gemms leanmoe_dev_fp8_promotion leanmoe_dev_epilogue_overlap"
m=/tmp/leanmoe-s44-main/build-device
pack $m/leanmoe_bench_gemms .carry/s44/bg_c1.xz
pack $m/leanmoe_dev_fp8_promotion .carry/s44/fp8p.xz
pack $m/leanmoe_dev_epilogue_overlap .carry/s44/eob.xz
bash scripts/build_patched.sh s44-all "leanmoe leanmoe_bench_gemms leanmoe_gpu_tests" \
  "$s42/chunk.patch" "$s42/fp8alt.patch" "$s42/fwdgroups.patch" "$here/pingpong.patch"
a=/tmp/leanmoe-s44-all/build-device
pack $a/leanmoe_bench_gemms .carry/s44/bg_all.xz
pack $a/tests/leanmoe_gpu_tests .carry/s44/gt_all.xz
pack $a/leanmoe .carry/s44_layer/leanmoe_all.xz
echo "main $head; all = $head + s42's chunk.patch, fp8alt.patch, fwdgroups.patch + s44's pingpong.patch" \
  > .carry/s44/commit
cp "$here/call.sh" .carry/s44/call.sh
# The side-by-side's carry as scripts/prepare_carry.sh makes it, with s21's SonicMoE cache (214
# files) as the cache that came back; its CLI is main's from ./build-device (ccache: the build above's).
cp bench/results/archive/2026-12-05-h100-s21/quack_cache.tar.xz .carry/quack_cache.tar.xz
LEANMOE_TARGETS=leanmoe bash scripts/prepare_carry.sh vs-sonic
du -sh .carry/s44 .carry/s44_layer .carry/vs .carry/sonicmoe
