#!/usr/bin/env python3
"""Per-kernel times at the steady state from kernel_trace.cpp's files, with the SM clock and the
power during each kernel.

    python3 dev/kernel_trace/summary.py TRACE.csv [TRACE.csv ...] [--last SECONDS] [--width N] [--gemms | --tail]

For each file: the kernels that started in the last SECONDS (default 3) of its GPU activity (the
warm-up and the power ramp left out: an idle H200 holds 1980 MHz for ~2 s before the 700 W cap
pulls it down), grouped by name, launch shape (grid, block) and, for a kernel launched more than once
per layer iteration (from one up-projection GEMM to the next), the launch's place in its iteration,
#1, #2, ... (our gather-sum: #1 the forward's sum, #2 the backward's dx): launches, median and total time,
and the mean SM clock and power of the samples taken while that kernel ran (the samples overlapping
several concurrent kernels count for each). Then the window's busy time (union of kernel intervals)
and its mean clock and power.

A kernel launched with programmatic dependent launch (ours behind `launch_chained`, QuACK's GEMMs)
starts while the kernel ahead of it on its stream still runs and waits in `griddepcontrol.wait`, so
its start-to-end time includes the wait (a 5 us fill kernel then shows the 4 ms GEMM before it).
The "own" column is each launch's end minus the later of its start and the end of the kernel before
it on the same stream: the time the stream spent on it. Sorted by total own time.
"""
import argparse
import bisect
import re
import statistics
import sys


def short_name(name, width):
    n = re.sub(r"^void ", "", name)
    n = re.sub(r"\(.*$", "", n) if not n.startswith("nvjet") else n
    for long, short in (("cutlass::", ""), ("cute::", ""), ("leanmoe::", ""), ("kernels::", ""), ("std::", "")):
        n = n.replace(long, short)
    return n if len(n) <= width else n[: width - 3] + "..."


def read(path):
    kernels, samples, names = [], [], {}
    with open(path) as f:
        for line in f:
            if line.startswith("n,"):
                _, i, name = line.rstrip("\n").split(",", 2)
                names[i] = name
            elif line.startswith("k,"):
                _, start, end, stream, gx, gy, gz, bx, i = line.rstrip("\n").split(",")
                kernels.append((int(start), int(end), int(stream), (int(gx), int(gy), int(gz), int(bx)), names[i]))
            elif line.startswith("s,"):
                _, t, mhz, mw = line.split(",")
                samples.append((int(t), int(mhz), int(mw)))
    kernels.sort()
    samples.sort()
    return kernels, samples


def window_bounds(kernels, last_s):
    """The summarised window (start, end): the last_s seconds up to the end of the last kernel."""
    end = max(k[1] for k in kernels)
    return end - int(last_s * 1e9), end


def own_times(kernels):
    """Per kernel (in kernels' order): end - max(start, end of the previous kernel on its stream)."""
    last_end, own = {}, []
    for start, end, stream, _, _ in kernels:
        own.append(end - max(start, last_end.get(stream, start)))
        last_end[stream] = max(end, last_end.get(stream, end))
    return own


