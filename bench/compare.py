#!/usr/bin/env python3
"""Puts `leanmoe bench --grid --json` beside its anchors and writes a markdown table.

Anchors, each measured in the same device call as leanmoe:
- SonicMoE itself (sonic.json of ../shared/anchors/sonicmoe/sonic_bench.py, eager and, with GRAPH=1,
  as CUDA-graph replays), the peer to beat;
- the plain PyTorch MoE (torch._grouped_mm + autograd, baseline.json of
  ../shared/anchors/torch_moe_baseline.py);
- without a measured SonicMoE, SonicMoE's published H100 figures (hard-coded, with their source).

One call's files:
  python3 bench/compare.py --leanmoe leanmoe.json [--anchor baseline.json] [--sonic sonic.json]
                           [--leanmoe-fp8 leanmoe_fp8.json] [--out results.md] [--command "..."] [--commit HASH]
A run folder (leanmoe.json, baseline.json, sonic.json, leanmoe_fp8.json directly in it, or in part*/
subfolders when the grid was split over several calls; each row pairs leanmoe with the SonicMoE and the
leanmoe FP8 of the same call):
  python3 bench/compare.py --run bench/results/<run> [--out FILE]
The current summary, bench/results/latest.md, from the newest run folder under bench/results/:
  python3 bench/compare.py --latest

Ratios against SonicMoE are SonicMoE time / leanmoe time, against the PyTorch anchor leanmoe TFLOP/s /
anchor TFLOP/s (the same FLOPs, so also anchor time / leanmoe time): above 1 means leanmoe is faster.
Memory ratios are leanmoe / other: below 1 means leanmoe keeps less. With leanmoe in FP8 (`leanmoe bench
--precision fp8`, issue 16) a table puts it beside leanmoe bf16 and SonicMoE bf16 as graph replays, its
TFLOP/s counted as bf16-equivalent (the bf16 row's FLOPs), with issue 16's speed bar counted; grid rows
whose d or n is not a multiple of 128 are listed as not applicable. Python standard library only.
"""
import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys

# SonicMoE on H100, read off the bars of figures 13/14 of the SonicMoE paper (about +-3 TFLOP/s),
# as tabulated in BENCHMARKS.md: forward TFLOP/s, backward TFLOP/s, activation GiB per layer.
SONICMOE_H100 = {
    "1.4B-n256": (338, 365, 0.57),
    "1.4B-n512": (398, 398, 0.57),
    "1.4B-n1024": (404, 434, 0.57),
    "7B-n256": (363, 404, 0.61),
    "7B-n512": (434, 438, 0.60),
    "7B-n1024": (466, 466, 0.60),
    "30B-n256": (427, 459, 2.46),
    "30B-n512": (502, 510, 2.46),
    "30B-n1024": (551, 553, 2.46),
    "120B-n512": (517, 525, 4.46),
    "120B-n1024": (557, 566, 4.46),
    "120B-n2048": (594, 585, 4.46),
}
SONICMOE_SOURCE = "SonicMoE paper, figures 13/14 (H100, read off the bars, about +-3 TFLOP/s), via BENCHMARKS.md"

# Issue 17's bars, against SonicMoE measured in the same call, both as CUDA-graph replays.
BAR_RATIO = 1.10
BAR_ROW, BAR_ROW_TFLOPS = "120B-n2048", 620.0
# Issue 16's bar: leanmoe FP8 forward+backward against leanmoe bf16 of the same call, graph replays,
# on every grid row with d >= 2048. FP8 needs d and n multiples of its 128-wide scale blocks
# (docs/DESIGN.md "FP8"; the library refuses other widths).
FP8_BAR_RATIO, FP8_BAR_MIN_D, FP8_BLOCK = 1.5, 2048, 128

GIB = 2.0**30
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FILES = {"leanmoe": "leanmoe.json", "anchor": "baseline.json", "sonic": "sonic.json", "fp8": "leanmoe_fp8.json"}


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def cells_row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load(path):
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# Rows of each file, by config name
# ---------------------------------------------------------------------------------------------
def leanmoe_rows(lm):
    return {r["config"]: r for r in (lm or {}).get("results", [])}


