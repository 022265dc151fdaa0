#!/usr/bin/env bash
# Builds libkernel_trace.so into $1 (default build-trace) with the CUDA toolkit's CUPTI copied beside
# it (found through $ORIGIN: the GPU machine need not have CUPTI on its library path).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-build-trace}"; mkdir -p "$out"
cuda="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
lib="$(ls "$cuda"/lib64/libcupti.so.* "$cuda"/lib/libcupti.so.* "$cuda"/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null |
       grep -E 'libcupti\.so\.[0-9]+$' | head -1 || true)"
[ -n "$lib" ] || { echo "kernel_trace: no libcupti.so.N under $cuda" >&2; exit 1; }
inc="$cuda/include"; [ -f "$inc/cupti.h" ] || inc="$cuda/extras/CUPTI/include"
g++ -std=c++17 -O2 -Wall -Wextra -shared -fPIC -I"$inc" "$here/kernel_trace.cpp" -o "$out/libkernel_trace.so" \
  "$lib" -Wl,-rpath,'$ORIGIN' -pthread
cp -L "$lib" "$out/"
echo "kernel_trace: $out/libkernel_trace.so (CUPTI: $(basename "$lib"))" >&2
