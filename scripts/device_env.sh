# Sourced on the device machine by the device scripts (scripts/device_*.sh, scripts/device_call.sh, archive call scripts),
# from the repository root: puts OpenBLAS (carried xz-packed in .carry/blaslibs.tar.xz, which
# scripts/prepare_carry.sh makes; the image has none and the binaries link it) and NCCL (the
# toolkit's copy where the image has one, else the nvidia-nccl wheel's) on LD_LIBRARY_PATH.
# Binaries linked with -DLEANMOE_STATIC_BLAS=ON need none of it; the python front built there does.
if [ -f .carry/blaslibs.tar.xz ]; then
  mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
fi
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