def anchor_rows(anchor):
    """cfg -> dict(fwd_ms, bwd_ms, fwdbwd_ms, fwd_tflops, bwd_tflops, fwdbwd_tflops, gib) for the grouped-mm rows."""
    rows = {}
    for r in (anchor or {}).get("rows", []):
        if r.get("impl", "torch_grouped_mm") != "torch_grouped_mm":
            continue
        if "error" in r:
            rows[r["cfg"]] = {"error": r["error"]}
            continue
        flops = 6.0 * r["T"] * r["K"] * r["d"] * r["n"]
        bwd_ms = r["fwdbwd_ms"] - r["fwd_ms"]  # the anchor times fwd (no_grad) and fwd+bwd, not bwd alone
        rows[r["cfg"]] = {
            "fwd_ms": r["fwd_ms"],
            "bwd_ms": bwd_ms,
            "fwdbwd_ms": r["fwdbwd_ms"],
            "fwd_tflops": r["fwd_tflops"],
            "bwd_tflops": 2 * flops / bwd_ms / 1e9 if bwd_ms > 0 else None,
            "fwdbwd_tflops": r["fwdbwd_tflops"],
            "gib": r["act_peak_GiB"],
        }
    return rows


def sonic_rows(sonic):
    return {r["cfg"]: r for r in (sonic or {}).get("rows", [])}


def weight_bytes(r):
    """Bytes of one layer's weights (router, gate_up_proj, down_proj) in bf16: also their gradients'."""
    return 2 * (r["E"] * r["d"] + 3 * r["E"] * r["n"] * r["d"])


# ---------------------------------------------------------------------------------------------
# A run: one or more parts (device calls), each with its own leanmoe / anchor / SonicMoE files
# ---------------------------------------------------------------------------------------------
class Part:
    def __init__(self, name, leanmoe=None, anchor=None, sonic=None, fp8=None, paths=None, header=None):
        self.name, self.leanmoe, self.anchor, self.sonic, self.fp8 = name, leanmoe, anchor, sonic, fp8
        self.paths = paths or {}
        self.header = header or {}  # "commit", "date", "command" of a compare.py table written in that call
        self.lm, self.anc, self.son = leanmoe_rows(leanmoe), anchor_rows(anchor), sonic_rows(sonic)
        self.lm8 = leanmoe_rows(fp8)  # leanmoe in FP8 (`leanmoe bench --precision fp8`)


def table_header(folder):
    """The '- commit:', '- date:' and '- command:' lines of a table compare.py wrote into `folder`."""
    found = {}
    for md in sorted(glob.glob(os.path.join(folder, "*.md"))):
        with open(md) as f:
            text = f.read(4000)
        if not text.startswith("# leanmoe"):
            continue
        for key in ("commit", "date", "command"):
            m = re.search(rf"^- {key}: (.+)$", text, re.M)
            if m and key not in found:
                found[key] = m.group(1).strip().strip("`")
    return found


def part_from_folder(folder):
    paths = {k: os.path.join(folder, f) for k, f in FILES.items() if os.path.isfile(os.path.join(folder, f))}
    if not paths:
        return None
    header = table_header(folder)
    commit_file = os.path.join(folder, "commit")  # one line, where no table of compare.py says it
    if "commit" not in header and os.path.isfile(commit_file):
        with open(commit_file) as f:
            header["commit"] = f.read().strip()
    return Part(os.path.basename(os.path.normpath(folder)), **{k: load(p) for k, p in paths.items()}, paths=paths,
                header=header)


def readme_title(folder):
    """The first line of the run's README.md (how the run was made), or None."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.readline().lstrip("# ").strip() or None


def run_parts(folder):
    """The parts of a run folder: the folder itself when it holds the files, then its part*/ subfolders."""
    parts = []
    own = part_from_folder(folder)
    if own:
        parts.append(own)
    for sub in sorted(glob.glob(os.path.join(folder, "part*"))):
        if os.path.isdir(sub):
            p = part_from_folder(sub)
            if p:
                parts.append(p)
    if not parts:
        raise SystemExit(f"compare.py: {folder} holds no {FILES['leanmoe']}, {FILES['anchor']} or {FILES['sonic']} "
                         "(directly or in part*/ subfolders)")
    return parts


def measured_date(folder, parts):
    """(date, how it is known): a compare.py table's date, else the commit that added the files."""
    return measured_date_and_source(folder, parts)[0]


def measured_date_and_source(folder, parts):
    dates = [p.header["date"] for p in parts if "date" in p.header]
    if dates:
        return max(dates), "measured"
    try:  # the commit that added the files
        out = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=format:%Y-%m-%d %H:%M UTC", "--", folder],
                             capture_output=True, text=True, cwd=os.path.dirname(RESULTS_DIR), check=True)
        if out.stdout.strip():
            return out.stdout.strip(), "committed"
    except (OSError, subprocess.CalledProcessError):
        pass
    return datetime.datetime.fromtimestamp(os.path.getmtime(folder), datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), "files dated"


