#!/usr/bin/python3
"""Turns a results file of bench/io/run.sh into the README's markdown table."""
import sys


def main():
    rows = {}
    head = []
    for line in open(sys.argv[1]):
        if line.startswith("#"):
            head.append(line.strip("# \n"))
            continue
        kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
        key = (int(kv["direct"]), int(kv["bpp"]), kv["rw"])
        rows.setdefault(key, {})[kv["tool"]] = (float(kv["gbps"]), kv.get("backend", ""))
    for h in head:
        print(f"`{h}`  ")
    print()
    print("| mode | page | op | kvpage auto | kvpage psync | kvpage uring | kvpage auto, hot pool | "
          "fio psync 2 jobs | fio io_uring QD8 | fio io_uring 2x4 | Python 16 thr | "
          "auto / best fio | hot / best fio | auto / Python |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(rows):
        direct, bpp, rw = key
        r = rows[key]
        g = lambda t: r.get(t, (float("nan"), ""))[0]
        auto, auto_be = r.get("kvpage-auto", (float("nan"), ""))
        fios = [g(t) for t in ("fio-psync-2j", "fio-uring-qd8", "fio-uring-2x4")]
        best = max(fios)
        page = f"{bpp >> 20} MiB" if bpp >= 1 << 20 else f"{bpp >> 10} KiB"
        print(f"| {'O_DIRECT' if direct else 'buffered'} | {page} | {rw} | "
              f"**{auto:.2f}** ({auto_be}) | {g('kvpage-psync'):.2f} | {g('kvpage-uring'):.2f} | "
              f"{g('kvpage-hot'):.2f} | {fios[0]:.2f} | {fios[1]:.2f} | {fios[2]:.2f} | "
              f"{g('python'):.2f} | **{auto / best:.2f}×** | {g('kvpage-hot') / best:.2f}× | "
              f"{auto / g('python'):.1f}× |")


if __name__ == "__main__":
    main()
