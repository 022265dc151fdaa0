"""Routing given by the caller against the fused-router path, per grid row (issue 13's layer bar:
routing given within 5% of the fused router on every row).

    leanmoe bench --grid --graph --json fused.json
    leanmoe bench --grid --graph --routing given --json given.json
    python3 bench/given_vs_fused.py --fused fused.json --given given.json --out given_vs_fused.md

Time = forward + backward (CUDA-graph replays when both files have them, else the eager medians).
The given path has no router (the caller ran it), so it should not be slower; ratio = given / fused.
"""
import argparse
import json

BAR = 1.05


def times(result):
    if "fwd_graph_ms" in result and "bwd_graph_ms" in result:
        return result["fwd_graph_ms"], result["bwd_graph_ms"], "graph"
    return result["fwd_ms"], result["bwd_ms"], "eager"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fused", required=True)
    p.add_argument("--given", required=True)
    p.add_argument("--out", default=None)
    p.add_argument("--commit", default="unknown")
    args = p.parse_args()
    fused, given = json.load(open(args.fused)), json.load(open(args.given))
    by_name = {r["config"]: r for r in given["results"]}
    lines = ["# Routing given vs the fused router (leanmoe bench --grid)", "",
             f"- fused: `{fused['command']}`", f"- given: `{given['command']}`", f"- commit: {args.commit}",
             f"- device: {fused['description']}",
             f"- bar: (fwd + bwd given) / (fwd + bwd fused) <= {BAR:.2f} on every row", "",
             "| config | timing | fused fwd ms | fused bwd ms | given fwd ms | given bwd ms | ratio | result |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    passed = True
    for f in fused["results"]:
        g = by_name.get(f["config"])
        if g is None or "error" in f or "error" in g:
            lines.append(f"| {f['config']} | | | | | | | MISSING |")
            passed = False
            continue
        ff, fb, kind_f = times(f)
        gf, gb, kind_g = times(g)
        kind = kind_f if kind_f == kind_g else "eager"
        if kind == "eager":
            ff, fb, gf, gb = f["fwd_ms"], f["bwd_ms"], g["fwd_ms"], g["bwd_ms"]
        ratio = (gf + gb) / (ff + fb)
        ok = ratio <= BAR
        passed &= ok
        lines.append(f"| {f['config']} | {kind} | {ff:.3f} | {fb:.3f} | {gf:.3f} | {gb:.3f} | {ratio:.3f} | "
                     f"{'PASS' if ok else 'FAIL'} |")
    lines += ["", f"All rows: {'PASS' if passed else 'FAIL'}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
