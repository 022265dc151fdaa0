#!/usr/bin/env bash
# Fills .carry/ (git-ignored) with what the device scripts need on the GPU machine, which has no
# network. Two modes:
#
#   bash scripts/prepare_carry.sh            CUTLASS's headers (from the nvidia-cutlass wheel, ~28 MB),
#                                            the PyTorch anchor script and the commit, for
#                                            scripts/device_bench.sh (builds there; carry [".carry"]);
#                                            and binaries built here in build-device for
#                                            scripts/device_all.sh / device_ep.sh (see the end).
#   bash scripts/prepare_carry.sh vs-sonic   exactly the carry of bench/vs_sonic.sh: .carry/vs (the
#                                            leanmoe binary xz-packed, the commit, the anchor script,
#                                            SonicMoE's compiled-kernel cache when one came back and
#                                            fits), .carry/sonicmoe (a copy of ../shared/anchors/sonicmoe)
#                                            (the binary has OpenBLAS linked in); checks the 64 MiB limit
#                                            and, when the two exceed it together, prints the carry of
#                                            two calls (SonicMoE with SETUP=1, then leanmoe); and
#                                            .carry/vs/trace (dev/kernel_trace, for TRACE=).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mode="${1:-all}"
[ "$mode" = all ] || [ "$mode" = vs-sonic ] || { echo "prepare_carry: mode must be empty or 'vs-sonic', got '$mode'" >&2; exit 2; }
anchor="${LEANMOE_ANCHOR:-../shared/anchors/torch_moe_baseline.py}"
[ -f "$anchor" ] || { echo "prepare_carry: anchor script not found at $anchor (set LEANMOE_ANCHOR)" >&2; exit 1; }
commit="$(git rev-parse --short=12 HEAD)"
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit+dirty"
mkdir -p .carry

if [ "$mode" = all ]; then
  if ! src="$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))" 2>/dev/null)"; then
    echo "prepare_carry: the nvidia-cutlass wheel is missing: python3 -m pip install nvidia-cutlass" >&2
    exit 1
  fi
  # Copied again only when the wheel's version differs (others may be building from this copy).
  if ! cmp -s "$src/include/cutlass/version.h" .carry/cutlass/include/cutlass/version.h 2>/dev/null; then
    rm -rf .carry/cutlass
    mkdir -p .carry/cutlass/tools/util
    cp -r "$src/include" .carry/cutlass/include
    cp -r "$src/tools/util/include" .carry/cutlass/tools/util/include
  fi
  cp "$anchor" .carry/torch_moe_baseline.py
  echo "$commit" > .carry/commit
  echo "prepare_carry: .carry/ holds CUTLASS ($(du -sh .carry/cutlass | cut -f1)), the anchor script, commit $commit" >&2
fi

# Binaries built here with the CUDA backend, OpenBLAS linked in statically (the H200's image has
# none), and OpenBLAS's shared libraries xz-packed (36 MB -> 5 MB) for the python front built there.
LEANMOE_BUILD_DIR=build-device LEANMOE_CUDA=ON bash scripts/build.sh -DLEANMOE_STATIC_BLAS=ON >&2
# No early exit in awk: under pipefail, ldconfig writing into a closed pipe fails the script (rc 141).
blas="$(ldconfig -p | awk '/libopenblas\.so\.0 / && !found {print $NF; found = 1}')"
libs="$(mktemp -d)"
# shellcheck disable=SC2046  # one path per library
cp -L "$blas" $(ldd "$blas" | awk '/gfortran|quadmath/{print $3}') "$libs/"
tar cJf .carry/blaslibs.tar.xz -C "$libs" . && rm -rf "$libs"

if [ "$mode" = all ]; then
  # For scripts/device_all.sh: carry [".carry/bin", ".carry/blaslibs.tar.xz", ".carry/torch_moe_baseline.py"]
  # and run `bash scripts/device_all.sh`; on a multi-GPU kind, carry [".carry/bin", ".carry/blaslibs.tar.xz"]
  # and run `bash scripts/device_ep.sh` (EP weak scaling).
  mkdir -p .carry/bin
  cp build-device/leanmoe build-device/leanmoe_bench_inbackward build-device/leanmoe_bench_gemms build-device/leanmoe_bench_ep \
     build-device/tests/leanmoe_gpu_tests \
     build-device/libleanmoe.a .carry/bin/
  echo "$commit" > .carry/bin/commit
  echo "prepare_carry: .carry/bin and .carry/blaslibs.tar.xz ready for scripts/device_all.sh" >&2
  exit 0
fi

# vs-sonic: SonicMoE's wheels and benchmark (lb.tar.xz alone is 50 MB), so the leanmoe binary goes
# xz-packed and alone.
sonic="${LEANMOE_SONICMOE:-../shared/anchors/sonicmoe}"
[ -f "$sonic/sonic_bench.py" ] || { echo "prepare_carry: SonicMoE not found at $sonic (set LEANMOE_SONICMOE)" >&2; exit 1; }
if ! diff -rq "$sonic" .carry/sonicmoe >/dev/null 2>&1; then
  rm -rf .carry/sonicmoe && cp -r "$sonic" .carry/sonicmoe && chmod -R u+w .carry/sonicmoe
