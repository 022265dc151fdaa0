"""How close issue 17's bars sit to the physical floor of the layer: a model, not a measurement.

Per grid row and step of the layer, the larger of its tensor-core time (GEMM FLOPs at --peak, the
dense bf16 GEMM rate measured on the H200: 785-795 TFLOP/s) and its compulsory DRAM time (each
operand read once, each output written once, at --dram TB/s): the "step floor". A step cannot run
faster than its floor; the layer's floor is their sum (steps one after another, as the forward runs;
the backward's side streams overlap a little of it, which --overlapped bounds instead by
max(all FLOPs / peak, all bytes / dram)). The compulsory bytes count X and dO once (their K gathered
copies come from L2 at best) and nothing of the router, top-K or the metadata passes (tens of us).

Steps (SPEC.md section 3-4; R = T*K routed rows, W = 2n gated): forward up (X[tok]·W1ᵀ -> H, A),
down (A·W2ᵀ -> Y), gather-sum (Y -> out); backward dH (dO[tok]·W2, H -> dH, A'), dW2 (dO[tok]ᵀ·A'),
dx (dH·W1 -> dX_exp), dW1 (dHᵀ·X[tok]), dx gather-sum.

Against the measured graph replays of bench/results/latest.md (its "Against SonicMoE as CUDA-graph
replays" table) it prints, per row and direction, floor / time for leanmoe, SonicMoE and the bar
(SonicMoE's time / 1.10): the share of the floor each reaches, 1.0 being the floor itself.

With --fp8 (issue 16's bar, FP8 fwd + bwd >= 1.5x leanmoe bf16): the FLOP floor alone (DRAM is
3-5% of the large rows' floors) with up, down, dH and dX at --fp8-rate of twice --peak (0.71: the
128-deep promotion's ceiling, docs/kernels.md "What caps FP8") and dW1 / dW2 at --peak (bf16, as the
library runs them) or, with --fp8-dw, at the FP8 rate too; against latest.md's FP8 table: floor /
FP8 time, and floor / the bar's time (bf16 fwd + bwd / 1.5).

    python3 dev/layer_floor.py [--peak 790] [--dram 3.0] [--latest bench/results/latest.md]
    python3 dev/layer_floor.py --fp8 [--fp8-dw] [--fp8-rate 0.71]
    python3 dev/layer_floor.py --steps 1.4B-n256,7B-n256     # each step's floors, for per-kernel times
"""
import argparse
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BYTES = 2  # bf16


def grid_shapes():
    """name -> (T, d, n, E, K) from tools/configs.cpp's grid (the one definition of the grid)."""
    text = open(os.path.join(ROOT, "tools", "configs.cpp")).read()
    pattern = r'\{"([^"]+)",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\}'
    return {m[0]: tuple(int(v) for v in m[1:]) for m in re.findall(pattern, text)}


def table_rows(latest, section):
    """The cells of every table row under the latest.md sections whose heading section(heading) accepts."""
    in_section = False
    for line in open(latest):
        if line.startswith("## "):
            in_section = section(line)
        elif in_section and line.startswith("|"):
            yield [c.strip() for c in line.strip().strip("|").split("|")]


def is_number(cell):
    return re.match(r"^[\d.]+$", cell) is not None


def graph_times(latest):
    """name -> (leanmoe fwd, bwd, SonicMoE fwd, bwd) in ms from latest.md's graph-replay table."""
    section = lambda h: "CUDA-graph replays" in h and "SonicMoE" in h and "FP8" not in h
    return {c[0]: (float(c[1]), float(c[2]), float(c[5]), float(c[6]))
            for c in table_rows(latest, section) if len(c) >= 9 and is_number(c[1])}


def fp8_times(latest):
    """name -> (FP8 fwd, bwd, bf16 fwd, bwd) in ms from latest.md's FP8 table (rows with numbers)."""
    return {c[0]: (float(c[3]), float(c[4]), float(c[8]), float(c[9]))
            for c in table_rows(latest, lambda h: "FP8" in h)
            if len(c) >= 10 and all(is_number(x) for x in c[3:5] + c[8:10])}


def steps(T, d, n, E, K):
    """(name, FLOPs, compulsory bytes) per step, forward then backward."""
    R, W = T * K, 2 * n
    forward = [
        ("up", 2 * R * d * W, (T * d + E * W * d + R * W + R * n) * BYTES),
        ("down", 2 * R * n * d, (R * n + E * d * n + R * d) * BYTES),
        ("gather-sum", 0, (R * d + T * d) * BYTES),
    ]
    backward = [
        ("dH", 2 * R * d * n, (T * d + E * d * n + 2 * R * W + R * n) * BYTES),
        ("dW2", 2 * R * d * n, (T * d + R * n + E * d * n) * BYTES),
        ("dx", 2 * R * W * d, (R * W + E * W * d + R * d) * BYTES),
        ("dW1", 2 * R * W * d, (R * W + T * d + E * W * d) * BYTES),
        ("dx gather-sum", 0, (R * d + T * d) * BYTES),
    ]
    return forward, backward


