#!/usr/bin/env bash
# Session 12, device call 2a: SonicMoE alone travels (the leanmoe binary with it exceeds the 64 MiB carry):
# copied to /tmp/sonic_carry and installed into /tmp/site, which the warm machine keeps for call 2.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
mkdir -p /tmp/sonic_carry /tmp/site && cp -r .carry/sonicmoe/. /tmp/sonic_carry/ &&
  tar xJf /tmp/sonic_carry/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/sonic_carry/*.whl && echo installed
ls /tmp/site | head; du -sh /tmp/site