fi
# a cache carried before lives on in .carry/ (this folder is made anew)
[ -f .carry/vs/quack_cache.tar.xz ] && [ ! -f .carry/quack_cache.tar.xz ] && mv .carry/vs/quack_cache.tar.xz .carry/
rm -rf .carry/vs && mkdir -p .carry/vs
xz -T0 -9 -c build-device/leanmoe > .carry/vs/leanmoe.xz
echo "$commit" > .carry/vs/commit
cp "$anchor" .carry/vs/torch_moe_baseline.py
# For TRACE=.carry/vs/trace/libkernel_trace.so (bench/vs_sonic.sh): the injection library and its CUPTI.
bash dev/kernel_trace/build.sh .carry/vs/trace
# SonicMoE's kernel cache from an earlier call (bench/vs_sonic.sh writes quack_cache.tar.xz, or
# .partN pieces over 15 MiB, to $OUT): keep what came back in .carry/ and it is carried when it fits.
cache=""
if [ -f .carry/quack_cache.tar.xz ]; then cache=.carry/quack_cache.tar.xz
elif ls .carry/quack_cache.tar.xz.part* >/dev/null 2>&1; then
  cat .carry/quack_cache.tar.xz.part* > .carry/vs/quack_cache.tar.xz.joined && cache=.carry/vs/quack_cache.tar.xz.joined
fi
limit=$((64 * 1024 * 1024))
# What travels: tracked and untracked-not-ignored files, plus the carried paths, counted as the device
# tool counts them: in allocated 4 KiB blocks (by bytes the tree is 9.6 MiB, by blocks 12; session 26
# had a SETUP call refused that the byte count said would fit).
# Paths git lists but the tree lacks (bench/results/archive moved out for a big carry) count nothing.
blocks() { { xargs -0 du --block-size=1 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'; }
tree="$(git ls-files -z --cached --others --exclude-standard | blocks)"
archive="$(git ls-files -z --cached --others --exclude-standard bench/results/archive | blocks)"
vs="$(du -s --block-size=1 .carry/vs | cut -f1)"; son="$(du -s --block-size=1 .carry/sonicmoe | cut -f1)"
size=0; [ -n "$cache" ] && size="$(stat -c %s "$cache")"
keep_cache() {  # the cache goes to .carry/vs/quack_cache.tar.xz
  if [ "$cache" = .carry/quack_cache.tar.xz ]; then cp "$cache" .carry/vs/quack_cache.tar.xz  # the kept copy stays
  else mv "$cache" .carry/vs/quack_cache.tar.xz; fi
  echo "prepare_carry: SonicMoE's kernel cache ($((size / 1024)) KiB) is carried" >&2
}
drop_cache() {
  rm -f .carry/vs/quack_cache.tar.xz.joined
  echo "prepare_carry: SonicMoE's kernel cache ($((size / 1024 / 1024)) MiB) does not fit beside the rest" \
       "($(($1 / 1024 / 1024)) MiB of 64): not carried; SonicMoE compiles again (run the calls on a warm machine)" >&2
  size=0
}
total=$((tree + vs + son))
if [ "$size" -gt 0 ] && [ $((total + size)) -le "$limit" ]; then keep_cache; total=$((total + size))
elif [ "$size" -gt 0 ] && [ "$total" -le "$limit" ]; then drop_cache "$total"
fi
echo "prepare_carry: $((total / 1024 / 1024)) MiB travel (working tree $((tree / 1024)) KiB + carry), commit $commit" >&2
if [ "$total" -le "$limit" ]; then
  echo 'carry: [".carry/vs", ".carry/sonicmoe"]; command: bash bench/vs_sonic.sh (env: CONFIGS, ANCHOR, DEADLINE)'
  exit 0
fi
# SonicMoE's wheels and the leanmoe binary exceed the limit together: two calls on one warm machine,
# SonicMoE (installed into /tmp, its rows compiled) first, then leanmoe, which finds the install there.
[ "$size" -gt 0 ] && [ $((tree - archive + son + size)) -gt "$limit" ] && drop_cache $((tree - archive + son))
first=$((tree + son + size)); second=$((tree + vs))
# The archive's logs are what the SETUP call can leave behind: out of the tree for that call alone.
move=""
if [ "$first" -gt "$limit" ] && [ $((first - archive)) -le "$limit" ]; then
  move=" (bench/results/archive moved out of the tree)"
  first=$((first - archive))
fi
if [ "$first" -gt "$limit" ] || [ "$second" -gt "$limit" ]; then
  echo "prepare_carry: over the 64 MiB limit, also split in two calls ($((first / 1024 / 1024)) and" \
       "$((second / 1024 / 1024)) MiB)" >&2
  exit 1
fi
[ "$size" -gt 0 ] && keep_cache
echo "prepare_carry: over 64 MiB in one call: two calls on one warm machine, $((first / 1024 / 1024)) MiB$move then" \
     "$((second / 1024 / 1024)) MiB" >&2
echo "call 1: ${move:+mv bench/results/archive /tmp/leanmoe-archive; then }carry [\".carry/sonicmoe\"$([ "$size" -gt 0 ] && echo ', ".carry/vs/quack_cache.tar.xz"')];" \
     "command: SETUP=1 CONFIGS=<rows> bash bench/vs_sonic.sh (installs SonicMoE into /tmp, compiles the rows)${move:+; then mv /tmp/leanmoe-archive bench/results/archive}"
echo 'call 2 (within the idle time): carry [".carry/vs"]; command: SONIC_CARRY=/tmp/sonic_carry STEADY=1' \
     '[FP8=1] CONFIGS=<rows> bash bench/vs_sonic.sh'
