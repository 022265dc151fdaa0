# Sourced by the other scripts: strict mode, the repository root as cwd, nvcc on PATH when installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${LEANMOE_BUILD_DIR:-build}"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# On VMs OpenBLAS may not recognise the CPU and fall back to its SSE3 "Prescott" kernels (measured
# 1.5-2.6x slower on this project's 2-core VM). Benchmarks call this to pick the kernels from the
# CPU flags unless the environment already chose; tests and CI leave OpenBLAS's choice alone.
pick_openblas_kernels() {
  if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
    fi
  fi
}
