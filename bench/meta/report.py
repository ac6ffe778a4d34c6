#!/usr/bin/python3
"""Turn run.sh's results file into the markdown table (medians over reps).

  report.py RESULTS "1 2"
"""
import collections
import json
import statistics
import sys


def load(path):
    runs = collections.defaultdict(list)  # label -> [dict per rep]
    comments = []
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            comments.append(line[1:].strip())
            continue
        label, *kv = line.split()
        d = {}
        for item in kv:
            k, _, v = item.partition("=")
            if k in ("srv_before", "srv_after"):
                d[k] = json.loads(v.replace("%20", " "))
                continue
            try:
                d[k] = float(v)
            except ValueError:
                d[k] = v
        runs[label].append(d)
    for label, ds in runs.items():
        runs[label] = merge_reps(ds)
    return runs, comments


SUMMED = ("requests", "seconds", "allocs", "pairs_ok", "neg_pages", "non_ok", "checked", "non200",
          "err_connect", "err_read", "err_write", "err_status", "err_timeout")


def merge_reps(ds):
    """One dict per rep: run.sh's ab_runs cuts a run into several of one label
    and rep. Counts and seconds add up (rps = requests / seconds), p99 and max
    are the highest of the pieces, p50 their median, and the server's counters
    (srv_before/srv_after) add up so that after - before is the sum of the
    pieces' differences."""
    by_rep = collections.OrderedDict()
    for d in ds:
        by_rep.setdefault(d.get("rep"), []).append(d)
    out = []
    for parts in by_rep.values():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        m = dict(parts[0])
        for k in SUMMED:
            if k in m:
                m[k] = sum(p.get(k, 0) for p in parts)
        m["rps"] = m["requests"] / m["seconds"]
        for k in ("p99_ms", "max_ms"):
            m[k] = max(p[k] for p in parts)
        m["p50_ms"] = statistics.median(p["p50_ms"] for p in parts)
        for k in ("srv_before", "srv_after"):
            if all(k in p for p in parts):
                acc = {}
                for p in parts:
                    for route, (cnt, sec) in p[k].items():
                        c0, s0 = acc.get(route, [0, 0.0])
                        acc[route] = [c0 + cnt, s0 + sec]
                m[k] = acc
        m["pieces"] = len(parts)
        out.append(m)
    return out


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, nd=0):
    return f"{x:,.{nd}f}"