def newest_run(results_dir):
    """The run folder under results_dir (archive included) with the latest measurement date."""
    candidates = set()
    for path in glob.glob(os.path.join(results_dir, "**", FILES["leanmoe"]), recursive=True):
        folder = os.path.dirname(path)
        base = os.path.basename(folder)
        candidates.add(os.path.dirname(folder) if base.startswith("part") else folder)
    if not candidates:
        raise SystemExit(f"compare.py --latest: no {FILES['leanmoe']} under {results_dir}")
    return max(candidates, key=lambda f: (measured_date(f, run_parts(f)), f))


class Row:
    """One grid row: leanmoe, and the anchors measured in the same call where that call ran them."""

    def __init__(self, name, part, lm, son, anc, anc_part, lm8=None, lm8_part=None):
        self.name, self.part, self.lm, self.son, self.anc, self.anc_part = name, part, lm, son, anc, anc_part
        self.lm8, self.lm8_part = lm8, lm8_part  # leanmoe FP8, of the same part where it ran there


def assemble(parts):
    """Per config: the last part that measured SonicMoE on it (else the last that ran leanmoe on it), its
    leanmoe row, and the anchor and leanmoe FP8 of the same part (else of the last part that ran them)."""
    order = []
    for p in parts:
        for name in p.lm:
            if name not in order:
                order.append(name)
    rows = []
    for name in order:
        with_sonic = [p for p in parts if name in p.lm and name in p.son and "error" not in p.son[name]]
        tried = [p for p in parts if name in p.lm and name in p.son]  # SonicMoE failed there: show why
        src = (with_sonic or tried or [p for p in parts if name in p.lm])[-1]
        anc_src = src if name in src.anc else next((p for p in reversed(parts) if name in p.anc), None)
        fp8_src = src if name in src.lm8 else next((p for p in reversed(parts) if name in p.lm8), None)
        rows.append(Row(name, src, src.lm[name], src.son.get(name), anc_src.anc[name] if anc_src else None,
                        anc_src, fp8_src.lm8[name] if fp8_src else None, fp8_src))
    return rows


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def lm_times(r, graph):
    if "error" in r:
        return None, None
    if graph:
        return r.get("fwd_graph_ms"), r.get("bwd_graph_ms")
    return r["fwd_ms"], r["bwd_ms"]


def sonic_times(s, graph):
    if not s or "error" in s:
        return None, None
    if graph:
        return s.get("fwd_graph_ms"), s.get("bwd_graph_ms")
    return s.get("fwd_ms"), s.get("bwd_ms")


def tflops(flops, ms):
    return None if ms is None or ms <= 0 else flops / ms / 1e9


def sonic_table(rows, graph, lm_graph=None):
    out = ["| config | leanmoe fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | SonicMoE fwd ms | bwd ms "
           "| fwd TFLOP/s | bwd TFLOP/s | fwd × | bwd × | fwd+bwd × |", "|" + "---|" * 12]
    stats = {"fwd_ok": 0, "bwd_ok": 0, "rows": 0, "bar_row": None, "misses": []}
    for row in rows:
        r, s = row.lm, row.son
        if "error" in r:
            out.append(cells_row([row.name, "leanmoe failed: " + r["error"][:80]] + ["-"] * 10))
            continue
        fwd_fl, bwd_fl = r["fwd_flops"], r["bwd_flops"]
        lf, lb = lm_times(r, graph if lm_graph is None else lm_graph)
        sf, sb = sonic_times(s, graph)
        note = ""
        if s and "error" in s:
            note = "SonicMoE failed: " + s["error"][:60]
        elif s and graph and "graph_error" in s:
            note = "SonicMoE graph failed: " + s["graph_error"][:60]
        elif s and any(s.get(k) != r.get(k) for k in ("T", "d", "n", "E", "K")):
            note, sf, sb = "shape differs from SonicMoE's row", None, None
        fx, bx = ratio(sf, lf), ratio(sb, lb)
        fbx = ratio(None if sf is None or sb is None else sf + sb, None if lf is None or lb is None else lf + lb)
        cells = [row.name, fmt(lf, 3), fmt(lb, 3), fmt(tflops(fwd_fl, lf), 1), fmt(tflops(bwd_fl, lb), 1),
                 fmt(sf, 3) if not note else note, fmt(sb, 3), fmt(tflops(fwd_fl, sf), 1), fmt(tflops(bwd_fl, sb), 1),
                 fmt(fx), fmt(bx), fmt(fbx)]
        out.append(cells_row(cells))
        if fx is not None and bx is not None:
            stats["rows"] += 1
            stats["fwd_ok"] += fx >= BAR_RATIO
            stats["bwd_ok"] += bx >= BAR_RATIO
            if fx < BAR_RATIO or bx < BAR_RATIO:
                stats["misses"].append(f"{row.name} {fx:.2f}/{bx:.2f}")
        if row.name == BAR_ROW and fx is not None and bx is not None:
            stats["bar_row"] = (fwd_fl + bwd_fl) / ((lf + lb) * 1e9)
    return out, stats