def floor_ms(step_list, peak, dram, overlapped):
    if overlapped:
        return 1e3 * max(sum(f for _, f, _ in step_list) / peak, sum(b for _, _, b in step_list) / dram)
    return 1e3 * sum(max(f / peak, b / dram) for _, f, b in step_list)


def fp8_floor_ms(T, d, n, E, K, peak, fp8_rate, fp8_dw):
    """FLOP floor of FP8 forward + backward: the FP8 GEMMs (up, down, dH, dX) at fp8_rate · 2 · peak,
    dW1 / dW2 at peak, or at the FP8 rate with fp8_dw."""
    forward, backward = steps(T, d, n, E, K)
    fp8 = fp8_rate * 2 * peak
    return 1e3 * sum(f / (fp8 if name in ("up", "down", "dH", "dx") or fp8_dw else peak)
                     for name, f, _ in forward + backward)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peak", type=float, default=790.0, help="dense bf16 GEMM TFLOP/s (default 790)")
    ap.add_argument("--dram", type=float, default=3.0, help="achievable DRAM TB/s (default 3.0: ~90%% of the H100's 3.35)")
    ap.add_argument("--latest", default=os.path.join(ROOT, "bench", "results", "latest.md"))
    ap.add_argument("--overlapped", action="store_true", help="floor = max(FLOPs/peak, bytes/dram) over a direction")
    ap.add_argument("--bar", type=float, default=1.10, help="issue 17's ratio over SonicMoE (default 1.10)")
    ap.add_argument("--steps", help="comma-separated grid rows: each step's FLOP and DRAM floors in us instead")
    ap.add_argument("--fp8", action="store_true", help="issue 16's bar against an FP8 FLOP floor")
    ap.add_argument("--fp8-rate", type=float, default=0.71, help="FP8 GEMMs' share of twice --peak (default 0.71)")
    ap.add_argument("--fp8-dw", action="store_true", help="with --fp8: dW1 / dW2 at the FP8 rate too")
    args = ap.parse_args()
    peak, dram = args.peak * 1e12, args.dram * 1e12
    if args.steps:
        shapes = grid_shapes()
        print(f"per step: tensor-core time at {args.peak:g} TFLOP/s, DRAM time at {args.dram:g} TB/s, floor = the larger (us)")
        print("| row | step | FLOP us | DRAM us | DRAM GB | floor us |")
        print("|---|---|---|---|---|---|")
        for name in args.steps.split(","):
            forward, backward = steps(*shapes[name])
            for step, f, b in forward + backward:
                print(f"| {name} | {step} | {1e6 * f / peak:.0f} | {1e6 * b / dram:.0f} | {b / 1e9:.2f} | "
                      f"{1e6 * max(f / peak, b / dram):.0f} |")
        return
    if args.fp8:
        shapes = grid_shapes()
        print(f"FP8 FLOP floor: up, down, dH, dX at {args.fp8_rate:g} x 2 x {args.peak:g} TFLOP/s, dW1 / dW2 at "
              f"{'the same' if args.fp8_dw else f'{args.peak:g}'}; bar = bf16 fwd+bwd / 1.5")
        print("| row | floor ms | FP8 fwd+bwd ms | bar ms | floor/FP8 | floor/bar |")
        print("|---|---|---|---|---|---|")
        for name, (ff, fb, bf, bb) in fp8_times(args.latest).items():
            fl = fp8_floor_ms(*shapes[name], peak, args.fp8_rate, args.fp8_dw)
            bar = (bf + bb) / 1.5
            print(f"| {name} | {fl:.2f} | {ff + fb:.2f} | {bar:.2f} | {fl / (ff + fb):.2f} | {fl / bar:.2f} |")
        return
    shapes, times = grid_shapes(), graph_times(args.latest)
    print(f"floor: {'overlapped' if args.overlapped else 'per step, summed'}; peak {args.peak:g} TFLOP/s, DRAM {args.dram:g} TB/s; "
          f"times: {os.path.relpath(args.latest, ROOT)} (graph replays)")
    print("| row | dir | floor ms | leanmoe ms | SonicMoE ms | bar ms | floor/leanmoe | floor/SonicMoE | floor/bar |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (lf, lb, sf, sb) in times.items():
        if name not in shapes:
            continue
        forward, backward = steps(*shapes[name])
        for direction, step_list, ours, theirs in (("fwd", forward, lf, sf), ("bwd", backward, lb, sb)):
            fl = floor_ms(step_list, peak, dram, args.overlapped)
            bar = theirs / args.bar
            print(f"| {name} | {direction} | {fl:.3f} | {ours:.3f} | {theirs:.3f} | {bar:.3f} | "
                  f"{fl / ours:.2f} | {fl / theirs:.2f} | {fl / bar:.2f} |")


if __name__ == "__main__":
    main()
