"""Token rounding's speed-up over top-K on the sparse grid rows, against a measured bound (issue 15).

For each shape, `leanmoe bench --router topk_then_softmax --graph --json` runs six routings, forward
+ backward, CUDA-graph replays and eager:
  topk               the fused router, top-K;
  given              the same top-K picks handed over as routing given (no router in the layer);
  nearest, up, down  token rounding (tile 128, the bench default);
  balanced           routing given in which every expert receives T*K/E rows, whole tiles: top-K's
                     kernels with no partial tile and no rounding work.
The bound: removing every partial tile from top-K's layer costs t_ref = t_balanced + (t_topk -
t_given), the balanced run plus the router and routing chain top-K exposes (given runs without
them), so bound = t_topk / t_ref; a mode's distance to it is 1 - speed-up / bound. Also printed:
the issue's tile-count bound 1/(1 - E*tile/2 / (T*K)), the count bound from the routing's own
tiles (top-K's tiles / a mode's tiles; time proportional to tiles), and the raw t_topk / t_balanced.
Rounding up keeps top-K's tiles and rounding down drops rows below T*K, so only nearest does
balanced's work: their distances say how far their time is from balanced's, not a bar.

    python3 bench/token_rounding_speed.py --leanmoe build/leanmoe --out DIR [--rounds 2 --budget-s 150]
    python3 bench/token_rounding_speed.py --from DIR     # the table again from DIR's JSON files

--rounds 2 runs each shape's six routings a second time in reverse order (as long as --budget-s
allows a whole shape), pooling the iterations of both rounds. Writes DIR/token_rounding_speed.md,
DIR/<shape>_<mode>_r<round>.json; stdlib only.
"""
import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

SHAPES = ["sparse-T16k-d4096-n1024-E256", "sparse-T8k-d4096-n1024-E256", "sparse-T16k-d2048-n512-E256",
          "sparse-T32k-d4096-n512-E512"]
MODES = {"topk": ["--routing", "topk"], "given": ["--routing", "given"],
         "nearest": ["--routing", "token-rounding", "--rounding", "nearest"],
         "up": ["--routing", "token-rounding", "--rounding", "up"],
         "down": ["--routing", "token-rounding", "--rounding", "down"], "balanced": ["--routing", "balanced"]}
BAR = 0.03  # issue 15: each mode within 3% of the bound