def memory_table(rows):
    out = ["| config | leanmoe kept GiB | SonicMoE kept GiB | kept × | leanmoe peak GiB | + weight grads "
           "| SonicMoE peak GiB | peak × | anchor peak GiB |", "|" + "---|" * 9]
    for row in rows:
        r, s = row.lm, row.son
        if "error" in r:
            continue
        kept = r["saved_bytes"] / GIB
        peak = r["activation_bytes"] / GIB
        peak_w = (r["activation_bytes"] + weight_bytes(r)) / GIB
        s_kept = s.get("kept_after_fwd_GiB") if s and "error" not in s else None
        s_peak = s.get("peak_GiB") if s and "error" not in s else None
        a_peak = row.anc.get("gib") if row.anc and "error" not in row.anc else None
        out.append(cells_row([row.name, fmt(kept), fmt(s_kept), fmt(ratio(kept, s_kept)), fmt(peak), fmt(peak_w),
                              fmt(s_peak), fmt(ratio(peak_w, s_peak)), fmt(a_peak)]))
    return out


def anchor_table(rows):
    out = ["| config | T | d | n | E | K | leanmoe fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | GiB "
           "| anchor fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | GiB | fwd × | bwd × | fwd+bwd × | memory × |",
           "|" + "---|" * 20]
    for row in rows:
        r = row.lm
        if "error" in r:
            out.append(cells_row([row.name, r["T"], r["d"], r["n"], r["E"], r["K"],
                                  "leanmoe failed: " + r["error"][:80]] + ["-"] * 13))
            continue
        gib = r["activation_bytes"] / GIB
        fb_tflops = (r["fwd_flops"] + r["bwd_flops"]) / ((r["fwd_ms"] + r["bwd_ms"]) * 1e9)
        a = row.anc or {}
        if "error" in a:
            a = {}
        out.append(cells_row([
            row.name, r["T"], r["d"], r["n"], r["E"], r["K"],
            fmt(r["fwd_ms"], 3), fmt(r["bwd_ms"], 3), fmt(r["fwd_tflops"], 1), fmt(r["bwd_tflops"], 1), fmt(gib),
            fmt(a.get("fwd_ms"), 3), fmt(a.get("bwd_ms"), 3), fmt(a.get("fwd_tflops"), 1), fmt(a.get("bwd_tflops"), 1),
            fmt(a.get("gib")), fmt(ratio(r["fwd_tflops"], a.get("fwd_tflops"))),
            fmt(ratio(r["bwd_tflops"], a.get("bwd_tflops"))), fmt(ratio(fb_tflops, a.get("fwdbwd_tflops"))),
            fmt(ratio(gib, a.get("gib")))]))
    return out


def h100_table(rows):
    out = ["| config | leanmoe fwd | SonicMoE fwd | fwd × | leanmoe bwd | SonicMoE bwd | bwd × "
           "| leanmoe cached GiB | SonicMoE GiB | cached × | leanmoe peak GiB |", "|" + "---|" * 11]
    for row in rows:
        r, s = row.lm, SONICMOE_H100.get(row.name)
        if not s or "error" in r:
            continue
        gib = r["activation_bytes"] / GIB
        cached = (r["saved_bytes"] + r.get("io_bytes", 0)) / GIB
        out.append(cells_row([row.name, fmt(r["fwd_tflops"], 1), s[0], fmt(ratio(r["fwd_tflops"], s[0])),
                              fmt(r["bwd_tflops"], 1), s[1], fmt(ratio(r["bwd_tflops"], s[1])), fmt(cached), s[2],
                              fmt(ratio(cached, s[2])), fmt(gib)]))
    return out


def detail_table(rows):
    out = ["| config | routed rows | saved MiB | naive saved MiB | saved / naive | fwd ws MiB | bwd ws MiB |",
           "|" + "---|" * 7]
    for row in rows:
        r = row.lm
        if "error" in r:
            continue
        out.append(cells_row([row.name, r["rows"], fmt(r["saved_bytes"] / 2**20, 1),
                              fmt(r["naive_saved_bytes"] / 2**20, 1),
                              fmt(ratio(r["saved_bytes"], r["naive_saved_bytes"]), 3),
                              fmt(r["fwd_workspace_bytes"] / 2**20, 1), fmt(r["bwd_workspace_bytes"] / 2**20, 1)]))
    return out


