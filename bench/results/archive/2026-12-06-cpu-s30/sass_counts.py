#!/usr/bin/env python3
"""Session 30's reading of the dW1 instruction gap (docs/kernels.md "Where dW1's time goes", s30 part).

    python3 sass_counts.py QUACK_SRC_CSV_GZ OUR_SASS

QUACK_SRC_CSV_GZ: ncu's source page of QuACK's dW1 (s28 call 2, ncu.tar.gz: src_3.csv.gz). Prints its
executed-count histogram (a count shared by many instructions is one loop body: per warp and k-tile,
per producer warp and k-tile, per warp and tile), the sum against the metric pass's 1.073 G, and its
wait loops. OUR_SASS: `cuobjdump -sass expert_gemms.cu.o` of main; prints the instruction counts of
our dW1 kernel's consumer and producer k-tile loops (between the loop heads and back-branches named
below, found by their instructions).
"""
import collections
import csv
import gzip
import re
import sys


def quack(path):
    rows = list(csv.reader(gzip.open(path, "rt")))[2:]
    counts = collections.Counter(int(r[5]) for r in rows)
    total = sum(int(r[5]) for r in rows)
    print(f"QuACK dW1 source view: {len(rows)} instructions, {total / 1e9:.3f} G executed (metric pass: 1.073 G)")
    for n, k in sorted(counts.items(), key=lambda kv: -kv[0] * kv[1])[:8]:
        print(f"  {k:4d} instructions x {n:>10d} = {n * k / 1e6:7.1f} M")
    for r in rows:
        if "NANOSLEEP" in r[1] and int(r[5]) > 1_000_000:
            print(f"  wait loop: {r[1].strip()} executed {int(r[5]) / 1e6:.1f} M, samples {r[2]}")


def ours(path):
    txt = open(path).read()
    for f in re.split(r"\n\s+Function : ", txt)[1:]:
        if "GemmKindE5E" in f.split("\n", 1)[0]:  # dW1 (GemmKind 5)
            body = f
            break
    ins = [l for l in body.split("\n") if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", l).group(1), 16) for l in ins]
    text = [l.split(";")[0].split("*/", 1)[1].strip() for l in ins]
    # Consumer: the back-branch after the first HGMMA run; producer: the back-branch after the
    # ARRIVES.LDGSTSBAR of the varlen-K path (the last one in the kernel).
    first_hgmma = next(i for i, t in enumerate(text) if t.startswith("HGMMA"))
    back = next(i for i in range(first_hgmma, len(text)) if re.search(r"BRA 0x([0-9a-f]+)", text[i])
                and int(re.search(r"BRA 0x([0-9a-f]+)", text[i]).group(1), 16) < addr[first_hgmma])
    head = addr.index(int(re.search(r"BRA 0x([0-9a-f]+)", text[back]).group(1), 16))
    print(f"our dW1 consumer k-tile loop: {back - head + 1} instructions ({text[head]} .. {text[back]}),"
          f" {sum(t.startswith('HGMMA') for t in text[head:back + 1])} HGMMA")
    arrive = max(i for i, t in enumerate(text) if t.startswith("ARRIVES.LDGSTSBAR"))
    pback = next(i for i in range(arrive, len(text)) if re.search(r"BRA 0x([0-9a-f]+)", text[i]))
    phead = addr.index(int(re.search(r"BRA 0x([0-9a-f]+)", text[pback]).group(1), 16))
    print(f"our dW1 producer k-tile loop: {pback - phead + 1} instructions in all paths,"
          f" {sum(t.startswith('LDGSTS') for t in text[phead:pback + 1])} LDGSTS,"
          f" {sum('UTMALDG' in t for t in text[phead:pback + 1])} UTMALDG")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    quack(sys.argv[1])
    ours(sys.argv[2])
