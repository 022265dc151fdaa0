#!/usr/bin/env python3
"""Warm-up and timed iterations for a steady-state timing of one grid row (bench/vs_sonic.sh STEADY=1):
enough forward+backward steps for ~3 s of warm-up, past the H200's ~1.8 s power ramp (docs/kernels.md),
and ~1.5 s timed, at 450 TFLOP/s (fwd+bwd FLOPs 18·T·K·d·n); at least 20 timed. The rows are
tools/configs.cpp's (read from its source: one definition). Prints "WARM ITERS"; with --shape the
row's "T d n E K" instead.
Usage: steady_iters.py [--shape] ROW"""
import math
import os
import re
import sys

src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "configs.cpp")).read()
rows = {m[0]: tuple(int(v) for v in m[1:]) for m in
        re.findall(r'\{"([^"]+)", (\d+), (\d+), (\d+), (\d+), (\d+)\}', src)}
args = sys.argv[1:]
shape = args[:1] == ["--shape"]
if shape:
    args = args[1:]
if len(args) != 1 or args[0] not in rows:
    sys.exit(f"steady_iters.py: ROW must be one of {', '.join(rows)}")
T, d, n, E, K = rows[args[0]]
if shape:
    print(T, d, n, E, K)
    sys.exit(0)
step_s = 18.0 * T * K * d * n / 450e12
print(math.ceil(3.0 / step_s), max(20, math.ceil(1.5 / step_s)))
