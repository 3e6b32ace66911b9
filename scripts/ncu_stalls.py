"""Warp-stall split of one kernel from scripts/ncu_kernels.sh's source.csv (ncu --page source --csv
--print-source sass): the stall reasons, the producer / consumer split of a warp-specialised kernel
(the producer's code starts at its setmaxnreg.dec: USETMAXREG.DEALLOC), the SASS lines with the
most samples, and every mbarrier wait (SYNCS.PHASECHK ... TRYWAIT) with the samples of its retry
branch, by barrier offset.

    python scripts/ncu_stalls.py OUTDIR/source.csv attend_wgmma3 [--top 30]
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(path):
    """{kernel name: [row dict, ...]} in SASS order."""
    out, name, hdr = {}, None, None
    for r in csv.reader(open(path, newline="")):
        if r and r[0] == "Kernel Name":
            name, hdr = r[1], None
            out[name] = []
        elif r and r[0] == "Address":
            hdr = r
        elif hdr and name and r:
            out[name].append(dict(zip(hdr, r)))
    return out


def samples(row) -> int:
    return int(float(row.get(SAMPLES) or 0))


def reasons(row):
    return sorted(((int(float(v)), c[len("stall_"):]) for c, v in row.items()
                   if c.startswith("stall_") and "Not Issued" not in c and v and float(v) > 0), reverse=True)


def report(name, rows, top):
    tot = sum(samples(r) for r in rows) or 1
    split = next((i for i, r in enumerate(rows) if "USETMAXREG.DEALLOC" in r["Source"]), len(rows))
    prod = sum(samples(r) for r in rows[split:])
    print(f"{name}\n  samples {tot}: consumer (before setmaxnreg.dec) {tot - prod}, producer {prod}")
    total = collections.Counter()
    for r in rows:
        for v, c in reasons(r):
            total[c] += v
    for c, v in total.most_common(10):
        print(f"  {c:20s} {v:8d} {100 * v / tot:5.1f}%")
    print(f"  top {top} lines (% of all samples; line = SASS index, P = producer):")
    for i in sorted(sorted(range(len(rows)), key=lambda i: -samples(rows[i]))[:top]):
        r = rows[i]
        print(f"  {i:5d}{'P' if i >= split else ' '} {100 * samples(r) / tot:5.1f}%  {r['Source'][:64]:64s} {reasons(r)[:2]}")
    print("  mbarrier waits by address (samples on the try_wait and its retry branch, the next BRA):")
    waits = collections.Counter()
    for i, r in enumerate(rows):
        m = re.search(r"TRYWAIT\s+\S+,\s*\[([^\]]+)\]", r["Source"])
        if m:
            bra = next((j for j in range(i + 1, min(i + 4, len(rows))) if "BRA" in rows[j]["Source"]), None)
            waits[(m.group(1), "P" if i >= split else "C")] += samples(r) + (samples(rows[bra]) if bra else 0)
    for (addr, role), v in sorted(waits.items(), key=lambda kv: -kv[1]):
        if v:
            print(f"    {role} [{addr}] {v:8d} {100 * v / tot:5.1f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("kernel", help="a substring of the kernel's name")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    found = {k: v for k, v in kernels(a.csv).items() if a.kernel in k}
    if not found:
        print(f"no kernel matching {a.kernel!r} in {a.csv}", file=sys.stderr)
        return 1
    for k, v in found.items():
        report(k, v, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