def run(args, shape, mode, rnd):
    path = os.path.join(args.out, f"{shape}_{mode}_r{rnd}.json")
    cmd = [args.leanmoe, "bench", "--config", shape, "--router", "topk_then_softmax", *MODES[mode], "--graph",
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--json", path, *shlex.split(args.bench_args)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if p.returncode != 0:
            print(f"{shape} {mode}: exit {p.returncode}: {p.stderr.strip()[-300:]}", file=sys.stderr)
    except subprocess.TimeoutExpired:
        print(f"{shape} {mode}: timed out after {args.timeout} s", file=sys.stderr)


def measure(args):
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    for i, shape in enumerate(args.shapes):
        t0 = time.time()
        for mode in MODES:
            run(args, shape, mode, 1)
        print(f"{shape}: round 1 in {time.time() - t0:.0f} s", file=sys.stderr)
        if args.rounds > 1:
            # round 2 of this shape, then round 1 of the rest, each taking about this round's time
            if time.time() - start + (time.time() - t0) * (len(args.shapes) - i) > args.budget_s:
                print(f"{shape}: no round 2 (budget)", file=sys.stderr)
                continue
            for mode in reversed(list(MODES)):
                run(args, shape, mode, 2)


def load(folder):
    """{(shape, mode): [result, ...]} over every round found, and the device's description."""
    found, device = {}, "unknown"
    for path in sorted(glob.glob(os.path.join(folder, "*_r*.json"))):
        stem = os.path.basename(path)[:-5].rsplit("_r", 1)[0]
        shape, mode = stem.rsplit("_", 1)
        run = json.load(open(path))
        device = run["description"]
        for r in run["results"]:
            if "error" not in r:
                found.setdefault((shape, mode), []).append(r)
    return found, device


def step_ms(results, graph):
    """Median over every timed iteration of every round of forward + backward (same iteration)."""
    f, b = ("fwd_graph_ms_all", "bwd_graph_ms_all") if graph else ("fwd_ms_all", "bwd_ms_all")
    steps = [x + y for r in results if f in r for x, y in zip(r[f], r[b])]
    return statistics.median(steps) if steps else None


def table(found, device, shapes):
    lines = ["# Token rounding vs top-K on the sparse rows, against a measured padding-free bound", "",
             f"- device: {device}", "- each run: `leanmoe bench --config SHAPE --router topk_then_softmax ROUTING "
             "--graph`, time = median over iterations of forward + backward",
             "- bound = t_topk / (t_balanced + t_topk - t_given): top-K's layer with no partial tile; "
             "to bound = 1 - speed-up / bound (issue 15's bar: within 3%); count bound = top-K's tiles / the "
             "mode's (time proportional to tiles); issue bound = 1/(1 - E*tile/2 / (T*K))", ""]
    for shape in shapes:
        runs = {m: found.get((shape, m)) for m in MODES}
        if not runs["topk"]:
            lines += [f"## {shape}: no top-K run", ""]
            continue
        top = runs["topk"][0]
        T, E, K, tile = top["T"], top["E"], top["K"], top["tile"]
        rows = T * K
        pad = 1 - rows / (top["tiles"] * tile)
        lines += [f"## {shape} (T {T}, d {top['d']}, n {top['n']}, E {E}, K {K}, tile {tile})", "",
                  f"- rows per expert: T*K/E = {rows // E} ({rows / E / tile:.2f} tiles); top-K's routing "
                  f"(last run): {top['expert_rows_min']}-{top['expert_rows_max']} per expert, {top['tiles']} "
                  f"tiles against {rows // tile} full ones, padding {100 * pad:.1f}% of the tiles' rows",
                  f"- issue bound 1/(1 - E*tile/2 / (T*K)) = {1 / (1 - E * tile / 2 / rows):.3f}"]
        bounds = {}
        for graph in (True, False):
            kind = "graph" if graph else "eager"
            t = {m: step_ms(r, graph) if r else None for m, r in runs.items()}
            if None in (t["topk"], t["given"], t["balanced"]):
                lines.append(f"- {kind}: bound not measured (a run of topk, given or balanced is missing)")
                continue
            ref = t["balanced"] + t["topk"] - t["given"]
            bounds[kind] = (t, t["topk"] / ref)
            lines.append(f"- {kind}: top-K {t['topk']:.3f} ms, given {t['given']:.3f} ms (router and routing "
                         f"chain exposed: {t['topk'] - t['given']:.3f} ms), balanced {t['balanced']:.3f} ms; "
                         f"t_topk / t_balanced = {t['topk'] / t['balanced']:.3f}; **bound {t['topk'] / ref:.3f}**")
        lines += ["", "| routing | rows | tiles | count bound | graph ms | speed-up | to bound | eager ms | "
                      "speed-up | to bound |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for m, r in runs.items():
            if not r:
                lines.append(f"| {m} | missing | | | | | | | | |")
                continue
            cells = [m, str(r[-1]["rows"]), str(r[-1]["tiles"]), f"{top['tiles'] / r[-1]['tiles']:.3f}"]
            for kind in ("graph", "eager"):
                if kind not in bounds:
                    cells += ["-", "-", "-"]
                    continue
                t, bound = bounds[kind]
                speedup = t["topk"] / t[m]
                gap = 1 - speedup / bound
                if m in ("given", "balanced"):  # the bound's own terms
                    cells += [f"{t[m]:.3f}", f"{speedup:.3f}", ""]
                    continue
                mark = "" if m == "topk" else (" ok" if gap <= BAR else " **over**")
                cells += [f"{t[m]:.3f}", f"{speedup:.3f}", f"{100 * gap:+.1f}%{mark}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--leanmoe", default="build/leanmoe")
    p.add_argument("--out", default="token_rounding_speed")
    p.add_argument("--from", dest="source", default=None, help="only render the table from this folder")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, choices=(1, 2))
    p.add_argument("--budget-s", type=float, default=1e9, help="start a shape's round 2 only within this")
    p.add_argument("--timeout", type=float, default=45, help="seconds per leanmoe bench run")
    p.add_argument("--shapes", type=lambda v: v.split(","), default=SHAPES, help="comma-separated grid rows")
    p.add_argument("--bench-args", default="", help="more leanmoe bench flags (e.g. shape overrides)")
    args = p.parse_args()
    folder = args.source or args.out
    if not args.source:
        measure(args)
    text = table(*load(folder), args.shapes)
    with open(os.path.join(folder, "token_rounding_speed.md"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