def bar_lines(stats):
    if not stats["rows"]:
        return []
    lines = [f"Bars (issue 17, graph replays): forward ≥ {BAR_RATIO:.2f}× SonicMoE on {stats['fwd_ok']} of "
             f"{stats['rows']} rows, backward ≥ {BAR_RATIO:.2f}× on {stats['bwd_ok']} of {stats['rows']}"]
    if stats["misses"]:
        lines[0] += "; rows below the bar (fwd×/bwd×): " + ", ".join(stats["misses"])
    if stats["bar_row"] is not None:
        lines[0] += (f"; {BAR_ROW} fwd+bwd {stats['bar_row']:.0f} TFLOP/s (bar {BAR_ROW_TFLOPS:.0f}: "
                     f"{'met' if stats['bar_row'] >= BAR_ROW_TFLOPS else 'missed'})")
    return ["", lines[0] + "."]


def fp8_applicable(r):
    return r["d"] % FP8_BLOCK == 0 and r["n"] % FP8_BLOCK == 0


def fp8_table(rows):
    """leanmoe FP8 beside leanmoe bf16 and SonicMoE bf16, graph replays; TFLOP/s from the bf16 row's FLOPs.
    Returns the table and, per row with d >= FP8_BAR_MIN_D, what issue 16's bar makes of it."""
    out = ["| config | d | n | FP8 fwd ms | FP8 bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s "
           "| bf16 fwd ms | bf16 bwd ms | × bf16 fwd | × bf16 bwd | × bf16 fwd+bwd | SonicMoE fwd+bwd ms "
           "| × SonicMoE fwd+bwd |", "|" + "---|" * 15]
    bar = {"ratios": [], "not_applicable": [], "not_measured": []}
    for row in rows:
        r, f = row.lm, row.lm8
        under_bar = r["d"] >= FP8_BAR_MIN_D
        head = [row.name, r["d"], r["n"]]
        if not fp8_applicable(r):
            out.append(cells_row(head + [f"not applicable (d or n not a multiple of {FP8_BLOCK})"] + ["-"] * 11))
            if under_bar:
                bar["not_applicable"].append(row.name)
            continue
        note = None
        if "error" in r:
            note = "leanmoe bf16 failed: " + r["error"][:80]
        elif f is None:
            note = "FP8 not measured"
        elif "error" in f:
            note = "FP8 failed: " + f["error"][:80]
        elif f.get("precision") != "fp8":
            note = f"not an FP8 row (precision {f.get('precision', '?')})"
        elif any(f.get(k) != r.get(k) for k in ("T", "d", "n", "E", "K")):
            note = "shape differs from the bf16 row"
        elif "graph_error" in f or f.get("fwd_graph_ms") is None:
            note = "FP8 graph failed: " + f.get("graph_error", "not graph-timed (run leanmoe bench --graph)")[:80]
        if note:
            out.append(cells_row(head + [note] + ["-"] * 11))
            if under_bar:
                bar["not_measured"].append(f"{row.name} ({note})")
            continue
        ff, fb = f["fwd_graph_ms"], f["bwd_graph_ms"]
        bf, bb = lm_times(r, graph=True)
        sf, sb = sonic_times(row.son, graph=True)
        if row.son and any(row.son.get(k) != r.get(k) for k in ("T", "d", "n", "E", "K")):
            sf, sb = None, None
        s_fb = None if sf is None or sb is None else sf + sb
        b_fb = None if bf is None or bb is None else bf + bb
        x_fb = ratio(b_fb, ff + fb)
        out.append(cells_row(head + [
            fmt(ff, 3), fmt(fb, 3), fmt(tflops(r["fwd_flops"], ff), 1), fmt(tflops(r["bwd_flops"], fb), 1),
            fmt(tflops(r["fwd_flops"] + r["bwd_flops"], ff + fb), 1), fmt(bf, 3), fmt(bb, 3), fmt(ratio(bf, ff)),
            fmt(ratio(bb, fb)), fmt(x_fb), fmt(s_fb, 3), fmt(ratio(s_fb, ff + fb))]))
        if under_bar:
            if x_fb is None:
                bar["not_measured"].append(f"{row.name} (no bf16 graph replay)")
            else:
                bar["ratios"].append((row.name, x_fb))
    return out, bar


