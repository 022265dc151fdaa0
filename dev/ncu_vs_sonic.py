"""Per-step kernel times of one forward + backward, leanmoe beside SonicMoE, from ncu CSVs.

Both CSVs come from `ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base`
over `leanmoe bench ... --iters 1 --warmup 1` and over SonicMoE's sonic_bench.py with ITERS=1 WARM=1
(bench/results/archive/2026-12-04-h200-s10/call2.sh). The last forward + backward of each is split into the
layer's steps by kernel name, in launch order; a kernel matching no step is listed under "other".

    python3 dev/ncu_vs_sonic.py ncu_leanmoe_7B-n256.csv ncu_sonic_7B-n256.csv [METRIC]

With more metrics in the CSVs (`--metrics gpu__time_duration.sum,dram__bytes_read.sum,...`), METRIC
picks the one to tabulate (default gpu__time_duration.sum, in us; a dram__bytes metric in GB).
"""
import csv
import sys

STEPS = ["router GEMM", "top-K + softmax", "routing metadata", "up", "down", "gather-sum", "dH (+ dS)",
         "dW2", "dx", "dW1", "router backward", "dx gather-sum"]


TIME = "gpu__time_duration.sum"


def kernels(path, metric=TIME):
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    name, mname, value = (rows[0].index(h) for h in ("Kernel Name", "Metric Name", "Metric Value"))
    scale = 1e-3 if metric == TIME else 1e-9  # ns -> us, bytes -> GB
    return [(r[name], float(r[value].replace(",", "")) * scale) for r in rows[1:] if r[mname] == metric]


def split_leanmoe(ks):
    ks = ks[len(ks) // 2:]  # warm-up iteration, then the timed one
    out, gemms, sums, jets = {}, 0, 0, 0
    for n, us in ks:
        if n.startswith("nvjet") or "splitKreduce" in n or "router_backward" in n or "sum_halves" in n:
            step = "router GEMM" if jets == 0 else "router backward"
            jets += n.startswith("nvjet")
        elif "router_topk_softmax" in n: step = "top-K + softmax"
        elif any(k in n for k in ("count_pairs", "scan_tiles", "scatter_pairs")): step = "routing metadata"
        elif "gather_grouped_gemm_kernel<0" in n: step = "up"
        elif "gather_grouped_gemm_kernel<2" in n or "reduce_ds" in n: step = "dH (+ dS)"
        elif "gather_grouped_gemm_kernel<3" in n: step = "dW2"
        elif "gather_grouped_gemm_kernel<5" in n: step = "dW1"
        elif "fill_group_args" in n or "cutlass::device_kernel" in n:
            step = "down" if gemms < 2 else "dx"
            gemms += 1
        elif "gather_sum_kernel" in n:
            step = "gather-sum" if sums == 0 else "dx gather-sum"
            sums += 1
        else: step = "other"
        out[step] = out.get(step, 0) + us
    return out


def split_sonic(ks):
    start = max(i for i, (n, _) in enumerate(ks) if "Softmax_Over_TopK" in n) - 1  # its router GEMM
    order = ["up", "down", "dH (+ dS)", "dW2", "dx", "dW1"]
    out, gemms, sums, after_dh = {}, 0, 0, False
    for n, us in ks[start:]:
        if "quackgemm" in n:
            step = order[gemms]
            gemms += 1
            after_dh = step == "dH (+ dS)"
        elif "Softmax_Over_TopK" in n: step = "top-K + softmax"
        elif n.startswith("nvjet") and gemms == 0: step = "router GEMM"
        elif gemms == 0: step = "routing metadata"
        elif "token_gather_sum" in n:
            step = "gather-sum" if sums == 0 else "dx gather-sum"
            sums += 1
        elif after_dh and gemms == 3: step = "dH (+ dS)"  # the dS reduction and scatter (torch ops)
        elif sums == 2: step = "router backward"
        else: step = "other"
        out[step] = out.get(step, 0) + us
    return out


if __name__ == "__main__":
    metric = sys.argv[3] if len(sys.argv) > 3 else TIME
    # A 4th argument "leanmoe": B is another leanmoe build (an A/B of two builds, B in the SonicMoE column).
    split_b = split_leanmoe if sys.argv[4:5] == ["leanmoe"] else split_sonic
    ours, theirs = split_leanmoe(kernels(sys.argv[1], metric)), split_b(kernels(sys.argv[2], metric))
    unit = "us" if metric == TIME else "GB"
    print(f"| step ({metric}) | leanmoe {unit} | SonicMoE {unit} | leanmoe - SonicMoE |\n|---|---:|---:|---:|")
    tot = [0.0, 0.0]
    for s in STEPS + ["other"]:
        a, b = ours.get(s, 0.0), theirs.get(s, 0.0)
        if a or b:
            print(f"| {s} | {a:.2f} | {b:.2f} | {a - b:+.2f} |")
        tot[0] += a; tot[1] += b
    print(f"| total | {tot[0]:.2f} | {tot[1]:.2f} | {tot[0] - tot[1]:+.2f} |")
