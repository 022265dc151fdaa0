#!/usr/bin/env python3
"""Summarise ncu's per-instruction warp-state sampling of one kernel.

Input: `ncu -i REPORT --page source --csv --print-source sass > kernel.csv` (a report collected with
--section SourceCounters). Prints the instructions with the most samples (all / not-issued, times
executed, SASS), which is how session 4 found the up/dH producer issuing address arithmetic most of
the time and the consumers waiting on full stages (bench/results/archive/2026-12-02-h200-s4/README.md).

usage: ncu_source_summary.py kernel.csv [--top N]
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header = next(r for r in rows if "Address" in r and "Source" in r)
    data = rows[rows.index(header) + 1:]
    col = {name: header.index(name) for name in header}
    samples = col["Warp Stall Sampling (All Samples)"]
    not_issued = col["Warp Stall Sampling (Not-issued Samples)"]
    executed = col["Instructions Executed"]
    data = [r for r in data if len(r) == len(header) and r[samples].isdigit()]
    total = sum(int(r[samples]) for r in data)
    print(f"{len(data)} instructions, {total} samples")
    print("index | samples | % | not issued | executed | SASS")
    ranked = sorted(range(len(data)), key=lambda i: -int(data[i][samples]))
    for i in ranked[: args.top]:
        r = data[i]
        s = int(r[samples])
        print(f"{i} | {s} | {100 * s / total:.1f} | {r[not_issued]} | {r[executed]} | {r[col['Source']].strip()[:90]}")


if __name__ == "__main__":
    main()
