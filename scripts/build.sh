#!/usr/bin/env bash
# Configures and builds leanmoe (Release, Ninja) into ./build (or $LEANMOE_BUILD_DIR).
# The CUDA backend is built whenever nvcc exists (LEANMOE_CUDA=AUTO); extra arguments go to cmake.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mkdir -p "$BUILD_DIR"
if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLEANMOE_CUDA="${LEANMOE_CUDA:-AUTO}" "$@" \
    >"$BUILD_DIR/configure.log" 2>&1; then
  cat "$BUILD_DIR/configure.log" >&2
  exit 1
fi
grep -h "leanmoe:" "$BUILD_DIR/configure.log" >&2 || true
cmake --build "$BUILD_DIR" -j "$(nproc)"
