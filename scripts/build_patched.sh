#!/usr/bin/env bash
# Builds this checkout's HEAD with patches applied, for a device call's carries (the prepare.sh of a
# bench/results/archive folder): a detached worktree of HEAD at /tmp/leanmoe-NAME (made afresh), the
# patches applied in the order given (absolute paths), configured as the device runs it (Release,
# CUDA for sm_90a, OpenBLAS linked in, CUTLASS from the nvidia-cutlass wheel, NCCL from the toolkit;
# ccache when installed, shared between worktrees) and TARGETS built in its build-device/.
# Usage: bash scripts/build_patched.sh NAME "TARGET [TARGET...]" [PATCH...]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ $# -ge 2 ] || { echo "usage: build_patched.sh NAME \"TARGET...\" [PATCH...]" >&2; exit 2; }
name=$1 targets=$2
shift 2
cutlass="$(python3 -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))')/source"
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
wt=/tmp/leanmoe-$name
git worktree remove --force "$wt" 2> /dev/null || rm -rf "$wt"
git worktree add --detach "$wt" HEAD > /dev/null
for p in "$@"; do git -C "$wt" apply "$p"; done
cd "$wt"
export CCACHE_BASEDIR="$wt"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DLEANMOE_CUDA=ON -DLEANMOE_STATIC_BLAS=ON \
  -DLEANMOE_CUTLASS_DIR="$cutlass" -DLEANMOE_NCCL_INCLUDE=/usr/local/cuda/include \
  -DLEANMOE_NCCL_LIBRARY=/usr/local/cuda/lib/libnccl.so "${launcher[@]}" > /dev/null
# shellcheck disable=SC2086  # TARGETS split into words
ninja -C build-device $targets
