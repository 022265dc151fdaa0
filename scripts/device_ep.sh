#!/usr/bin/env bash
# Issue #6's expert-parallel weak-scaling benchmark on a multi-GPU device machine (nvidia-h200-x2,
# -x4 or -x8), with the binary built on the dev machine and carried in .carry/bin (scripts/
# prepare_carry.sh copies leanmoe_bench_ep there) plus .carry/blaslibs.tar.xz (OpenBLAS, which the
# binary links). Runs leanmoe_bench_ep for P = 1, 2, 4, 8 (those <= the GPUs present) on
# olmoe-1b-7b (E 64, the issue's shape) and qwen3-30b-a3b (E 128, narrower experts n 768: less
# compute per routed byte, so communication weighs more), 4096 tokens per rank (the tool's default
# T/8). Writes into $OUT: ep/<config>/ep_scaling.{md,json}, ep/gpu.txt (nvidia-smi and the GPU
# topology: NVLink or PCIe decides the all-to-all bandwidth) and ep/ep.log. A few minutes at most:
# each config has a 240 s limit (NCCL init per P plus 25 steps of a few ms each).
# ITERS / WARMUP / TOKENS override the step counts and the tokens per rank; BIN the binaries' folder
# (default .carry/bin).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# NVLink multicast stays off (the device machines' rule); the tool also sets the first one itself.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG="${NCCL_DEBUG:-VERSION}"  # NCCL prints its version into the log
R="${OUT:-/tmp/leanmoe-out}/ep"; mkdir -p "$R"
source scripts/device_env.sh  # OpenBLAS and NCCL on LD_LIBRARY_PATH
B="${BIN:-.carry/bin}"
commit="$(cat $B/commit 2>/dev/null || echo unknown)"
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv; nvidia-smi topo -m; } >"$R/gpu.txt" 2>&1
cat "$R/gpu.txt"
gpus=$(nvidia-smi -L | grep -c '^GPU')
ranks=""; for p in 1 2 4 8; do [ "$p" -le "$gpus" ] && ranks="$ranks${ranks:+,}$p"; done
echo "== $gpus GPU(s): ranks $ranks, commit $commit"
status=0
for c in olmoe-1b-7b qwen3-30b-a3b; do
  echo "== $c"
  timeout 240 $B/leanmoe_bench_ep --device cuda --ranks "$ranks" --config "$c" --iters "${ITERS:-20}" \
    --warmup "${WARMUP:-5}" ${TOKENS:+--tokens-per-rank $TOKENS} --commit "$commit" --out "$R/$c" >>"$R/ep.log" 2>&1
  rc=$?; echo "$c rc=$rc"; [ "$rc" = 0 ] || status=1
  cat "$R/$c/ep_scaling.md" 2>/dev/null || tail -20 "$R/ep.log"
done
exit $status
