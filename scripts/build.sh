#!/usr/bin/env bash
# Configures and builds leanmoe (Release, Ninja) into ./build (or $LEANMOE_BUILD_DIR).
# The CUDA backend is built whenever nvcc exists (LEANMOE_CUDA=AUTO); extra arguments go to cmake.
# LEANMOE_TARGETS (space-separated) builds only those targets instead of all.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# ccache, when installed, caches the compiles, with paths taken relative to the checkout: a worktree
# elsewhere (scripts/build_patched.sh) reuses what this one compiled.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$PWD"
fi

mkdir -p "$BUILD_DIR"
if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLEANMOE_CUDA="${LEANMOE_CUDA:-AUTO}" "${launcher[@]}" "$@" \
    >"$BUILD_DIR/configure.log" 2>&1; then
  cat "$BUILD_DIR/configure.log" >&2
  exit 1
fi
grep -h "leanmoe:" "$BUILD_DIR/configure.log" >&2 || true
targets=()
# shellcheck disable=SC2206  # the target names split into words
[ -z "${LEANMOE_TARGETS:-}" ] || targets=(--target $LEANMOE_TARGETS)
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
