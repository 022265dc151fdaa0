#!/usr/bin/env bash
# Builds this checkout's HEAD with patches applied, for a device call's carries (the prepare.sh of a
# bench/results/archive folder): a detached worktree of HEAD at /tmp/leanmoe-NAME (made afresh), the
# patches applied in the order given (absolute paths), and TARGETS built there by scripts/build.sh
# as the device runs them (build-device/: CUDA on, OpenBLAS linked in, as prepare_carry.sh builds).
# Usage: bash scripts/build_patched.sh NAME "TARGET [TARGET...]" [PATCH...]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ $# -ge 2 ] || { echo "usage: build_patched.sh NAME \"TARGET...\" [PATCH...]" >&2; exit 2; }
name=$1 targets=$2
shift 2
wt=/tmp/leanmoe-$name
git worktree remove --force "$wt" 2> /dev/null || rm -rf "$wt"
git worktree add --detach "$wt" HEAD > /dev/null
for p in "$@"; do git -C "$wt" apply "$p"; done
LEANMOE_BUILD_DIR=build-device LEANMOE_CUDA=ON LEANMOE_TARGETS="$targets" bash "$wt/scripts/build.sh" \
  -DLEANMOE_STATIC_BLAS=ON
