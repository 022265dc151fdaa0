"""dev/kernel_trace/summary.py on synthetic traces in kernel_trace.cpp's format: --tail, per iteration (one
up-projection GEMM to the next) how long the kernels already running beside the last expert GEMM outlast
it, a kernel started after it not counted; the per-kernel table's rows for a kernel launched twice an
iteration. CPU only, standard library."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SUMMARY = os.path.join(ROOT, "dev", "kernel_trace", "summary.py")

UP = "void leanmoe::cuda::kernels::sm90::gather_grouped_gemm_kernel<GemmKindE0>(Args)"
DW1 = "void leanmoe::cuda::kernels::sm90::gather_grouped_gemm_kernel<GemmKindE3>(Args)"
SIDE = "void leanmoe::cuda::kernels::gather_sum_kernel(Args)"
NEXT = "void leanmoe::cuda::kernels::scatter_pairs_kernel(Args)"


def write_trace(path, side_tails_us):
    """Iteration i: up, then dW1 on the GEMM stream, the side kernel on another stream ending
    side_tails_us[i] after dW1 (negative: before it), then a kernel started after dW1 that ends 2 ms
    later (not beside it: must not count). One iteration more than tails, so each has a next up."""
    ms = 1_000_000
    lines = [f"n,0,{UP}", f"n,1,{DW1}", f"n,2,{SIDE}", f"n,3,{NEXT}"]
    for i in range(len(side_tails_us) + 1):
        base = i * 20 * ms
        lines.append(f"k,{base},{base + 5 * ms},14,132,1,1,384,0")
        if i == len(side_tails_us):
            break
        dw1_end = base + 10 * ms
        lines.append(f"k,{base + 6 * ms},{dw1_end},14,128,1,1,384,1")
        lines.append(f"k,{base + 6 * ms + ms // 2},{dw1_end + side_tails_us[i] * 1000},25,32768,1,1,128,2")
        lines.append(f"k,{base + 11 * ms},{base + 13 * ms},14,512,1,1,256,3")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run_summary(path, *flags):
    out = subprocess.run([sys.executable, SUMMARY, str(path), *flags, "--width", "200"], check=True,
                         capture_output=True, text=True).stdout
    return out.strip()


def run_tail(path):
    return run_summary(path, "--tail")


def test_tail_is_the_median_overrun_of_the_kernels_beside_the_last_gemm(tmp_path):
    trace = tmp_path / "t.csv"
    write_trace(trace, [300, 100, 250])
    out = run_tail(trace)
    assert "end 250 us after it" in out, out
    assert "min 100, max 300" in out, out
    assert "over 3 iterations" in out, out
    assert "last to end in 3:" in out and "gather_sum_kernel" in out.split("last to end in 3:")[1], out


def test_tail_is_zero_when_the_gemm_ends_last(tmp_path):
    trace = tmp_path / "t.csv"
    write_trace(trace, [-400, -100])
    out = run_tail(trace)
    assert "end 0 us after it" in out, out
    assert "last to end in 2:" in out and "GemmKindE3" in out.split("last to end in 2:")[1], out


def test_table_splits_a_kernel_launched_twice_an_iteration(tmp_path):
    """Per iteration (from one up-projection GEMM to the next) the gather-sum runs twice with one name and
    grid: the forward's sum (200 us) and the backward's dx (300 us). Two rows, #1 and #2, each with its
    own median, not one row whose median mixes them; the up GEMM, once an iteration, stays one row."""
    trace = tmp_path / "t.csv"
    us = 1000
    lines = [f"n,0,{UP}", f"n,1,{SIDE}"]
    for i in range(5):
        base = i * 2000 * us
        lines.append(f"k,{base},{base + 100 * us},14,132,1,1,384,0")
        lines.append(f"k,{base + 200 * us},{base + 400 * us},14,32768,1,1,128,1")
        lines.append(f"k,{base + 500 * us},{base + 800 * us},25,32768,1,1,128,1")
    trace.write_text("\n".join(lines) + "\n")
    out = run_summary(trace)
    rows = {line.split("gather_sum_kernel")[1].split()[0]: float(line.split()[1])
            for line in out.splitlines() if "gather_sum_kernel" in line}
    assert rows == {"#1": 200.0, "#2": 300.0}, out
    ups = [line for line in out.splitlines() if "GemmKindE0" in line]
    assert len(ups) == 1 and "#" not in ups[0], out


def test_table_without_layer_iterations_keeps_one_row_per_kernel(tmp_path):
    """No up-projection GEMM in the trace (any CUDA program): a kernel launched five times is one row."""
    trace = tmp_path / "t.csv"
    us = 1000
    lines = [f"n,0,{SIDE}"] + [f"k,{i * 1000 * us},{i * 1000 * us + 200 * us},14,32768,1,1,128,0" for i in range(5)]
    trace.write_text("\n".join(lines) + "\n")
    out = run_summary(trace)
    rows = [line for line in out.splitlines() if "gather_sum_kernel" in line]
    assert len(rows) == 1 and "#" not in rows[0] and rows[0].split()[0] == "5", out
