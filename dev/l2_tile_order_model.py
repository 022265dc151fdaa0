"""DRAM traffic of a persistent grouped GEMM's tile order under an LRU L2, CTAs in lockstep.

A model, not a measurement: every cluster of the persistent grid takes tiles c, c + clusters, ...
of one order and all walk their tiles' k-steps together; each k-step loads the A rows chunk (once
per cluster when 1x2 clusters multicast it) and the B columns chunk of every CTA; each finished tile
writes its output (write-allocate). Expert row counts are ragged around rows/E (sd 45, as top-K's).
Orders: M (CUTLASS's group scheduler default: each expert's tiles down M, column after column), N
(along N: row after row), band (bands of --band cluster columns, M first within a band: the gather
kernel's varlen-M order). What it said for dx at 120B-n2048 (E 64, 2048 rows each, N = d = 4096,
K = 2n = 4096, 128x192 tiles, 66 clusters): M 4.8 GB of DRAM traffic with a 50 MB L2, 7.7 with
25 MB; N 7.6 / 10.2; band of 4 cluster columns 4.7 / 8.4 (1x2 clusters). Against the 4.3 GB minimum that is 1.4-2.3 ms
at the H100's 3.35 TB/s, far below dx's 9.77 ms there (ncu, bench/results/archive/2026-12-05-h100-s21):
if dx is DRAM-bound it is through CTAs drifting apart in K, which the model leaves out, not through
the order in lockstep, and along N should lose. bench/results/archive/2026-12-05-h100-s21/dx_call.sh
measures it.

Measured since (ncu, H100, bench/results/archive/2026-12-05-h100-s22/cluster): the model is off by
6x for that dx and ranks the orders wrongly. 1x2 along M read 28.4 GB (model 4.8), along N 31.4;
2x1 clusters along M 22.4 GB, along N 12.9 (the library's choice on the H100 now). Read its numbers
as a lower bound from lockstep, not as a prediction.

    python3 dev/l2_tile_order_model.py --orders M,N,band [--E 64 --rows 2048 --N 4096 --K 4096]
"""
import argparse
import random
from collections import OrderedDict


def tile_order(order, rows, tm, ncl, cm, band):
    tiles = []
    for e, r in enumerate(rows):
        mcl = ((r + tm - 1) // tm + cm - 1) // cm  # m-tiles in clusters
        if order == "M":
            tiles += [(e, i, j) for j in range(ncl) for i in range(mcl)]
        elif order == "N":
            tiles += [(e, i, j) for i in range(mcl) for j in range(ncl)]
        else:
            tiles += [(e, i, j) for j0 in range(0, ncl, band) for i in range(mcl) for j in range(j0, min(ncl, j0 + band))]
    return tiles


def dram_bytes(a):
    rnd = random.Random(a.seed)
    rows = [max(0, int(rnd.gauss(a.rows, 45))) for _ in range(a.E)]
    ncl = ((a.N + a.tn - 1) // a.tn + a.cn - 1) // a.cn
    tiles = tile_order(a.order, rows, a.tm, ncl, a.cm, a.band)
    cache, used, dram = OrderedDict(), 0, 0
    cap = a.l2_mb * 2**20

    def touch(key, nbytes):
        nonlocal used, dram
        if key in cache:
            cache.move_to_end(key)
            return
        dram += nbytes
        cache[key] = nbytes
        used += nbytes
        while used > cap:
            used -= cache.popitem(last=False)[1]

    for w in range(0, len(tiles), a.clusters):
        wave = tiles[w:w + a.clusters]
        for k in range(a.K // a.kstep):
            for e, i, j in wave:
                for x in range(a.cm):
                    touch(("A", e, i * a.cm + x, k), a.tm * a.kstep * 2)
                for y in range(a.cn):
                    touch(("B", e, j * a.cn + y, k), a.kstep * a.tn * 2)
        for e, i, j in wave:
            for x in range(a.cm):
                for y in range(a.cn):
                    touch(("D", e, i * a.cm + x, j * a.cn + y), a.tm * a.tn * 2)
    minimum = 2 * (sum(rows) * a.K + a.E * a.K * a.N + sum(rows) * a.N)
    return dram, minimum


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--orders", default="M,N,band")
    ap.add_argument("--E", type=int, default=64)
    ap.add_argument("--rows", type=int, default=2048, help="mean rows per expert (T*K/E)")
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--K", type=int, default=4096)
    ap.add_argument("--tm", type=int, default=128)
    ap.add_argument("--tn", type=int, default=192)
    ap.add_argument("--kstep", type=int, default=64)
    ap.add_argument("--clusters", type=int, default=66)
    ap.add_argument("--band", type=int, default=4, help="cluster columns per band (order band)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for a.order in a.orders.split(","):
        for a.l2_mb in (50, 25):
            for a.cm, a.cn in ((1, 2), (2, 1)):
                d, m = dram_bytes(a)
                print(f"order {a.order:4s} L2 {a.l2_mb} MB cluster {a.cm}x{a.cn}: {d / 1e9:5.1f} GB "
                      f"(minimum {m / 1e9:.1f}); {d / 3.35e12 * 1e3:.2f} ms at 3.35 TB/s, {d / 4.8e12 * 1e3:.2f} at 4.8")


if __name__ == "__main__":
    main()