def main():
    runs, comments = load(sys.argv[1])
    threads = sys.argv[2].split() if len(sys.argv) > 2 else ["1", "2"]
    for c in comments:
        print(f"<!-- {c} -->")

    def rep_ratio(label, probe):
        """median over reps of kvpage rps / probe rps of the same rep"""
        p = {int(d["rep"]): d["rps"] for d in runs.get(probe, [])}
        return med([d["rps"] / p[int(d["rep"])] for d in runs.get(label, []) if int(d["rep"]) in p])

    def m(label, key):
        return med([d[key] for d in runs.get(label, []) if key in d])

    def errs(label):
        return int(sum(d.get("err_connect", 0) + d.get("err_read", 0) + d.get("err_write", 0) +
                       d.get("err_status", 0) + d.get("err_timeout", 0) for d in runs.get(label, [])))

    verdict = lambda ok: "**PASS**" if ok else "**MISS**"
    nreps = max((len(v) for v in runs.values()), default=0)

    print()
    print(f"### Results (median of {nreps} reps; ratios = median of per-rep kvpage/probe)")
    print()
    print("| operation | threads | measured | target | result |")
    print("|---|---:|---|---|---|")
    for t in threads:
        L = f"kvpage_t{t}_exists64"
        rps, p99, ratio = m(L, "rps"), m(L, "p99_ms"), rep_ratio(L, "probe_exists64")
        ok = ratio >= 0.6 and rps >= 25000 and p99 <= 2.0
        print(f"| batch_exists, 64 keys | {t} | {fmt(rps)} req/s = **{ratio:.2f}× ceiling** "
              f"({fmt(m('probe_exists64', 'rps'))} req/s); p50 {m(L, 'p50_ms'):.2f} ms, "
              f"p99 {p99:.2f} ms | ≥ 0.6× ceiling, ≥ 25,000 req/s, p99 ≤ 2 ms | {verdict(ok)} |")
    for t in threads:
        L = f"kvpage_t{t}_exists1024"
        rps = m(L, "rps")
        kps = rps * 1024
        print(f"| batch_exists, 1,024 keys | {t} | **{fmt(kps)} keys/s** ({fmt(rps)} req/s, "
              f"p99 {m(L, 'p99_ms'):.2f} ms; {rep_ratio(L, 'probe_exists1024'):.2f}× probe with the "
              f"same body) | ≥ 3,000,000 keys/s | {verdict(kps >= 3e6)} |")
    for t in threads:
        L = f"kvpage_t{t}_locations64"
        rps, ratio = m(L, "rps"), rep_ratio(L, "probe_locations64")
        print(f"| get_locations, 64 keys | {t} | {fmt(rps)} req/s = **{ratio:.2f}× ceiling** "
              f"({fmt(m('probe_locations64', 'rps'))} req/s); p99 {m(L, 'p99_ms'):.2f} ms "
              f"| ≥ 0.5× ceiling | {verdict(ratio >= 0.5)} |")
    for t in threads:
        L = f"kvpage_t{t}_allocconfirm64"
        pps = med([d["pairs_ok"] / d["seconds"] for d in runs.get(L, [])])
        bad = int(sum(d.get("non_ok", 0) + d.get("neg_pages", 0) for d in runs.get(L, [])))
        print(f"| batch_allocate + confirm_write, 64 keys | {t} | **{fmt(pps)} pairs/s** "
              f"({fmt(pps * 64)} keys/s; {bad} bad responses or -1 pages) "
              f"| ≥ 10,000 pairs/s | {verdict(pps >= 10000 and bad == 0)} |")
    base = {int(d["rep"]): d["pairs_ok"] / d["seconds"] for d in runs.get("kvpage_t1_allocconfirm64", [])}
    # run.sh's controls, printed after the real modes in this order
    controls = {"batch-nosnap": "control: the same without snapshots",
                "batch-nodisk": "control: without snapshots, fsync and fdatasync no-ops"}
    rank = {m: i + 1 for i, m in enumerate(controls)}
    for L in sorted((l for l in runs if l.startswith("kvpage_fsync_")),
                    key=lambda l: (rank.get(l.split("_")[2], 0), l)):
        mode = L.split("_")[2]
        pps = med([d["pairs_ok"] / d["seconds"] for d in runs[L]])
        ratio = med([d["pairs_ok"] / d["seconds"] / base[int(d["rep"])] for d in runs[L]
                     if int(d["rep"]) in base])
        fs = []  # per rep: fsyncs/s, mean ms, pairs per fsync
        for d in runs[L]:
            n0, s0 = (d.get("srv_before") or {}).get("wal|fsyncs", [0, 0.0])
            n1, s1 = (d.get("srv_after") or {}).get("wal|fsyncs", [0, 0.0])
            if n1 > n0:
                n = n1 - n0
                fs.append((n / d["seconds"], (s1 - s0) / n * 1e3, d["pairs_ok"] / n))
        wal = (f"; log: {fmt(med([f[0] for f in fs]))} fsyncs/s of {med([f[1] for f in fs]):.2f} ms, "
               f"{med([f[2] for f in fs]):.1f} pairs each" if fs and mode != "batch-nodisk" else "")
        if mode in controls:
            print(f"| {controls[mode]} | 1 | {fmt(pps)} pairs/s = {ratio:.2f}× in-memory "
                  f"(same rep){wal} | — | — |")
            continue
        print(f"| allocate + confirm, 64 keys, `--data-dir` `--fsync {mode}` (issue 3) | 1 | "
              f"**{fmt(pps)} pairs/s = {ratio:.2f}× in-memory** (same rep){wal} | ≥ 0.7× in-memory | "
              f"{verdict(ratio >= 0.7)} |")
    a = runs.get("alloc128", [{}])[0]
    if a:
        r = a["ratio_p50"]
        print(f"| allocate 128 keys: 4,000,000 vs 4,000 free pages | 1 | p50 "
              f"{a['big_p50_us']:.0f} µs vs {a['small_p50_us']:.0f} µs (mean {a['big_mean_us']:.0f} "
              f"vs {a['small_mean_us']:.0f}); **ratio {r:.2f}** | within 20% | "
              f"{verdict(abs(r - 1) <= 0.2)} |")
    rs = runs.get("rss", [{}])[0]
    if rs:
        b = rs["bytes_per_key"]
        print(f"| memory per confirmed key (64-char keys, 1 rank) | 1 | **{b:.1f} B/key** (VmRSS "
              f"{fmt(rs['rss_init_kib'])} → {fmt(rs['rss_after_kib'])} KiB; "
              f"{rs['bytes_per_page_init']:.1f} B/page at init) | ≤ 150 B/key | {verdict(b <= 150)} |")
    for t in threads:
        L = f"sanity_t{t}_exists2"
        d = runs.get(L, [{}])[0]
        if d:
            ok = d["checked"] > 0 and d["non200"] == 0 and errs(L) == 0
            print(f"| sanity: batch_exists 2 keys, all 200 | {t} | {fmt(d['checked'])} responses "
                  f"checked, non-200 = {int(d['non200'])}, wrk errors = {errs(L)} "
                  f"({fmt(d['rps'])} req/s) | errors = 0 | {verdict(ok)} |")

    sglang_table(runs, threads, med, fmt, verdict)

    fl = [(l, runs[l][0]) for l in sorted(runs) if l.startswith("jsonfloor_")]
    if fl:
        print()
        print("### JSON floor: jansson `json_loadb` + `json_decref` alone (no HTTP), same bodies")
        print()
        print("| body | bytes | µs per parse | ns/byte | max requests/s per core from parsing alone |")
        print("|---|---:|---:|---:|---:|")
        for l, d in fl:
            print(f"| {d['form']} {int(d['batch'])} keys | {fmt(d['body_bytes'])} | {d['parse_us']:.1f} "
                  f"| {d['ns_per_byte']:.1f} | {fmt(d['max_rps_per_core'])} |")

    print()
    print("### Every run (requests/s; p99 ms)")
    print()
    labels = sorted(l for l in runs if l.startswith(("probe_", "kvpage_")))
    print("| run | " + " | ".join(f"rep {i + 1}" for i in range(nreps)) + " | median |")
    print("|---|" + "---:|" * (nreps + 1))
    for l in labels:
        cells = [f"{fmt(d['rps'])}; {d['p99_ms']:.2f}" for d in runs[l]]
        cells += [""] * (nreps - len(cells))
        extra = ""
        if "pairs_ok" in runs[l][0]:
            extra = " (pairs/s " + ", ".join(fmt(d["pairs_ok"] / d["seconds"]) for d in runs[l]) + ")"
        print(f"| {l}{extra} | " + " | ".join(cells) + f" | {fmt(m(l, 'rps'))} |")

    # The server's own handler time (kvp__server_handle: JSON parse, meta, JSON
    # write; not libmicrohttpd or the kernel), from /v1/stats before/after a run.
    print()
    print("### kvpage handler time per request (from /v1/stats; median over reps)")
    print()
    print("Handler = JSON parse + metadata + JSON write inside kvpage; the rest of each "
          "request (libmicrohttpd, syscalls, TCP, waiting for the CPU) is outside it. "
          "`busy` = handler seconds / wall seconds of the run (for 1 thread, the share of "
          "the server thread spent in the handler).")
    print()
    print("| run | route | handler µs/request | busy |")
    print("|---|---|---:|---:|")
    for l in labels:
        if l.startswith("probe_"):
            continue
        per_route = collections.defaultdict(list)
        busy = []
        for d in runs[l]:
            b, a = d.get("srv_before"), d.get("srv_after")
            if not a:
                continue
            tot = 0.0
            for route, (cnt, sec) in a.items():
                cb, sb = (b or {}).get(route, [0, 0.0])
                if cnt - cb >= 10 and not route.startswith(("/v1/stats", "wal|")):
                    per_route[route].append((sec - sb) / (cnt - cb) * 1e6)
                    tot += sec - sb
            busy.append(tot / d["seconds"])
        for route, v in sorted(per_route.items()):
            print(f"| {l} | `{route.replace('|', ' ')}` | {med(v):.1f} | {med(busy):.2f} |")
    total_err = sum(errs(l) for l in runs if l.startswith(("probe_", "kvpage_", "sanity_")))
    print()
    print(f"wrk socket/status errors over all runs: {total_err}")


