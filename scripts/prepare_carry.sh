#!/usr/bin/env bash
# Fills .carry/ (git-ignored) with what scripts/device_bench.sh needs on the GPU machine, which
# has no network: CUTLASS's headers (from the nvidia-cutlass wheel, ~28 MB), the PyTorch anchor
# script, and the commit being measured. Then: device run with carry [".carry"] and the command
# `bash scripts/device_bench.sh` (builds there), or see the end of this file for device_all.sh.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
anchor="${LEANMOE_ANCHOR:-../shared/anchors/torch_moe_baseline.py}"

if ! src="$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))" 2>/dev/null)"; then
  echo "prepare_carry: the nvidia-cutlass wheel is missing: python3 -m pip install nvidia-cutlass" >&2
  exit 1
fi
[ -f "$anchor" ] || { echo "prepare_carry: anchor script not found at $anchor (set LEANMOE_ANCHOR)" >&2; exit 1; }

# Copied again only when the wheel's version differs (others may be building from this copy).
if ! cmp -s "$src/include/cutlass/version.h" .carry/cutlass/include/cutlass/version.h 2>/dev/null; then
  rm -rf .carry/cutlass
  mkdir -p .carry/cutlass/tools/util
  cp -r "$src/include" .carry/cutlass/include
  cp -r "$src/tools/util/include" .carry/cutlass/tools/util/include
fi
cp "$anchor" .carry/torch_moe_baseline.py
commit="$(git rev-parse --short=12 HEAD)"
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit+dirty"
echo "$commit" > .carry/commit
echo "prepare_carry: .carry/ holds CUTLASS ($(du -sh .carry/cutlass | cut -f1)), the anchor script, commit $commit" >&2

# For scripts/device_all.sh: binaries built here with the CUDA backend (they run on the H200, whose
# image has no OpenBLAS for the CPU reference), and OpenBLAS with its runtime libraries, xz-packed
# (36 MB -> 5 MB) to stay inside the 64 MiB carry limit. Then: carry [".carry/bin",
# ".carry/blaslibs.tar.xz", ".carry/torch_moe_baseline.py"] and run `bash scripts/device_all.sh`;
# on a multi-GPU kind, carry [".carry/bin", ".carry/blaslibs.tar.xz"] and run `bash scripts/device_ep.sh`
# (EP weak scaling).
LEANMOE_BUILD_DIR=build-device LEANMOE_CUDA=ON bash scripts/build.sh >&2
mkdir -p .carry/bin
cp build-device/leanmoe build-device/leanmoe_bench_inbackward build-device/leanmoe_bench_gemms build-device/leanmoe_bench_ep \
   build-device/tests/leanmoe_gpu_tests \
   build-device/libleanmoe.a .carry/bin/
echo "$commit" > .carry/bin/commit
blas="$(ldd build-device/leanmoe | awk '/libopenblas/{print $3}')"
libs="$(mktemp -d)"
cp -L "$blas" $(ldd "$blas" | awk '/gfortran|quadmath/{print $3}') "$libs/"
tar cJf .carry/blaslibs.tar.xz -C "$libs" . && rm -rf "$libs"
echo "prepare_carry: .carry/bin and .carry/blaslibs.tar.xz ready for scripts/device_all.sh" >&2
