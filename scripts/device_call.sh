# Sourced by a device call script (bench/results/archive/*/*_call.sh) from the repository root, after
# `set -uo pipefail`: the frame such calls share. Sets FINAL (the folder that comes back: $OUT), S
# (FINAL/summary.txt, emptied), B and L (fresh folders for the unpacked binaries and the logs; the
# logs go back as FINAL/logs.tar.gz at exit); defines say (echo, also into S), cap N (N seconds, or
# what is left of BUDGET, default 560, at least 5) and unpack NAME=FILE.xz ... (binaries into B);
# then sources scripts/device_env.sh.
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; S=$FINAL/summary.txt; : > "$S"
B="$(mktemp -d)"; L="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$L" . 2>/dev/null' EXIT
say() { echo "$*" | tee -a "$S"; }
budget="${BUDGET:-560}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
unpack() {
  local x
  for x in "$@"; do xz -dc "${x#*=}" > "$B/${x%%=*}" && chmod +x "$B/${x%%=*}" || say "MISSING ${x#*=}"; done
}
source scripts/device_env.sh