def fp8_bar_line(bar):
    """Issue 16's bar over the rows with d >= FP8_BAR_MIN_D, with each row's ratio and shortfall."""
    ratios = bar["ratios"]
    met = [n for n, x in ratios if x >= FP8_BAR_RATIO]
    total = len(ratios) + len(bar["not_measured"])
    line = (f"Bar (issue 16, graph replays): FP8 fwd+bwd ≥ {FP8_BAR_RATIO:.2f}× leanmoe bf16 on every row with "
            f"d ≥ {FP8_BAR_MIN_D}: met on {len(met)} of {total}")
    missed = [(n, x) for n, x in ratios if x < FP8_BAR_RATIO]
    if missed:
        line += "; missed by " + ", ".join(f"{FP8_BAR_RATIO - x:.2f} on {n} ({x:.2f}×)" for n, x in missed)
    if met:
        line += "; met on " + ", ".join(f"{n} ({x:.2f}×)" for n, x in ratios if x >= FP8_BAR_RATIO)
    if bar["not_measured"]:
        line += "; not measured: " + ", ".join(bar["not_measured"])
    if bar["not_applicable"]:
        line += (f"; not applicable (d or n not a multiple of {FP8_BLOCK}, not counted): "
                 + ", ".join(bar["not_applicable"]))
    verdict = "met" if total and len(met) == total else "missed"
    return line + f". Bar {verdict}."


def fp8_section(rows, parts):
    fp8_runs = [p.fp8 for p in parts if p.fp8]
    kinds = sorted({f"{r.get('precision', '?')}, weights' codes {r.get('fp8_weights', '?')}"
                    for j in fp8_runs for r in j.get("results", []) if "error" not in r})
    out = ["## leanmoe FP8 beside leanmoe bf16 and SonicMoE bf16 (issue 16; CUDA-graph replays)", "",
           f"leanmoe `bench --precision fp8` ({'; '.join(kinds) or 'no row measured'}): e4m3 expert-GEMM operands "
           f"with fp32 block scales (1×{FP8_BLOCK} for activations and gradients, {FP8_BLOCK}×{FP8_BLOCK} for the "
           "weights), bf16 in and out. TFLOP/s are bf16-equivalent: the bf16 row's FLOPs (6·T·K·d·n forward, "
           "12·T·K·d·n backward) over the FP8 time. × = other time / FP8 time: above 1 means FP8 is faster. "
           f"FP8 needs d and n multiples of {FP8_BLOCK}.", ""]
    table, bar = fp8_table(rows)
    out += table + ["", fp8_bar_line(bar)]
    if any(r.lm8_part is not None and r.lm8_part is not r.part for r in rows):
        out += ["", "Some rows' FP8 ran in another call of this run than their bf16 row (see parts)."]
    return out + [""]


