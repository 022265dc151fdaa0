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

Without lockstep (--speed-sd, --jitter: each cluster at a fixed speed ~ N(1, sd), each k-step's time
~ N(1, jitter); --dynamic: a finished cluster takes the next tile of the order instead of striding by
the grid), dx at 120B-n2048 with a 3% speed spread and 5% jitter, 50 MB: static striding 1x2 along M
31.4 GB (measured 28.4), 1x2 along N 32.8 (31.4), 2x1 along M 26.5 (22.4), 2x1 along N 28.1 (12.9:
not reproduced); with --dynamic 4.5-4.6 GB for every order and cluster shape. At T = 4096 (256 rows
per expert) static 4.1, lockstep and dynamic 2.6 (minimum 2.4): the drift needs many tiles per CTA.

    python3 dev/l2_tile_order_model.py --orders M,N --speed-sd 0.03 --jitter 0.05 [--dynamic]

    python3 dev/l2_tile_order_model.py --orders M,N,band [--E 64 --rows 2048 --N 4096 --K 4096]
"""
import argparse
import heapq
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

    def step(tile, k):  # one k-step of one cluster's tile: its A rows and B columns chunks
        e, i, j = tile
        for x in range(a.cm):
            touch(("A", e, i * a.cm + x, k), a.tm * a.kstep * 2)
        for y in range(a.cn):
            touch(("B", e, j * a.cn + y, k), a.kstep * a.tn * 2)

    def store(tile):
        e, i, j = tile
        for x in range(a.cm):
            for y in range(a.cn):
                touch(("D", e, i * a.cm + x, j * a.cn + y), a.tm * a.tn * 2)

    ksteps = a.K // a.kstep
    if not (a.speed_sd or a.jitter or a.dynamic):  # lockstep: every cluster's k-step k together
        for w in range(0, len(tiles), a.clusters):
            wave = tiles[w:w + a.clusters]
            for k in range(ksteps):
                for tile in wave:
                    step(tile, k)
            for tile in wave:
                store(tile)
    else:  # in time: each cluster at its own pace (fixed speed factor, per-tile jitter), k-steps in time order
        speed = [max(0.5, rnd.gauss(1.0, a.speed_sd)) for _ in range(a.clusters)]
        nxt = a.clusters  # dynamic: the next tile index to hand out
        events = [(0.0, c, c, 0) for c in range(min(a.clusters, len(tiles)))]  # (time, cluster, tile, k)
        heapq.heapify(events)
        while events:
            t, c, ti, k = heapq.heappop(events)
            step(tiles[ti], k)
            if k + 1 < ksteps:
                heapq.heappush(events, (t + speed[c] * max(0.1, rnd.gauss(1.0, a.jitter)), c, ti, k + 1))
                continue
            store(tiles[ti])
            if a.dynamic:
                ti, nxt = nxt, nxt + 1
            else:
                ti += a.clusters
            if ti < len(tiles):
                heapq.heappush(events, (t + speed[c], c, ti, 0))
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
    ap.add_argument("--speed-sd", type=float, default=0.0,
                    help="clusters run at fixed speeds ~ N(1, sd) (0 with --jitter 0 and no --dynamic: lockstep)")
    ap.add_argument("--jitter", type=float, default=0.0, help="each k-step's time ~ N(1, jitter) x the cluster's speed")
    ap.add_argument("--dynamic", action="store_true",
                    help="a finished cluster takes the next tile of the order (an atomic counter) instead of striding")
    ap.add_argument("--clusters-shapes", default="1x2,2x1", help="cluster shapes MxN to model")
    a = ap.parse_args()
    for a.order in a.orders.split(","):
        for a.l2_mb in (50, 25):
            for a.cm, a.cn in (tuple(int(v) for v in c.split("x")) for c in a.clusters_shapes.split(",")):
                d, m = dram_bytes(a)
                print(f"order {a.order:4s} L2 {a.l2_mb} MB cluster {a.cm}x{a.cn}: {d / 1e9:5.1f} GB "
                      f"(minimum {m / 1e9:.1f}); {d / 3.35e12 * 1e3:.2f} ms at 3.35 TB/s, {d / 4.8e12 * 1e3:.2f} at 4.8")


if __name__ == "__main__":
    main()
