#!/usr/bin/python3
"""Turns a results file of bench/io/run.sh into the README's markdown table.
Each column keeps the best of its repetitions."""
import math
import sys

FIO = ("fio-psync-2j", "fio-uring-qd8", "fio-uring-2x4")


def main():
    rows = {}
    head = []
    for line in open(sys.argv[1]):
        if line.startswith("#"):
            head.append(line.strip("# \n"))
            continue
        kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
        rw = "read" if kv["rw"] == "memcpy" else kv["rw"]  # the read ceiling
        key = (int(kv["direct"]), int(kv["bpp"]), rw)
        cell = rows.setdefault(key, {})
        g = float(kv["gbps"])
        if g > cell.get(kv["tool"], (-1.0, ""))[0]:
            cell[kv["tool"]] = (g, kv.get("backend", ""))
    for h in head:
        print(f"`{h}`  ")
    print()
    print("| mode | page | op | kvpage auto | kvpage psync | kvpage uring | fio psync 2 jobs | "
          "fio io_uring QD8 | fio io_uring 2x4 | Python | **auto / best fio** | auto / Python | "
          "kvpage fio-like psync / uring | fio-like / same fio | **best fio-like / best fio** | "
          "copy ceiling | auto / ceiling |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(rows):
        direct, bpp, rw = key
        r = rows[key]
        g = lambda t: r.get(t, (math.nan, ""))[0]
        auto, auto_be = r.get("kvpage-auto", (math.nan, ""))
        best = max(g(t) for t in FIO)
        page = f"{bpp >> 20} MiB" if bpp >= 1 << 20 else f"{bpp >> 10} KiB"
        fl_p, fl_u = g("kvpage-fiolike-psync"), g("kvpage-fiolike-uring")
        ceil = g("memcpy-ceiling")
        print(f"| {'O_DIRECT' if direct else 'buffered'} | {page} | {rw} | "
              f"{auto:.2f} ({auto_be}) | {g('kvpage-psync'):.2f} | {g('kvpage-uring'):.2f} | "
              f"{g('fio-psync-2j'):.2f} | {g('fio-uring-qd8'):.2f} | {g('fio-uring-2x4'):.2f} | "
              f"{g('python'):.2f} | **{auto / best:.2f}×** | {auto / g('python'):.1f}× | "
              f"{fl_p:.2f} / {fl_u:.2f} | {fl_p / g('fio-psync-2j'):.2f}× / "
              f"{fl_u / g('fio-uring-qd8'):.2f}× | **{max(fl_p, fl_u) / best:.2f}×** | "
              + (f"{ceil:.2f} | {auto / ceil:.2f}× |" if not math.isnan(ceil) else "– | – |"))


if __name__ == "__main__":
    main()
