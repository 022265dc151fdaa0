#!/usr/bin/env python3
"""Reads a probe-9 timeline (branch probe, LEANMOE_PROBE=9: leanmoe_bench_gemms writes
timeline_<shape>_<layout>_<gemm>.csv, CTA 0 of the last launch, SM clock cycles) and prints where the
consumers wait. Per k-tile item: a = the producer's empty wait returned, b = its loads issued (after its
arrive), c = the consumer's full wait returned, d = after its wgmma_wait<1>. Per tile: the epilogue's
begin and end, its k-tiles.

    python3 timeline.py timeline_*.csv
"""
import csv
import statistics
import sys


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0


def report(path):
    items, tiles = [], []
    for row in csv.DictReader(open(path)):
        vals = [int(row[k]) for k in "abcd"]
        (items if row["kind"] == "item" else tiles).append(vals)
    tiles = [t for t in tiles if t[0] and t[1]]
    # item -> (tile, kt) from the tiles' k-tile counts, in order
    pos = []
    for ti, t in enumerate(tiles):
        pos += [(ti, kt) for kt in range(t[2])]
    n = min(len(pos), sum(1 for it in items if all(it)))
    wait, load, mma, prod_wait = [], [], [], []
    by_kt = {}
    for i in range(1, n):
        a, b, c, d = items[i]
        prev_d = items[i - 1][3]
        ti, kt = pos[i]
        # the consumer's wait for this stage: from its previous k-tile's end (or the epilogue's end
        # at a tile's first k-tile) to the full wait's return
        start = tiles[ti - 1][1] if kt == 0 and ti > 0 else prev_d
        w = c - start
        wait.append(w)
        load.append(c - b)
        mma.append(d - c)
        prod_wait.append(a - items[i - 1][1])
        by_kt.setdefault(min(kt, 8), []).append(w)
    epi = [t[1] - t[0] for t in tiles]
    span = items[n - 1][3] - items[0][2]
    print(f"{path}: {n} k-tiles over {len(tiles)} tiles, {span} cycles")
    print(f"  consumer wait per k-tile: median {statistics.median(wait):.0f}, p90 {pct(wait, .9)}, sum {sum(wait)}"
          f" ({100 * sum(wait) / span:.1f}% of the span)")
    print(f"  k-tile MMA issue+wait<1>: median {statistics.median(mma):.0f}, sum {100 * sum(mma) / span:.1f}%")
    print(f"  epilogue per tile: median {statistics.median(epi):.0f}, sum {100 * sum(epi) / span:.1f}%")
    print(f"  issue -> consumer ready (c - b): median {statistics.median(load):.0f}, p10 {pct(load, .1)}, p90 {pct(load, .9)}")
    print(f"  producer's empty wait (a - previous b): median {statistics.median(prod_wait):.0f}")
    print("  consumer wait by k-tile of the tile (8 = 8 and later): " +
          ", ".join(f"{k}: {statistics.median(v):.0f} x{len(v)} sum {100 * sum(v) / span:.1f}%" for k, v in sorted(by_kt.items())))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)
