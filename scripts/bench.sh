#!/usr/bin/env bash
# Installs, builds, then benchmarks one layer on the best available device:
#   bash scripts/bench.sh [leanmoe bench options]   (see ./build/leanmoe --help)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bash scripts/install-deps.sh
bash scripts/build.sh >&2
pick_openblas_kernels
exec "$BUILD_DIR/leanmoe" bench "$@"
