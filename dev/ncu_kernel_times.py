"""Per-kernel times of one leanmoe bench iteration from an ncu CSV.

The device scripts run `ncu --metrics gpu__time_duration.sum --csv --print-units base leanmoe bench
... --iters 1 --warmup 1`, which profiles the warm-up iteration and the timed one; this prints the
second half of the kernels (the timed iteration) with their times in microseconds and the total.

    python3 dev/ncu_kernel_times.py ncu_7B-n256.csv [more.csv ...]
"""
import csv
import sys


def kernel_times(path):
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    head = rows[0]
    name, value = head.index("Kernel Name"), head.index("Metric Value")
    times = [(r[name], float(r[value].replace(",", "")) / 1e3) for r in rows[1:]]
    return times[len(times) // 2:]


if __name__ == "__main__":
    for path in sys.argv[1:]:
        times = kernel_times(path)
        print(f"== {path}: {len(times)} kernels, {sum(t for _, t in times):.1f} us")
        for kernel, us in times:
            print(f"  {us:8.1f}  {kernel[:110]}")