def union_ns(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def summarise(path, last_s, width):
    kernels, samples = read(path)
    if not kernels:
        print(f"== {path}: no kernels")
        return
    t0, t_end = window_bounds(kernels, last_s)
    own = own_times(kernels)
    window = [(k, o) for k, o in zip(kernels, own) if k[0] >= t0]
    window, owns = [k for k, _ in window], [o for _, o in window]
    times = [s[0] for s in samples]

    def during(start, end):
        i, j = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        return samples[i:j]

    # Each launch's place among the launches of its name and shape in its iteration (before the first
    # up-projection GEMM of the window: counted from the window's start). A trace without two up GEMMs
    # (not a layer's) has no iterations: one row per name and shape.
    ups = up_starts(window)
    seen, nth = {}, []
    for start, _, _, shape, name in window:
        key = (bisect.bisect_right(ups, start), name, shape)
        nth.append(seen.get(key, 0))
        seen[key] = nth[-1] + 1
    repeated = {(name, shape) for (_, name, shape), count in seen.items() if count > 1} if len(ups) > 1 else set()
    groups = {}
    for (start, end, _, shape, name), o, k in zip(window, owns, nth):
        g = groups.setdefault((name, shape, k if (name, shape) in repeated else None),
                              {"d": [], "own": [], "mhz": [], "mw": []})
        g["d"].append((end - start) / 1e3)
        g["own"].append(o / 1e3)
        for _, mhz, mw in during(start, end):
            g["mhz"].append(mhz)
            g["mw"].append(mw)
    busy = union_ns([(k[0], k[1]) for k in window])
    span = t_end - window[0][0]
    ws = during(window[0][0], t_end)
    print(f"== {path}: last {last_s:g} s of GPU activity: {len(window)} kernels, busy {busy / 1e6:.1f} of {span / 1e6:.1f} ms"
          + (f", mean SM {statistics.mean(s[1] for s in ws):.0f} MHz, {statistics.mean(s[2] for s in ws) / 1e3:.0f} W"
             f" ({len(ws)} samples)" if ws else ", no clock samples"))
    print(f"  {'launches':>8} {'median us':>10} {'own us':>8} {'own ms':>8} {'SM MHz':>7} {'W':>5}  kernel [grid x,y,z / block]")
    for (name, shape, k), g in sorted(groups.items(), key=lambda kv: -sum(kv[1]["own"])):
        mhz = f"{statistics.mean(g['mhz']):7.0f}" if g["mhz"] else f"{'-':>7}"
        w = f"{statistics.mean(g['mw']) / 1e3:5.0f}" if g["mw"] else f"{'-':>5}"
        print(f"  {len(g['d']):8d} {statistics.median(g['d']):10.1f} {statistics.median(g['own']):8.1f} "
              f"{sum(g['own']) / 1e3:8.2f} {mhz} {w}  "
              f"{short_name(name, width)}{'' if k is None else f' #{k + 1}'} [{shape[0]},{shape[1]},{shape[2]} / {shape[3]}]")


# The order a layer runs its six GEMMs in, which is also leanmoe's GemmKind enum order.
GEMM_ORDER = ("up", "down", "dh", "dw2", "dx", "dw1")


def gemm_kind_by_name(name):
    """The kind a GEMM kernel's name says (leanmoe's gather kernel, QuACK's up and dH), or None."""
    m = re.search(r"GemmKindE(\d)", name)
    if m:
        return GEMM_ORDER[int(m.group(1))]
    if "quackgemm_actGemmGated" in name:
        return "up"
    if "quackgemm_dactGemmDGated" in name:
        return "dh"
    return None


def is_gemm(name):
    return "gather_grouped_gemm_kernel" in name or "quackgemm" in name or "cutlass13device_kernel" in name


def up_starts(kernels):
    """The start times of the up-projection GEMMs among kernels: where each layer iteration begins."""
    return [k[0] for k in kernels if is_gemm(k[4]) and gemm_kind_by_name(k[4]) == "up"]


def gemm_table(path, last_s):
    kernels, _ = read(path)
    if not kernels:
        print(f"{path}: no kernels")
        return
    t0, _ = window_bounds(kernels, last_s)
    gemms = [k for k in kernels if k[0] >= t0 and is_gemm(k[4])]
    first = next((i for i, k in enumerate(gemms) if gemm_kind_by_name(k[4]) == "up"), None)
    if first is None:
        print(f"{path}: no up-projection GEMM in the last {last_s:g} s")
        return
    times = {kind: [] for kind in GEMM_ORDER}
    for i, (start, end, _, _, name) in enumerate(gemms[first:]):
        kind = GEMM_ORDER[i % len(GEMM_ORDER)]
        named = gemm_kind_by_name(name)
        # dW1 runs on dW2's kernel (expert_gemms.cu run_dw), whose name says dw2.
        if named is not None and named != kind and (kind, named) != ("dw1", "dw2"):
            print(f"{path}: GEMM {i} is {named} by its name where the order says {kind}; table not made")
            return
        times[kind].append((end - start) / 1e3)
    print(f"{path}: median us per GEMM over the last {last_s:g} s: " +
          ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in times.items() if v) +
          f" (iterations: {min(len(v) for v in times.values())})")


def tail_table(path, last_s, width):
    """Per iteration (one up-projection GEMM to the next): how long the kernels already running when the
    iteration's last expert GEMM (dW1) ends outlast it (a side stream's gather-sum, say); medians over
    the iterations. Kernels started after it are not counted: the trace does not tell a backward's
    last steps from the next iteration's first."""
    kernels, _ = read(path)
    t0 = window_bounds(kernels, last_s)[0] if kernels else 0
    ups = [t for t in up_starts(kernels) if t >= t0]
    starts = [k[0] for k in kernels]  # read() sorts the kernels by start
    tails, last_names = [], {}
    for a, b in zip(ups, ups[1:]):
        it = kernels[bisect.bisect_left(starts, a):bisect.bisect_left(starts, b)]
        gemm_end = max(k[1] for k in it if is_gemm(k[4]))
        last = max((k for k in it if k[0] < gemm_end), key=lambda k: k[1])
        tails.append((last[1] - gemm_end) / 1e3)
        last_names[last[4]] = last_names.get(last[4], 0) + 1
    if not tails:
        print(f"{path}: fewer than two up-projection GEMMs in the last {last_s:g} s")
        return
    name, count = max(last_names.items(), key=lambda kv: kv[1])
    print(f"{path}: kernels beside the last expert GEMM end {statistics.median(tails):.0f} us after it (median; "
          f"min {min(tails):.0f}, max {max(tails):.0f}; 0: the GEMM ends last) over {len(tails)} iterations; "
          f"last to end in {count}: {short_name(name, width)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--last", type=float, default=3.0, help="seconds of GPU activity at the end to summarise")
    ap.add_argument("--width", type=int, default=110, help="kernel name width")
    ap.add_argument("--gemms", action="store_true", help="the six expert GEMMs' median times, one line per file")
    ap.add_argument("--tail", action="store_true", help="how long the kernels beside each iteration's last expert GEMM outlast it")
    a = ap.parse_args()
    for p in a.traces:
        if a.gemms:
            gemm_table(p, a.last)
        elif a.tail:
            tail_table(p, a.last, a.width)
        else:
            summarise(p, a.last, a.width)


if __name__ == "__main__":
    sys.exit(main())