def render(parts, commit=None, command=None, title=None, source=None, generator=None, measured=None,
           about=None):
    rows = assemble(parts)
    lead = next((p.leanmoe for p in parts if p.leanmoe), None)
    if lead is None:
        raise SystemExit("compare.py: no leanmoe JSON given")
    anchor = next((p.anchor for p in parts if p.anchor), None)
    sonic = next((p.sonic for p in parts if p.sonic), None)
    have_sonic = any(r.son for r in rows)
    have_fp8 = any(p.fp8 for p in parts)
    have_lm_graph = any(r.lm.get("fwd_graph_ms") for r in rows)
    have_sonic_graph = any(r.son and r.son.get("fwd_graph_ms") for r in rows)
    gpu = (sonic or anchor or {}).get("gpu") or lead.get("description", "?")
    commits = commit or ", ".join(dict.fromkeys(p.header.get("commit", "?") for p in parts)) if source else commit
    out = [f"# {title or ('leanmoe beside SonicMoE' if have_sonic else 'leanmoe grid benchmark')}", ""]
    if source:
        out.append(f"- source: {source}")
    if about:
        out.append(f"- about this run: {about}")
    if command:
        out.append(f"- command: `{command}`")
    else:
        for p in parts:
            cmd = p.header.get("command") or (p.leanmoe or {}).get("command", "?")
            out.append(f"- command{' (' + p.name + ')' if len(parts) > 1 else ''}: `{cmd}`")
    out.append(f"- commit: {commits or git_commit()}")
    out.append(f"- GPU: {gpu}")
    if source:
        when, how = measured or (", ".join(dict.fromkeys(p.header.get("date", "?") for p in parts)), "measured")
        out.append(f"- {how}: {when}; "
                   f"this file generated {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"
                   f" by `{generator}`")
    else:
        out.append(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    out.append(f"- leanmoe: {lead.get('tool', '?')}, {lead.get('device', '?')} ({lead.get('description', '?')}), "
               f"{lead.get('dtype', '?')}, median of {lead.get('iters', '?')} after {lead.get('warmup', '?')} warm-up"
               + (f", router {rows[0].lm.get('router')}" if rows and "router" in rows[0].lm else ""))
    lm_routers = {r.lm["router"] for r in rows if "router" in r.lm}
    son_routers = {p.sonic.get("router") for p in parts if p.sonic}
    if have_sonic and (len(lm_routers | son_routers) > 1):
        out.append(f"- **not the same router**: leanmoe {', '.join(sorted(lm_routers))}, SonicMoE "
                   f"{', '.join(sorted(str(x) for x in son_routers))}: the two compute different layers "
                   "(run leanmoe with --router topk_then_softmax)")
    fp8 = next((p.fp8 for p in parts if p.fp8), None)
    if fp8:
        out.append(f"- leanmoe FP8: {fp8.get('tool', '?')}, {fp8.get('description', '?')}, median of "
                   f"{fp8.get('iters', '?')} after {fp8.get('warmup', '?')} warm-up")
    if sonic:
        v = sonic.get("versions")
        vs = ", ".join(f"{k} {x}" for k, x in v.items()) if isinstance(v, dict) else "?"
        out.append(f"- SonicMoE: {vs}; torch {sonic.get('torch', '?')}; router {sonic.get('router', '?')}; "
                   "sonic_bench.py, median of its ITERS after WARM")
    if anchor:
        out.append(f"- anchor: torch {anchor.get('torch', '?')} (CUDA {anchor.get('cuda', '?')}), "
                   f"plain MoE with torch._grouped_mm + autograd; ceilings measured in the same run: "
                   f"bf16 matmul {fmt(anchor.get('mm_tflops'), 0)} TFLOP/s, copy {fmt(anchor.get('copy_TBps'))} TB/s")
    if len(parts) > 1:
        out.append("- parts (device calls): " + "; ".join(
            f"{p.name}: " + ", ".join(os.path.basename(x) for x in p.paths.values()) for p in parts)
                   + ". Each row pairs leanmoe with the SonicMoE of the same call.")
    out.append("- TFLOP/s: forward 6·T·K·d·n / t_fwd, backward 12·T·K·d·n / t_bwd, fwd+bwd 18·T·K·d·n / (t_fwd + t_bwd).")
    out.append("  leanmoe times backward on its own after its forward (eager: steady_clock around each call with a "
               "synchronize before and after; graph: CUDA events around the replay of a forward and of a backward graph, "
               "one per input set); SonicMoE (sonic_bench.py) times eager forward and backward with CUDA events, "
               "and as graphs forward and forward+backward (its backward = their difference); the anchor's backward is "
               "fwd+bwd − fwd (its fwd is timed under no_grad).")
    out.append("- Memory (GiB): leanmoe = saved state without x + out + the larger of the forward workspace and "
               "backward workspace + dx (it allocates nothing inside forward/backward); anchor = torch peak allocated "
               "during fwd+bwd minus before.")
    out.append("- Ratios against SonicMoE: SonicMoE time / leanmoe time; against the anchor: leanmoe TFLOP/s / anchor "
               "TFLOP/s. Above 1 means leanmoe is faster. Memory ratios: leanmoe / other, below 1 means leaner.")
    if title:  # the current summary: where the rest is
        out.append("- older runs: [archive/README.md](archive/README.md); how these numbers are produced and "
                   "compared: [../README.md](../README.md)")
    out.append("")
    if have_sonic:
        out.append("## Against SonicMoE as CUDA-graph replays (kernel time: what a training step gets)")
        out.append("")
        if not have_lm_graph or not have_sonic_graph:
            missing = [w for w, ok in (("leanmoe (run `leanmoe bench --graph`)", have_lm_graph),
                                       ("SonicMoE (run sonic_bench.py with GRAPH=1)", have_sonic_graph)) if not ok]
            out.append("Not measured: graph replays of " + " and ".join(missing) + ".")
            if have_sonic_graph:
                out.append("")
                out.append("leanmoe eager (host launch path included) against SonicMoE's graph replays, the "
                           "comparison that is not in leanmoe's favour; the bars need leanmoe graph-timed too:")
                out.append("")
                out += sonic_table(rows, graph=True, lm_graph=False)[0]
        else:
            table, stats = sonic_table(rows, graph=True)
            out += table + bar_lines(stats)
        out.append("")
        if have_fp8:
            out += fp8_section(rows, parts)
        out.append("## Against SonicMoE, eager (host launch path included)")
        out.append("")
        out += sonic_table(rows, graph=False)[0]
        out.append("")
        out.append("## Memory beside SonicMoE")
        out.append("")
        out.append("kept = what lives from forward to backward, x excluded (leanmoe: the saved state; SonicMoE: memory "
                   "allocated after its forward minus its output); peak: leanmoe's activation memory as in the anchor "
                   "table, and with the weight gradients added (SonicMoE's and the anchor's peaks count the weight "
                   "gradients that autograd allocates during backward).")
        out.append("")
        out += memory_table(rows)
        out.append("")
    else:
        out.append("## Against SonicMoE measured on this GPU")
        out.append("")
        out.append("Not measured in this run (it has no sonic.json): SonicMoE beside leanmoe in one call, eager and as "
                   "CUDA-graph replays, is what `bench/vs_sonic.sh` runs on the H200 (bench/README.md).")
        if have_lm_graph:
            out.append("")
            out.append("leanmoe as CUDA-graph replays:")
            out.append("")
            out += sonic_table(rows, graph=True)[0]
        out.append("")
        if have_fp8:
            out += fp8_section(rows, parts)
    out.append("## Against the PyTorch anchor (same call, eager)")
    out.append("")
    if anchor:
        out += anchor_table(rows)
        notes = [f"{r.name}: {r.anc['error'][:120]}" for r in rows if r.anc and "error" in r.anc]
        if notes:
            out += ["", "Anchor failures: " + "; ".join(notes)]
        if any(r.anc_part is not None and r.anc_part is not r.part for r in rows):
            out += ["", "Some rows' anchor ran in another call of this run than their leanmoe row (see parts)."]
    else:
        out.append("Not run in this call.")
    out.append("")
    if not have_sonic:
        out.append("## Against SonicMoE's published H100 figures")
        out.append("")
        out.append(f"Source: {SONICMOE_SOURCE}. Different GPU (H100 vs this run's), so read the ratios as a rough guide.")
        out.append("")
        out.append("Memory: SonicMoE's per-layer figure stays constant across granularity and is smaller than the "
                   "transient [T·K, d] tensors of those shapes, so it counts what is cached for backward; leanmoe's "
                   "cached = x + saved state (docs/SPEC.md §3). leanmoe's peak (as in the anchor table) is shown beside it.")
        out.append("")
        out += h100_table(rows)
        out.append("")
    out.append("## leanmoe memory detail")
    out.append("")
    out += detail_table(rows)
    out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leanmoe", help="JSON written by `leanmoe bench --grid --json FILE`")
    ap.add_argument("--anchor", help="baseline.json written by torch_moe_baseline.py")
    ap.add_argument("--sonic", help="sonic.json written by sonic_bench.py")
    ap.add_argument("--leanmoe-fp8", help="JSON of `leanmoe bench --precision fp8 --json FILE` (the same rows)")
    ap.add_argument("--run", help="a run folder: its leanmoe.json / baseline.json / sonic.json / leanmoe_fp8.json, "
                                  "and those of part*/")
    ap.add_argument("--latest", action="store_true",
                    help="the newest run folder under bench/results/ into bench/results/latest.md")
    ap.add_argument("--out", help="markdown output (default: stdout; with --latest bench/results/latest.md)")
    ap.add_argument("--command", help="the command that produced the numbers (default: the JSON's / the run's tables')")
    ap.add_argument("--commit", help="commit hash (default: git rev-parse HEAD here; for a run, its tables' commit)")
    args = ap.parse_args()
    modes = sum(bool(x) for x in (args.leanmoe, args.run, args.latest))
    if modes != 1:
        ap.error("give exactly one of --leanmoe FILE, --run FOLDER, --latest")
    if (args.run or args.latest) and (args.anchor or args.sonic or args.leanmoe_fp8):
        ap.error("--anchor, --sonic and --leanmoe-fp8 go with --leanmoe; a run folder brings its own files")
    if args.leanmoe:
        part = Part("call", load(args.leanmoe), load(args.anchor) if args.anchor else None,
                    load(args.sonic) if args.sonic else None, load(args.leanmoe_fp8) if args.leanmoe_fp8 else None)
        text = render([part], commit=args.commit or git_commit(),
                      command=args.command or part.leanmoe.get("command", "?"))
    else:
        folder = newest_run(RESULTS_DIR) if args.latest else args.run
        parts = run_parts(folder)
        rel = os.path.relpath(os.path.abspath(folder), os.path.dirname(os.path.dirname(RESULTS_DIR)))
        title = "leanmoe: the current benchmark summary" if args.latest else None
        text = render(parts, commit=args.commit, command=args.command, title=title,
                      source=f"[{rel}]({os.path.relpath(os.path.abspath(folder), RESULTS_DIR)}/)" if args.latest else rel,
                      generator="python3 bench/compare.py " + ("--latest" if args.latest else f"--run {rel}"),
                      measured=measured_date_and_source(folder, parts),
                      about=(f"[{readme_title(folder)}]({os.path.relpath(os.path.join(folder, 'README.md'), RESULTS_DIR)})"
                             if args.latest and readme_title(folder) else readme_title(folder)))
        if args.latest and not args.out:
            args.out = os.path.join(RESULTS_DIR, "latest.md")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"compare.py: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
