"""The table of bench/python/run.sh: medians per case, ratios, targets.

A ratio is the median of the per-rep ratios. Against C, the two sides took
turns in one process (compat_bench.py with cloop.c), so a machine whose speed
drifts (it does here, by tens of percent from minute to minute) moves both;
against the preadv pool, they ran next to each other in one rep. The per-rep
values are listed under the table."""
import os
import statistics
import sys

out = sys.argv[1]


def rows(name):
    res = []
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return res
    with open(path) as f:
        for line in f:
            res.append(dict(kv.split("=", 1) for kv in line.split() if "=" in kv))
    return res


def by_rep(data, case, bpp, key, rw=None):
    return {r["rep"]: float(r[key]) for r in data
            if r["case"] == case and r["bpp"] == str(bpp) and (rw is None or r["rw"] == rw)
            and key in r}


def pool_target(bpp, rw):
    """Whether the os.preadv pool's target (2x) applies: reads of 256 KiB (issue 14)."""
    return bpp == 256 << 10 and rw == "read"


def med(d):
    return statistics.median(d.values()) if d else float("nan")


def ratio(a, b):
    """(median of per-rep a/b, the per-rep list)."""
    reps = sorted(set(a) & set(b), key=int)
    per = [a[r] / b[r] for r in reps]
    return (statistics.median(per) if per else float("nan")), per


def fmt(per):
    return " ".join(f"{v:.2f}" for v in per)


io = rows("io.txt")
sizes = sorted({int(r["bpp"]) for r in io} | {int(r["bpp"]) for r in rows("store.txt")}, reverse=True)
notes = []
if io:
    print("| pages | rw | compat 1 thread GB/s | C in turns | ratio | compat 4 threads | C in turns "
          "| ratio | bench_io 1 caller | bench_io 4 callers | Python 16-thread preadv "
          "| compat-1 / it | bench_io 1 caller / it | target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for bpp in sizes if io else ():
    for rw in ("read", "write"):
        c1, t1 = by_rep(io, "turns-1", bpp, "gbps", rw), by_rep(io, "turns-1", bpp, "c_gbps", rw)
        c4, t4 = by_rep(io, "turns-4", bpp, "gbps", rw), by_rep(io, "turns-4", bpp, "c_gbps", rw)
        k1, k4 = by_rep(io, "c-1", bpp, "gbps", rw), by_rep(io, "c-4", bpp, "gbps", rw)
        py = by_rep(io, "py16", bpp, "gbps", rw)
        if not c1:
            continue
        r1, p1 = ratio(c1, t1)
        r4, p4 = ratio(c4, t4)
        rp, pp = ratio(c1, py)
        rk, pk = ratio(k1, py)
        ok = r1 >= 0.9 and r4 >= 0.9 and (not pool_target(bpp, rw) or rp >= 2)
        tgt = "≥ 0.9× C" + (", ≥ 2× Python" if pool_target(bpp, rw) else "")
        print(f"| {bpp >> 10} KiB | {rw} | {med(c1):.2f} | {med(t1):.2f} | {r1:.2f} | {med(c4):.2f} "
              f"| {med(t4):.2f} | {r4:.2f} | {med(k1):.2f} | {med(k4):.2f} | {med(py):.2f} "
              f"| {rp:.2f} | {rk:.2f} | {tgt}: {'PASS' if ok else 'MISS'} |")
        notes.append(f"{bpp >> 10} KiB {rw}, per rep: compat-1/C {fmt(p1)}; compat-4/C {fmt(p4)}; "
                     f"compat-1/py16 {fmt(pp)}; bench_io-1/py16 {fmt(pk)}")
if notes:
    print()
    for n in notes:
        print(f"- {n}")

# The os.preadv pool as a third side of the turns (compat_bench.py): the same
# process, handle, pools and batches as the compat client and the C loop.
pool_rows = []
for bpp in sizes if io else ():
    for rw in ("read", "write"):
        p1, p4 = by_rep(io, "turns-1", bpp, "pool_gbps", rw), by_rep(io, "turns-4", bpp, "pool_gbps", rw)
        if not p1:
            continue
        c1, t1 = by_rep(io, "turns-1", bpp, "gbps", rw), by_rep(io, "turns-1", bpp, "c_gbps", rw)
        c4 = by_rep(io, "turns-4", bpp, "gbps", rw)
        r1, q1 = ratio(c1, p1)
        rc, qc = ratio(t1, p1)
        r4, q4 = ratio(c4, p4)
        tgt = "≥ 2×: " + ("PASS" if r1 >= 2 and r4 >= 2 else "MISS") if pool_target(bpp, rw) else ""
        pool_rows.append(f"| {bpp >> 10} KiB | {rw} | {med(p1):.2f} | {r1:.2f} ({fmt(q1)}) "
                         f"| {rc:.2f} ({fmt(qc)}) | {med(p4):.2f} | {r4:.2f} ({fmt(q4)}) | {tgt} |")
if pool_rows:
    print("\n| pages | rw | preadv pool in turns GB/s | compat-1 / pool (per rep) "
          "| C-1 / pool (per rep) | pool, turns-4 run | compat-4 / pool (per rep) | target |")
    print("|---|---|---|---|---|---|---|---|")
    for r in pool_rows:
        print(r)

st = rows("store.txt")
if st:
    print("\n| pages | Python Store put GB/s | C store put | ratio | Python get | C get | ratio | target |")
    print("|---|---|---|---|---|---|---|---|")
notes = []
for bpp in sizes if st else ():
    pp, pg = by_rep(st, "py-store", bpp, "put_gbs"), by_rep(st, "py-store", bpp, "get_gbs")
    if by_rep(st, "py-store", bpp, "c_put_gbs"):  # the C rounds in the same process
        cp, cg = by_rep(st, "py-store", bpp, "c_put_gbs"), by_rep(st, "py-store", bpp, "c_get_gbs")
    else:  # older runs: `kvpage bench store`, a process of its own
        cp, cg = by_rep(st, "c-store", bpp, "put_gbs"), by_rep(st, "c-store", bpp, "get_gbs")
    if not pp:
        continue
    rpp, ppp = ratio(pp, cp)
    rpg, ppg = ratio(pg, cg)
    ok = rpp >= 0.9 and rpg >= 0.9
    print(f"| {bpp >> 10} KiB | {med(pp):.2f} | {med(cp):.2f} | {rpp:.2f} | {med(pg):.2f} | {med(cg):.2f} "
          f"| {rpg:.2f} | ≥ 0.9×: {'PASS' if ok else 'MISS'} |")
    notes.append(f"{bpp >> 10} KiB, per rep: put {fmt(ppp)}; get {fmt(ppg)}")
if notes:
    print()
    for n in notes:
        print(f"- {n}")