def handler_us(d, route):
    """The server's mean handler time per request of route during run d (µs), or None."""
    b, a = d.get("srv_before") or {}, d.get("srv_after") or {}
    for key in (route + "|200", route + "|204"):
        if key in a:
            cnt, sec = a[key]
            cb, sb = b.get(key, [0, 0.0])
            if cnt - cb >= 10:
                return (sec - sb) / (cnt - cb) * 1e6
    return None


def sglang_table(runs, threads, med, fmt, verdict):
    """Issue 11: each SGLang op beside its vLLM op, same server, same rep."""
    pairs = [  # (operation, vLLM label, SGLang label, [(vLLM route, SGLang route)], unit)
        ("exists, 64 keys: `/0/exists` ÷ `batch_exists`", "exists64", "sglexists64",
         [("/keys/batch_exists", "/{rank}/exists")], "req/s"),
        ("get_page_indices ÷ get_locations, 64 keys", "locations64", "sglget64",
         [("/keys/get_locations", "/{rank}/get_page_indices")], "req/s"),
        ("exists, 1,024 keys: `/0/exists` ÷ `batch_exists`", "exists1024", "sglexists1024",
         [("/keys/batch_exists", "/{rank}/exists")], "req/s"),
        ("reserve_and_allocate + confirm_write ÷ batch_allocate + confirm_write, 64 keys "
         "(pairs.lua, one connection per wrk thread)", "pairsvllm64", "pairssglang64",
         [("/keys/batch_allocate", "/{rank}/reserve_and_allocate_page_indices"),
          ("/keys/confirm_write", "/{rank}/confirm_write")], "pairs/s"),
    ]
    if not any(f"kvpage_t{t}_{s}" in runs for t in threads for _, _, s, _, _ in pairs):
        return
    print()
    print("### Issue 11: SGLang beside vLLM (same server, same rep, alternating order)")
    print()
    print("Ratio = median over reps of SGLang ÷ vLLM of the same rep. Handler = the server's own "
          "µs per request of each route (/v1/stats), median over reps.")
    print()
    print("| operation | threads | vLLM | SGLang | ratio (per rep) | handler µs vLLM → SGLang "
          "| target | result |")
    print("|---|---:|---:|---:|---|---|---|---|")

    def rate(d, unit):
        return d["pairs_ok"] / d["seconds"] if unit == "pairs/s" else d["rps"]

    for name, vl, sl, routes, unit in pairs:
        for t in threads:
            V, S = runs.get(f"kvpage_t{t}_{vl}", []), runs.get(f"kvpage_t{t}_{sl}", [])
            if not V or not S:
                continue
            v = {int(d["rep"]): d for d in V}
            per = [(int(d["rep"]), rate(d, unit) / rate(v[int(d["rep"])], unit))
                   for d in S if int(d["rep"]) in v]
            per.sort()
            ratio = med([r for _, r in per])
            hs = []
            for vr, sr in routes:
                hv = [h for h in (handler_us(d, vr) for d in V) if h is not None]
                hsg = [h for h in (handler_us(d, sr) for d in S) if h is not None]
                hs.append(f"`{vr.rsplit('/', 1)[1]}` {med(hv):.1f} → {med(hsg):.1f}")
            print(f"| {name} | {t} | {fmt(med([rate(d, unit) for d in V]))} {unit} | "
                  f"{fmt(med([rate(d, unit) for d in S]))} {unit} | **{ratio:.2f}** ("
                  + ", ".join(f"{r:.2f}" for _, r in per) + ") | " + "; ".join(hs) +
                  f" | ≥ 0.9× | {verdict(ratio >= 0.9)} |")


if __name__ == "__main__":
    main()
