#!/usr/bin/python3
"""State preparation and small measurements for bench/meta/run.sh.

Debian /usr/bin/python3, standard library only (http.client). Subcommands:

  keys N FILE                 write N keys (64 hex chars, sha256) to FILE
  prep PORT KEYFILE PAGES     init rank 0 with PAGES pages, then allocate and
                              confirm every key of KEYFILE on rank 0 (1,024 per
                              request) and check that batch_exists says true
  alloc128 PORT [ITER]        allocate 128 fresh keys in a namespace with
                              4,000,000 free pages and in one with 4,000,
                              alternating, timing each allocate; the pages are
                              released after each call so the free count stays
  rss PORT PID N [NTOK]       VmRSS growth for N confirmed keys on rank 0
                              (init with N pages, confirm 1,000 per request);
                              with NTOK, each confirmation names its parent
                              (the key before it: "prefix_key") and NTOK
                              tokens (0: the parent only), which are kept
  srvtime PORT                the server's own per-route request counts and
                              handler seconds (and the log's fsyncs and their
                              seconds, as "wal|fsyncs") from /v1/stats, as one
                              space-free JSON token (run.sh diffs two of them)

Every subcommand prints `RESULT key=value ...` lines for run.sh.
"""
import hashlib
import http.client
import json
import os
import statistics
import sys
import time


