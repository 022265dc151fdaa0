#!/usr/bin/env python3
"""Compares the SASS of kernels between two builds, to show a refactor left them unchanged.

    python3 scripts/compare_sass.py BEFORE.o AFTER.o [--pair OLD_SUBSTRING=NEW_SUBSTRING ...] [--common]

BEFORE/AFTER: objects or binaries with sm_90a code (e.g. build/CMakeFiles/leanmoe.dir/src/cuda/
expert_gemms.cu.o of two checkouts). Each --pair names one kernel in each by substrings of the
mangled names (each must match exactly one function); --common compares every kernel whose name
is in both. Per pair it prints one of:
  identical                  the same instructions and encodings;
  same instructions          but for immediate operands (e.g. a static shared-memory offset);
  same FP/MMA/memory order   the floating-point, tensor-core, memory, barrier and synchronisation
                             instructions match one for one in order (registers renamed), while
                             integer or address instructions differ: the same arithmetic;
  DIFFERENT                  anything else, with the first differing lines.
cuobjdump comes from the CUDA toolkit, or from triton's wheel (CUOBJDUMP=path overrides).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys


def cuobjdump():
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        found = next(iter(glob.glob("/usr/local/cuda*/bin/cuobjdump")), None)
    if not found:
        try:
            import triton  # noqa: F401  (ships cuobjdump with its NVIDIA backend)
            found = next(iter(glob.glob(os.path.join(os.path.dirname(triton.__file__),
                                                     "backends/nvidia/bin/cuobjdump"))), None)
        except ImportError:
            pass
    if not found:
        sys.exit("compare_sass: no cuobjdump (CUDA toolkit or triton); set CUOBJDUMP")
    return found


def functions(path):
    """Mangled name -> list of (instruction text, encoding) of each kernel in `path`."""
    out = subprocess.run([cuobjdump(), "-sass", path], check=True, capture_output=True, text=True).stdout
    kernels, name = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            kernels[name] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;\s*/\*\s*(0x[0-9a-f]+)\s*\*/", line)
        if name and m:
            kernels[name].append(re.sub(r"\s+", " ", m.group(1)))
    return kernels


def find(kernels, substring, which):
    hits = [k for k in kernels if substring in k]
    if len(hits) != 1:
        names = ", ".join(h[:100] + "..." for h in hits[:3])
        sys.exit(f"compare_sass: '{substring}' matches {len(hits)} kernels of {which} (one needed): {names}")
    return hits[0]


ORDERED = re.compile(r"(@!?U?P\w+ )?(HGMMA|WARPGROUP|F[A-Z0-9]*|MUFU|HMUL|HADD|HFMA|LD\w*|ST\w*|RED\w*|ATOM\w*|"
                     r"UTMA\w*|UBLKCP|SYNCS\w*|BAR\w*|MEMBAR|FENCE\w*|CCTL\w*|ELECT|EXIT|SHFL\w*)\b")


def canonical(ins):
    ins = re.sub(r"\bU?R\d+\b", "R", ins)
    return re.sub(r"\bU?P\d\b", "P", ins)


def compare(before, after):
    if before == after:
        return "identical", []
    strip = lambda body: [re.sub(r"0x[0-9a-f]+", "#", i) for i in body]  # noqa: E731
    if len(before) == len(after) and strip(before) == strip(after):
        return "same instructions", [(b, a) for b, a in zip(before, after) if b != a][:8]
    # Branch targets and NOP padding follow the code size; the opcodes below carry the arithmetic.
    ordered = lambda body: [canonical(i) for i in body if ORDERED.match(i) and not i.startswith("NOP")]  # noqa: E731
    ob, oa = ordered(before), ordered(after)
    if ob == oa:
        return "same FP/MMA/memory order", []
    diff = [(b, a) for b, a in zip(ob, oa) if b != a][:8]
    return "DIFFERENT", diff or [(f"{len(ob)} ordered instructions", f"{len(oa)}")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--pair", action="append", default=[], help="OLD_SUBSTRING=NEW_SUBSTRING")
    parser.add_argument("--common", action="store_true", help="also every kernel whose name is in both")
    args = parser.parse_args()
    b, a = functions(args.before), functions(args.after)
    pairs = []
    for pair in args.pair:
        old, _, new = pair.partition("=")
        pairs.append((pair, find(b, old, args.before), find(a, new or old, args.after)))
    if args.common:
        pairs += [(k[:60] + "...", k, k) for k in b if k in a]
    if not pairs:
        sys.exit("compare_sass: nothing to compare (give --pair or --common)")
    worst = 0
    for label, kb, ka in pairs:
        verdict, lines = compare(b[kb], a[ka])
        worst = max(worst, verdict == "DIFFERENT")
        print(f"{label}: {verdict} ({len(b[kb])} vs {len(a[ka])} instructions)")
        for x, y in lines:
            print(f"    {x}  ->  {y}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
