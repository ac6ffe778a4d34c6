"""The table of bench/python/run.sh: medians per case, ratios, targets."""
import os
import statistics
import sys

out = sys.argv[1]


def rows(name):
    res = []
    with open(os.path.join(out, name)) as f:
        for line in f:
            res.append(dict(kv.split("=", 1) for kv in line.split() if "=" in kv))
    return res


io = rows("io.txt")


def med(case, bpp, rw):
    v = [float(r["gbps"]) for r in io if r["case"] == case and r["bpp"] == str(bpp) and r["rw"] == rw]
    return statistics.median(v) if v else float("nan")


print("| pages | rw | compat 1 thread GB/s | C 1 caller | ratio | compat 4 threads | C 4 callers "
      "| ratio | Python 16-thread preadv | compat-1 / it | target |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for bpp in (2 << 20, 256 << 10):
    for rw in ("read", "write"):
        c1, k1 = med("compat-1", bpp, rw), med("c-1", bpp, rw)
        c4, k4 = med("compat-4", bpp, rw), med("c-4", bpp, rw)
        py = med("py16", bpp, rw)
        ok = c1 / k1 >= 0.9 and c4 / k4 >= 0.9 and (bpp != 256 << 10 or c1 / py >= 2)
        tgt = "≥ 0.9× C" + (", ≥ 2× Python" if bpp == 256 << 10 else "")
        print(f"| {bpp >> 10} KiB | {rw} | {c1:.2f} | {k1:.2f} | {c1 / k1:.2f} | {c4:.2f} | {k4:.2f} "
              f"| {c4 / k4:.2f} | {py:.2f} | {c1 / py:.2f} | {tgt}: {'PASS' if ok else 'MISS'} |")

st = rows("store.txt")
print("\n| pages | Python Store put GB/s | C store put | ratio | Python get | C get | ratio | target |")
print("|---|---|---|---|---|---|---|---|")
for bpp in (2 << 20, 256 << 10):
    def m(case, k):
        return statistics.median(float(r[k]) for r in st if r["case"] == case and r["bpp"] == str(bpp))
    pp, cp, pg, cg = m("py-store", "put_gbs"), m("c-store", "put_gbs"), m("py-store", "get_gbs"), m("c-store", "get_gbs")
    ok = pp / cp >= 0.9 and pg / cg >= 0.9
    print(f"| {bpp >> 10} KiB | {pp:.2f} | {cp:.2f} | {pp / cp:.2f} | {pg:.2f} | {cg:.2f} | {pg / cg:.2f} "
          f"| ≥ 0.9×: {'PASS' if ok else 'MISS'} |")
