#!/usr/bin/env bash
# Builds leanmoe_bench_gemms of another commit (default: main) into .carry/bin/leanmoe_bench_gemms_base
# (and its commit into .carry/bin/base_commit), so that scripts/device_kernels.sh times both builds'
# GEMMs in one device call. A temporary git worktree, removed afterwards; a few minutes of nvcc.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
commit="$(git rev-parse --short=12 "${1:-main}")"
tree="$(mktemp -d)/base"
git worktree add --detach "$tree" "$commit" >&2
trap 'git worktree remove --force "$tree"' EXIT
cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLEANMOE_CUDA=ON -DLEANMOE_BUILD_TESTS=OFF \
  >"$tree/configure.log" 2>&1 || { cat "$tree/configure.log" >&2; exit 1; }
cmake --build "$tree/build" --target leanmoe_bench_gemms -j "$(nproc)" >&2
mkdir -p .carry/bin
cp "$tree/build/leanmoe_bench_gemms" .carry/bin/leanmoe_bench_gemms_base
echo "$commit" > .carry/bin/base_commit
echo "prepare_baseline_bench: .carry/bin/leanmoe_bench_gemms_base is $commit" >&2
