#!/usr/bin/env python3
"""Layer A/B runs of a device script, one `leanmoe bench --config ROW --graph --json layer_*.json` file
per run: each run's forward and backward times (graph replays and eager, ms), then, where a name ran
in several rounds (files layer_r<R>_<name>.json), the medians of its graph replays.

    python3 bench/layer_ab.py DIR          (the folder holding the layer_*.json files)

Used by the archived device scripts that compare kernel configurations inside the layer
(bench/results/archive/*/steady_call.sh, suite_call.sh, layer_configs_call.sh). Standard library only.
"""
import glob
import json
import os
import re
import statistics
import sys


def runs(folder):
    """[(name, result)] of every readable layer_*.json in `folder`, sorted by file name."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "layer_*.json"))):
        try:
            out.append((os.path.basename(path)[len("layer_"):-len(".json")], json.load(open(path))["results"][0]))
        except (OSError, ValueError, KeyError, IndexError):
            continue  # a run cut by its timeout leaves no (or a partial) file
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    by_name = {}
    for name, r in runs(sys.argv[1]):
        print(f"{name}: fwd_graph {r['fwd_graph_ms']:.3f} bwd_graph {r['bwd_graph_ms']:.3f} "
              f"fwd {r['fwd_ms']:.3f} bwd {r['bwd_ms']:.3f}")
        by_name.setdefault(re.sub(r"^r\d+_", "", name), []).append(r)
    for name, rs in by_name.items():
        if len(rs) > 1:
            print(f"{name}: median of {len(rs)} fwd_graph {statistics.median(r['fwd_graph_ms'] for r in rs):.3f} "
                  f"bwd_graph {statistics.median(r['bwd_graph_ms'] for r in rs):.3f}")
