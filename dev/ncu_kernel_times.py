"""Per-kernel times of one leanmoe bench iteration from ncu CSVs, one run each, or side by side.

The device scripts run `ncu --metrics gpu__time_duration.sum --csv --print-units base leanmoe bench
... --iters 1 --warmup 1`, which profiles the warm-up iteration and the timed one; this prints the
second half of the kernels (the timed iteration) with their times in microseconds and the total.
--whole takes every kernel of the CSV (runs with --warmup 0 --iters 1, and no setup kernels: not
--routing given, whose set-up runs the fused router). --dram also prints each kernel's DRAM bytes
read (CSVs of `--metrics gpu__time_duration.sum,dram__bytes_read.sum`).

--side-by-side prints one table, a column per CSV (e.g. top-K, token rounding, balanced), kernels
matched by name and order (difflib over the kernel names: a kernel one run has and another lacks,
such as token rounding's rounding passes, gets a line of its own), then each run's expert-GEMM,
router-GEMM and other totals and their differences from the first CSV: where a run loses to another.

    python3 dev/ncu_kernel_times.py ncu_7B-n256.csv [more.csv ...]
    python3 dev/ncu_kernel_times.py --whole --side-by-side topk=a.csv nearest=b.csv balanced=c.csv
"""
import csv
import difflib
import sys


TIME, DRAM = "gpu__time_duration.sum", "dram__bytes_read.sum"


def all_kernel_times(path, metric=TIME):
    """[(kernel, value)] of one metric in launch order: time in us, bytes in GB."""
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    head = rows[0]
    name, mname, value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    scale = 1e-3 if metric == TIME else 1e-9
    return [(r[name], float(r[value].replace(",", "")) * scale) for r in rows[1:] if r[mname] == metric]


def kernel_times(path, whole=False, metric=TIME):
    times = all_kernel_times(path, metric)
    return times if whole else times[len(times) // 2:]


def base_name(kernel):
    """The kernel's name without its parameter list and a leading 'void ': the matching key."""
    name = kernel[5:] if kernel.startswith("void ") else kernel
    depth = 0
    for i, c in enumerate(name):  # the first '(' outside template brackets
        depth += c == "<"
        depth -= c == ">"
        if c == "(" and depth == 0:
            return name[:i]
    return name


def part(kernel):
    """Which of the three totals a kernel counts in."""
    k = kernel.lower()
    if "grouped_gemm" in k or "cutlass::device_kernel" in k:
        return "expert GEMMs"
    if k.startswith("nvjet") or "gemm" in k or "cublas" in k:
        return "router GEMMs (cuBLAS)"
    return "other (routing, rounding, metadata, gather-sums)"


def side_by_side(runs, width=80):
    """runs: [(label, [(kernel, us), ...]), ...] -> the lines of the table."""
    # Align every run to the first: rows of (kernel, [us or None per run]).
    first = runs[0][1]
    table = [(k, [us] + [None] * (len(runs) - 1)) for k, us in first]
    keys = [base_name(k) for k, _ in first]
    for j, (_, times) in enumerate(runs[1:], start=1):
        other = [base_name(k) for k, _ in times]
        merged, merged_keys = [], []
        matcher = difflib.SequenceMatcher(None, keys, other, autojunk=False)
        for op, a0, a1, b0, b1 in matcher.get_opcodes():
            if op == "equal":
                for a, b in zip(range(a0, a1), range(b0, b1)):
                    table[a][1][j] = times[b][1]
                    merged.append(table[a]), merged_keys.append(keys[a])
            else:  # lines only the earlier runs have, then lines only this run has
                merged += table[a0:a1]
                merged_keys += keys[a0:a1]
                for b in range(b0, b1):
                    cells = [None] * len(runs)
                    cells[j] = times[b][1]
                    merged.append((times[b][0], cells)), merged_keys.append(other[b])
        table, keys = merged, merged_keys
    labels = [label for label, _ in runs]
    lines = ["  ".join(f"{l[:10]:>10}" for l in labels) + "  kernel"]
    for kernel, cells in table:
        cols = "  ".join(f"{c:10.1f}" if c is not None else f"{'-':>10}" for c in cells)
        lines.append(f"{cols}  {base_name(kernel)[:width]}")
    sums = {}
    for name in ("expert GEMMs", "router GEMMs (cuBLAS)", "other (routing, rounding, metadata, gather-sums)", "total"):
        sums[name] = [sum(us for k, us in times if name in ("total", part(k))) for _, times in runs]
    lines.append("")
    for name, s in sums.items():
        lines.append("  ".join(f"{v:10.1f}" for v in s) + f"  {name} (us)")
    for name, s in sums.items():
        lines.append("  ".join(f"{v - s[0]:+10.1f}" for v in s) + f"  {name}, minus {labels[0]}'s")
    return lines


if __name__ == "__main__":
    args = sys.argv[1:]
    whole = "--whole" in args
    together = "--side-by-side" in args
    dram = "--dram" in args
    paths = [a for a in args if a not in ("--whole", "--side-by-side", "--dram")]
    if not paths:
        sys.exit(__doc__)
    if together:  # label=path, or the path as its own label
        runs = [(p.split("=", 1)[0] if "=" in p else p, kernel_times(p.split("=", 1)[-1], whole)) for p in paths]
        print("\n".join(side_by_side(runs)))
    else:
        for path in paths:
            times = kernel_times(path, whole)
            print(f"== {path}: {len(times)} kernels, {sum(t for _, t in times):.1f} us")
            if dram:  # the CSV has dram__bytes_read.sum beside the time
                for (kernel, us), (_, gb) in zip(times, kernel_times(path, whole, DRAM)):
                    print(f"  {us:8.1f} us {gb:7.2f} GB  {kernel[:100]}")
            else:
                for kernel, us in times:
                    print(f"  {us:8.1f}  {kernel[:110]}")
