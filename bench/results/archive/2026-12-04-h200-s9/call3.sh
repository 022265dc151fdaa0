#!/usr/bin/env bash
# Session 9, device call 3 (one H200): branch dhepi (dH epilogues tmah: H loaded by TMA into the
# pipeline stages after the tile's last k-tile; tmahs: tmah + TMA stores of dH and A'): GPU tests,
# memcheck + racecheck, dH A/B warp vs tmah vs tmahs on 6 shapes (call3_dhepi.sh, the helper's
# fragment). Carry: .carry/dhepi (binaries, xz; commit), .carry/blaslibs.tar.xz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
export FINAL="${OUT:-/tmp/leanmoe-out}" W="$(mktemp -d)" CARRY=.carry/dhepi; mkdir -p "$FINAL"
source scripts/device_env.sh
bash "$(dirname "${BASH_SOURCE[0]}")/call3_dhepi.sh"