def make_keys(n, tag="kvpage-bench"):
    return [hashlib.sha256(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


class Client:
    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)

    def post(self, path, obj, want=(200, 204)):
        body = json.dumps(obj, separators=(",", ":")).encode()
        self.c.request("POST", path, body, {"Content-Type": "application/json"})
        r = self.c.getresponse()
        data = r.read()
        if r.status not in want:
            sys.exit(f"prep.py: POST {path} -> {r.status} {data[:300]!r}")
        return json.loads(data) if data else None

    def raw_post(self, path, body):
        self.c.request("POST", path, body, {"Content-Type": "application/json"})
        r = self.c.getresponse()
        data = r.read()
        return r.status, data


def cmd_init(port, pages):
    """Initializes rank 0 only (for the allocate + confirm runs)."""
    Client(port).post("/rank/0/initialize", {"num_pages": int(pages)})
    print(f"RESULT init pages={pages}")


def cmd_keys(n, path):
    with open(path, "w") as f:
        for k in make_keys(int(n)):
            f.write(k + "\n")


def cmd_prep(port, keyfile, pages):
    keys = [l.strip() for l in open(keyfile) if l.strip()]
    c = Client(port)
    t0 = time.monotonic()
    c.post("/rank/0/initialize", {"num_pages": int(pages), "role": "worker"})
    for i in range(0, len(keys), 1024):
        chunk = keys[i:i + 1024]
        res = c.post("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in chunk]})
        conf = [[k, p] for k, p in res["results"]]
        if any(p < 0 for _, p in conf):
            sys.exit("prep.py: allocate returned -1 during prep")
        c.post("/keys/confirm_write", {"rank": 0, "confirmations": conf, "pages_to_release": []})
    for i in range(0, len(keys), 1024):
        ex = c.post("/keys/batch_exists", {"keys": keys[i:i + 1024]})["exists"]
        if not all(ex):
            sys.exit("prep.py: a prepared key does not exist")
        loc = c.post("/keys/get_locations", {"rank": 0, "keys": keys[i:i + 1024]})["locations"]
        if any(l is None for l in loc):
            sys.exit("prep.py: a prepared key has no location")
    print(f"RESULT prep_keys={len(keys)} pages={pages} prep_s={time.monotonic() - t0:.2f}")


def cmd_alloc128(port, iters=2000):
    """Allocate 128 fresh keys against 4M and 4K free pages, alternating."""
    iters = int(iters)
    c = Client(port)
    pools = {"big": 4_000_000, "small": 4_000}
    for ns, n in pools.items():
        c.post(f"/ns/{ns}/rank/0/initialize", {"num_pages": n, "role": "worker"})
    times = {ns: [] for ns in pools}
    seq = 0
    for it in range(iters):
        order = ("big", "small") if it % 2 == 0 else ("small", "big")
        for ns in order:
            keys = [f"{seq:048x}{j:016x}" for j in range(128)]
            seq += 1
            body = json.dumps({"rank": 0, "keys": [[k, ""] for k in keys]},
                              separators=(",", ":")).encode()
            t0 = time.perf_counter_ns()
            st, data = c.raw_post(f"/ns/{ns}/keys/batch_allocate", body)
            dt = time.perf_counter_ns() - t0
            if st != 200:
                sys.exit(f"prep.py: allocate -> {st} {data[:200]!r}")
            pages = [p for _, p in json.loads(data)["results"]]
            if any(p < 0 for p in pages):
                sys.exit("prep.py: allocate returned -1 in alloc128")
            if it >= iters // 10:  # the first 10% warm up
                times[ns].append(dt / 1000.0)
            # give the pages back: RESERVED -> FREE (not timed)
            c.post(f"/ns/{ns}/keys/confirm_write",
                   {"rank": 0, "confirmations": [], "pages_to_release": pages})
    # free counts after the run, from /v1/stats
    c.c.request("GET", "/v1/stats")
    stats = json.loads(c.c.getresponse().read())
    free = {}
    for nsd in stats["namespaces"]:
        for r in nsd["ranks"]:
            free[nsd["deployment"]] = r["free"]
    out = []
    for ns in pools:
        v = sorted(times[ns])
        out.append(f"{ns}_free={free.get(ns)} {ns}_p50_us={statistics.median(v):.1f} "
                   f"{ns}_mean_us={statistics.fmean(v):.1f} "
                   f"{ns}_p90_us={v[int(len(v) * 0.9)]:.1f}")
    ratio = statistics.median(times["big"]) / statistics.median(times["small"])
    print("RESULT " + " ".join(out) + f" ratio_p50={ratio:.3f} n={len(times['big'])}")


def vmrss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit("prep.py: no VmRSS")


def cmd_rss(port, pid, n, ntok=None):
    n = int(n)
    c = Client(port)
    rss_idle = vmrss_kib(pid)
    c.post("/rank/0/initialize", {"num_pages": n, "role": "worker"})
    rss_init = vmrss_kib(pid)
    t0 = time.monotonic()
    prev = None
    for i in range(0, n, 1000):
        conf = [[hashlib.sha256(f"rss-{j}".encode()).hexdigest(), j]
                for j in range(i, min(n, i + 1000))]
        body = {"rank": 0, "confirmations": conf, "pages_to_release": []}
        if ntok is not None:  # a chain from the last key of the request before
            body["prefix_key"] = prev
            if int(ntok):
                body["token_ids"] = [list(range(j, j + int(ntok))) for j in range(len(conf))]
            prev = conf[-1][0]
        c.post("/keys/confirm_write", body)
    dt = time.monotonic() - t0
    rss_after = vmrss_kib(pid)
    c.c.request("GET", "/v1/stats")
    st = json.loads(c.c.getresponse().read())
    r0 = st["namespaces"][0]["ranks"][0]
    if r0["held"] != n or r0["keys"] != n:
        sys.exit(f"prep.py: expected {n} held keys, stats say {r0}")
    per_key = (rss_after - rss_init) * 1024 / n
    per_page = (rss_init - rss_idle) * 1024 / n
    print(f"RESULT rss_idle_kib={rss_idle} rss_init_kib={rss_init} rss_after_kib={rss_after} "
          f"bytes_per_key={per_key:.1f} bytes_per_page_init={per_page:.1f} confirm_s={dt:.1f}")


def cmd_srvtime(port):
    c = Client(port)
    c.c.request("GET", "/v1/stats")
    st = json.loads(c.c.getresponse().read())
    out = {}
    for route, by_status in st.get("requests", {}).get("by_route", {}).items():
        for status, v in by_status.items():
            out[f"{route}|{status}"] = [v.get("count", 0), v.get("seconds", 0.0)]
    wal = st.get("wal")
    if wal:  # the log's fsyncs so far and their time (servers with --data-dir)
        out["wal|fsyncs"] = [wal.get("fsyncs", 0), float(wal.get("fsync_seconds", 0.0))]
    print(json.dumps(out, separators=(",", ":")).replace(" ", "%20"))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    {"keys": cmd_keys, "init": cmd_init, "prep": cmd_prep, "alloc128": cmd_alloc128, "rss": cmd_rss,
     "srvtime": cmd_srvtime}[cmd](*args)


if __name__ == "__main__":
    main()
