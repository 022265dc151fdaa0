#!/usr/bin/env bash
# Installs what building and testing leanmoe needs on a fresh Debian/Ubuntu machine.
# Idempotent and quiet: apt runs only when a package is missing, pip only when CUTLASS is.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

packages=(cmake ninja-build g++ libopenblas-dev libgtest-dev)
have_nvcc=0
command -v nvcc >/dev/null 2>&1 && have_nvcc=1
if ((have_nvcc)) && ! python3 -m pip --version >/dev/null 2>&1; then packages+=(python3-pip); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "install-deps: apt-get install ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The CUDA backend compiles against CUTLASS's headers, which the nvidia-cutlass wheel carries.
if ((have_nvcc)) && ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('cutlass_library') is None)" 2>/dev/null; then
  echo "install-deps: pip install nvidia-cutlass" >&2
  # A Debian system python refuses plain installs (PEP 668): then a user install.
  python3 -m pip install -q nvidia-cutlass 2>/dev/null ||
    python3 -m pip install -q --user --break-system-packages nvidia-cutlass
fi
