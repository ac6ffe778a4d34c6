#!/usr/bin/python3
"""bench/soak/soak.py — soak test of `kvpage serve --fsync batch` (issue 11).

Mixed vLLM and SGLang traffic from N keep-alive connections (one thread and
one requests.Session each) for --duration seconds, while the server is killed
with SIGKILL and restarted every --kill-interval seconds. Reports errors
outside the restart windows, acknowledged confirmations lost, the server's
RSS and open fds over time, and `kvpage fsck` after a clean stop. See
README.md next to this file for what every figure means.

Definitions (the summary repeats them):
- restart window: from the moment the driver sends SIGKILL until the
  restarted server has answered GET /healthz with 200.
- an operation (one request, or for a write every allocate and confirm of the
  batch on every rank) is "in a window" when its time span, from its first
  request's send to its end (reply or failure), overlaps a restart window.
  An error is any reply other than the route's documented 2xx status, or any
  connection error / timeout; errors of operations not in a window are the
  headline figure.
- acknowledged: a (rank, key) whose confirm_write got 204. The driver keeps
  the page it confirmed. A key stops being acknowledged only when the driver
  deletes it (it is dropped from the record before the delete is sent).
  Every rank has far more pages than keys can ever be written to it, so
  nothing can be evicted (the samples also check `evictions` stays 0).
- lost: an acknowledged (rank, key) that a check after a restart (or at the
  end) does not find, or finds at another page.
"""
import argparse
import csv
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import requests

BATCH = 64               # keys per request, as the engines send them
CHECK_CHUNK = 1024       # keys per request of the driver's own checks
NUM_PAGES = 1 << 20      # pages per rank: far more than a rank can ever hold here
TIMEOUT = 30             # seconds per request
WEIGHTS = {"write": 45, "exists": 20, "lookup": 27, "delete": 8}

# What each connection does: (dialect, deployment prefix, pool, ranks).
# A vLLM connection writes each batch on every rank of its deployment (the
# TP workers of one engine, in turn), so that its keys become complete; an
# SGLang connection works on one rank. Connection i takes ROLES[i % 16].
A = ("vllm", "", "kv", (0, 1))                   # default deployment, TP 2
B = ("vllm", "/ns/soak-b", "kv", (0, 1, 2, 3))   # second deployment, TP 4
ROLES = [A, A, A, A, A, A, B, B,
         ("sglang", "/ns/soak-b", "kv", (0,)), ("sglang", "/ns/soak-b", "kv", (1,)),
         ("sglang", "/ns/soak-b", "kv", (2,)), ("sglang", "/ns/soak-b", "kv", (3,)),
         ("sglang", "", "mamba", (0,)), ("sglang", "", "mamba", (1,)),
         ("sglang", "", "mamba", (0,)), ("sglang", "", "mamba", (1,))]

now = time.monotonic


def session():
    s = requests.Session()
    s.trust_env = False  # ignore proxy variables
    return s


class Failed(Exception):
    """A request that got an unexpected status or no reply at all."""

    def __init__(self, route, what, conn):
        super().__init__(f"{route}: {what}")
        self.route, self.what, self.conn = route, what, conn


def post(s, url, route, body, expect):
    try:
        r = s.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"},
                   timeout=TIMEOUT)
    except requests.RequestException as e:
        raise Failed(route, f"{type(e).__name__}: {str(e)[:200]}", True) from None
    if r.status_code != expect:
        raise Failed(route, f"HTTP {r.status_code} {r.text[:200]!r}", False)
    return r


# ---------------------------------------------------------------------------
# The server: started, killed and restarted by the controller.

class Server:
    def __init__(self, binary, port, data_dir, log_path, extra):
        self.cmd = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir,
                    "--fsync", "batch"] + extra
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.proc = None
        self.lifetime = -1
        self.ready = False  # the current process has answered /healthz
        self.failed_starts = []  # (t, lifetime, exit status, last log line)

    def spawn(self, note):
        with open(self.log_path, "ab") as log:
            log.write(f"=== lifetime {self.lifetime}{note}: {' '.join(self.cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log)

    def start(self):
        """Starts a new process and waits for /healthz; returns the time it
        answered. A process that exits before it answers is recorded in
        failed_starts (time, lifetime, exit status, its last log line) and
        started again 0.2 s later, for up to 120 s."""
        self.ready = False
        self.lifetime += 1
        self.spawn("")
        deadline = now() + 120
        s = session()
        try:
            while now() < deadline:
                if self.proc.poll() is not None:
                    self.failed_starts.append((now(), self.lifetime, self.proc.returncode,
                                               last_line(self.log_path)))
                    time.sleep(0.2)
                    self.spawn(" (started again)")
                    continue
                try:
                    if s.get(self.base + "/healthz", timeout=1).status_code == 200:
                        self.ready = True
                        return now()
                except requests.RequestException:
                    s.close()
                    s = session()
                time.sleep(0.01)
        finally:
            s.close()
        raise SystemExit(f"soak: server did not answer /healthz within 120 s, see {self.log_path}")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "hung (killed after 120 s)"


# ---------------------------------------------------------------------------
# One connection of traffic.

class Worker(threading.Thread):
    def __init__(self, idx, role, base, keys_per_conn, seed, stop):
        super().__init__(name=f"w{idx}", daemon=True)
        self.idx = idx
        self.dialect, self.prefix, self.pool, self.ranks = role
        self.url = base + self.prefix
        self.rng = random.Random(seed * 1000 + idx)
        # The connection's own keys: content hashes, 64 hex characters. No
        # other connection uses them, so only this one changes their state.
        self.keys = [hashlib.sha256(f"soak-{seed}-{idx}-{i}".encode()).hexdigest()
                     for i in range(keys_per_conn)]
        self.acked = {r: {} for r in self.ranks}   # rank -> key -> confirmed page
        # Keys whose delete got 204 and that were not written since: a
        # check also makes sure that they do not come back after a restart.
        self.deleted = {r: set() for r in self.ranks}
        # Held while this worker deletes, or changes `acked`, and by the
        # controller while it checks this worker's keys: a key that a check
        # looks up cannot be deleted under it.
        self.lock = threading.Lock()
        self.stop_ev = stop
        self.s = session()
        self.errors = []      # (op_t0, t_end, op, route, what, conn)
        self.anomalies = []   # (t, text): acknowledged keys reported missing during traffic, -1 pages
        self.requests = {}    # route -> count of expected replies
        self.ops = {op: 0 for op in WEIGHTS}
        self.acks = 0         # (rank, key) confirmations answered 204

    def desc(self):
        return (f"{self.dialect} {self.prefix or '(default)'} pool {self.pool} "
                f"rank{'s' if len(self.ranks) > 1 else ''} {','.join(map(str, self.ranks))}")

    def call(self, route, path, body, expect):
        r = post(self.s, self.url + path, route, body, expect)
        self.requests[route] = self.requests.get(route, 0) + 1
        return r

    def anomaly(self, text):
        self.anomalies.append((now(), f"w{self.idx} {self.desc()}: {text}"))

    def complete(self, k):
        return all(k in self.acked[r] for r in self.ranks)

    def sg(self, body):
        body["namespace"] = self.pool
        return body

    def initialize(self):
        for r in self.ranks:
            if self.dialect == "vllm":
                self.call("v/initialize", f"/rank/{r}/initialize",
                          {"num_pages": NUM_PAGES, "role": "worker"}, 200)
            else:
                self.call("s/initialize", f"/{r}/initialize", self.sg({"num_pages": NUM_PAGES}), 204)

    def run(self):
        ops, weights = list(WEIGHTS), list(WEIGHTS.values())
        while not self.stop_ev.is_set():
            op = self.rng.choices(ops, weights)[0]
            start = self.rng.randrange(len(self.keys) - BATCH + 1)
            batch = self.keys[start:start + BATCH]
            t0 = now()
            try:
                getattr(self, f"{self.dialect}_{op}")(batch)
                self.ops[op] += 1
            except Failed as e:
                self.errors.append((t0, now(), op, e.route, e.what, e.conn))
                time.sleep(0.05)  # do not spin while the server restarts

    def choose_release(self, conf, acked_r):
        """Like an engine whose write of a few pages failed: with probability
        1/4, the last 1..4 keys that are not acknowledged yet are not
        confirmed, and their pages are released instead."""
        if self.rng.random() >= 0.25:
            return conf, []
        new = [c for c in conf if c[0] not in acked_r]
        drop = new[-self.rng.randint(1, 4):] if new else []
        dropped = {k for k, _ in drop}
        return [c for c in conf if c[0] not in dropped], [p for _, p in drop]

    def forget_deleted(self, batch):
        """Before a write: its keys may exist again from now on."""
        with self.lock:
            for r in self.ranks:
                self.deleted[r].difference_update(batch)

    def record_acks(self, r, conf):
        with self.lock:
            for k, p in conf:
                self.acked[r][k] = p
        self.acks += len(conf)

    # ---- vLLM: one engine with len(ranks) TP workers -----------------------
    def vllm_write(self, batch):
        self.forget_deleted(batch)
        for r in self.ranks:
            res = self.call("v/batch_allocate", "/keys/batch_allocate",
                            {"rank": r, "keys": [[k, ""] for k in batch]}, 200).json()["results"]
            acked_r = self.acked[r]
            conf = []
            for k, p in res:
                q = acked_r.get(k)
                if q is not None and q != p:
                    self.anomaly(f"batch_allocate gave acknowledged key {k} page {p} on rank {r}, "
                                 f"confirmed at {q}")
                if p < 0:
                    self.anomaly(f"batch_allocate gave -1 for {k} on rank {r}")
                else:
                    conf.append([k, p])
            conf, release = self.choose_release(conf, acked_r)
            self.call("v/confirm_write", "/keys/confirm_write",
                      {"rank": r, "confirmations": conf, "pages_to_release": release}, 204)
            self.record_acks(r, conf)

    def vllm_exists(self, batch):
        ex = self.call("v/batch_exists", "/keys/batch_exists", {"keys": batch}, 200).json()["exists"]
        for k, e in zip(batch, ex):
            if not e and self.complete(k):
                self.anomaly(f"batch_exists: acknowledged complete key {k} is not there")

    def vllm_lookup(self, batch):
        r = self.rng.choice(self.ranks)
        locs = self.call("v/get_locations", "/keys/get_locations",
                         {"rank": r, "keys": batch}, 200).json()["locations"]
        for k, p in zip(batch, locs):
            if self.complete(k) and p != self.acked[r][k]:
                self.anomaly(f"get_locations rank {r}: acknowledged complete key {k} at {p}, "
                             f"confirmed at {self.acked[r][k]}")

    def vllm_delete(self, batch):
        with self.lock:
            for r in self.ranks:
                for k in batch:
                    self.acked[r].pop(k, None)
            self.call("v/delete", "/keys/delete", {"keys": batch}, 204)
            for r in self.ranks:
                self.deleted[r].update(batch)

    # ---- SGLang: one TP rank of one pool -----------------------------------
    def sglang_write(self, batch):
        self.forget_deleted(batch)
        r = self.ranks[0]
        acked_r = self.acked[r]
        idx = self.call("s/reserve_and_allocate", f"/{r}/reserve_and_allocate_page_indices",
                        self.sg({"keys": [[k, ""] for k in batch]}), 200).json()["indices"]
        conf = []
        for k, (existed, p) in zip(batch, idx):
            q = acked_r.get(k)
            if q is not None and (not existed or p != q):
                self.anomaly(f"reserve: acknowledged key {k} came back [{existed}, {p}], "
                             f"confirmed at {q}")
            if p < 0:
                self.anomaly(f"reserve gave -1 for {k}")
            elif not existed:
                conf.append([k, p])
        conf, release = self.choose_release(conf, acked_r)
        self.call("s/confirm_write", f"/{r}/confirm_write",
                  self.sg({"written_keys_to_confirm": conf, "pages_to_release": release}), 204)
        self.record_acks(r, conf)

    def sglang_exists(self, batch):
        r = self.ranks[0]
        ex = self.call("s/exists", f"/{r}/exists", self.sg({"keys": batch}), 200).json()["exists"]
        for k, e in zip(batch, ex):
            if not e and k in self.acked[r]:
                self.anomaly(f"exists: acknowledged key {k} is not there")

    def sglang_lookup(self, batch):
        r = self.ranks[0]
        idx = self.call("s/get_page_indices", f"/{r}/get_page_indices",
                        self.sg({"keys": batch}), 200).json()["indices"]
        for k, p in zip(batch, idx):
            q = self.acked[r].get(k)
            if q is not None and p != q:
                self.anomaly(f"get_page_indices: acknowledged key {k} at {p}, confirmed at {q}")

    def sglang_delete(self, batch):
        r = self.ranks[0]
        with self.lock:
            for k in batch:
                self.acked[r].pop(k, None)
            self.call("s/delete_keys", f"/{r}/delete_keys", self.sg({"keys": batch}), 204)
            self.deleted[r].update(batch)


# ---------------------------------------------------------------------------
# The controller's check of every acknowledged key.

def get_json(s, url):
    try:
        r = s.get(url, timeout=TIMEOUT)
        if r.status_code != 200:
            raise Failed("/v1/stats", f"HTTP {r.status_code} {r.text[:200]!r}", False)
        return r.json()
    except requests.RequestException as e:
        raise Failed("/v1/stats", f"{type(e).__name__}: {str(e)[:200]}", True) from None
    except (ValueError, KeyError) as e:
        raise Failed("/v1/stats", f"bad JSON: {e}", False) from None


def chunks(seq, n):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


class Check:
    """One check of every acknowledged key of every worker (see check_worker)."""

    def __init__(self, label, errors):
        self.label = label
        self.s = session()
        self.errors = errors   # the controller's error list: (t0, t1, op, what)
        self.checked = 0       # acknowledged (rank, key) looked up
        self.lost = {}         # (worker, rank, key) -> what the first failed lookup gave
        self.unverified = set()  # acknowledged (worker, rank, key) whose lookup got no reply
        self.deleted = 0       # deleted (rank, key) looked up
        self.back = []         # deleted (rank, key) found again

    def ask(self, url, route, body, field, n):
        """The list `field` of a 200 reply, one element per key. Any other
        reply is an error, and answers "not found" for each of the n keys (the
        server said something else than where they are); no reply is an
        error, and returns None: the keys are unverified."""
        t0 = now()
        try:
            return post(self.s, url, route, body, 200).json()[field]
        except Failed as e:
            self.errors.append((t0, now(), "check", f"{self.label}: {e}"))
            return None if e.conn else [f"(no answer: {e.what[:80]})"] * n


def check_worker(c, base, w):
    """Looks up every acknowledged (rank, key) of worker w, and every (rank,
    key) it deleted (204) and has not written since. Call with w.lock held."""
    url = base + w.prefix
    pool = "kv" if w.dialect == "vllm" else w.pool

    def lookup(r, keys, acked_r, how):
        for part in chunks(keys, CHECK_CHUNK):
            body = {"keys": part, "namespace": pool}
            if how == "get_locations":
                ans = c.ask(url + "/keys/get_locations", "check get_locations",
                            {"rank": r, "keys": part}, "locations", len(part))
            elif how == "exists":
                ans = c.ask(url + f"/{r}/exists", "check exists", body, "exists", len(part))
            else:
                ans = c.ask(url + f"/{r}/get_page_indices", "check get_page_indices", body,
                            "indices", len(part))
            if ans is None:
                if acked_r is not None:
                    c.unverified.update((w.idx, r, k) for k in part)
                continue
            for k, v in zip(part, ans):
                if acked_r is None:                      # a deleted key: must be absent
                    if v is not None and not isinstance(v, str):
                        c.back.append((w.idx, r, k, f"deleted, {how} gives {v}"))
                elif how == "exists":
                    if v is not True:
                        c.lost.setdefault((w.idx, r, k), f"{how} gives {v}")
                elif v != acked_r[k]:
                    c.lost.setdefault((w.idx, r, k), f"{how} gives {v}, confirmed at {acked_r[k]}")

    for r in w.ranks:
        gone = list(w.deleted[r])
        lookup(r, gone, None, "get_page_indices")
        c.deleted += len(gone)
    if w.dialect == "vllm":
        # Complete keys through the vLLM routes: batch_exists, and
        # get_locations on every rank. A key confirmed on only some ranks
        # (its write was cut by a kill) is not complete, so get_locations
        # answers null for it by design; it is looked up per rank with the
        # SGLang route get_page_indices on pool kv, which protocol.md §1
        # makes the same namespace.
        complete = [k for k in w.acked[w.ranks[0]] if w.complete(k)]
        for part in chunks(complete, CHECK_CHUNK):
            ex = c.ask(url + "/keys/batch_exists", "check batch_exists", {"keys": part},
                       "exists", len(part))
            for k, e in zip(part, ex or []):
                if e is not True:   # not complete: lost on at least one rank, so on each
                    for r in w.ranks:
                        c.lost.setdefault((w.idx, r, k), f"batch_exists gives {e}")
        for r in w.ranks:
            acked_r = w.acked[r]
            lookup(r, complete, acked_r, "get_locations")
            lookup(r, [k for k in acked_r if not w.complete(k)], acked_r, "get_page_indices")
            c.checked += len(acked_r)
    else:
        r = w.ranks[0]
        acked_r = w.acked[r]
        keys = list(acked_r)
        lookup(r, keys, acked_r, "exists")
        lookup(r, keys, acked_r, "get_page_indices")
        c.checked += len(keys)


# ---------------------------------------------------------------------------
# Samples of the server process.

def proc_sample(pid):
    """(VmRSS KiB, open fds, threads) of a live pid, or None if it is gone."""
    try:
        # fds first: a process killed in between has no VmRSS when its status
        # is read, and the sample is dropped (not counted as 0 fds)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            st = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss = re.search(r"^VmRSS:\s+(\d+)", st, re.M)
    thr = re.search(r"^Threads:\s+(\d+)", st, re.M)
    if not rss or not thr:  # a killed process not yet reaped (a zombie) has no VmRSS
        return None
    return int(rss.group(1)), fds, int(thr.group(1))


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


SAMPLE_FIELDS = ["t_s", "lifetime", "pid", "why", "rss_kib", "fds", "threads", "loadavg1", "held",
                 "reserved", "keys", "evictions", "release_of_held_page", "wal_bytes",
                 "snapshots", "data_dir_bytes", "driver_requests"]


# ---------------------------------------------------------------------------

class Soak:
    def __init__(self, args):
        self.args = args
        self.out = args.out
        os.makedirs(self.out, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="kvpage-soak.")
        self.data_dir = os.path.join(self.tmp, "data")
        # Others may rebuild build/ during the run: use a private copy.
        self.binary = os.path.join(self.tmp, "kvpage")
        shutil.copy2(args.bin, self.binary)
        # ...and of the libkvpage.so.0 it links, found first through LD_LIBRARY_PATH.
        shutil.copy(os.path.join(os.path.dirname(args.bin), "libkvpage.so.0"), self.tmp)
        os.environ["LD_LIBRARY_PATH"] = self.tmp + (":" + os.environ["LD_LIBRARY_PATH"]
                                                    if os.environ.get("LD_LIBRARY_PATH") else "")
        port = free_port()
        self.server = Server(self.binary, port, self.data_dir,
                             os.path.join(self.out, "server.log"), args.server_arg)
        self.stop_ev = threading.Event()
        self.workers = [Worker(i, ROLES[i % len(ROLES)], self.server.base, args.keys_per_conn,
                               args.seed, self.stop_ev) for i in range(args.conns)]
        self.windows = []        # (t_kill, t_ready)
        self.checks = []         # dicts: label, t, checked, lost, seconds
        self.lost = []           # (label, worker, rank, key, what)
        self.back = []           # the same, for deleted keys found again
        self.ctl_errors = []     # (t0, t1, op, what): the controller's own failed requests
        self.unexpected_exits = []
        self.samples = []
        self.sampler_failures = []
        self.sample_lock = threading.Lock()
        self.t0 = now()

    # ---- samples ----
    def sample(self, why):
        srv = self.server
        pid, lifetime = srv.proc.pid, srv.lifetime
        if why == "periodic" and not srv.ready:
            why = "starting"  # still recovering: not yet answering /healthz
        ps = proc_sample(pid)
        if ps is None:
            return
        t = now()
        row = {"t_s": f"{t - self.t0:.2f}", "lifetime": lifetime, "pid": pid, "why": why,
               "rss_kib": ps[0], "fds": ps[1], "threads": ps[2],
               "loadavg1": open("/proc/loadavg").read().split()[0]}
        s = session()
        try:
            st = get_json(s, srv.base + "/v1/stats")
            ranks = [r for ns in st["namespaces"] for r in ns["ranks"]]
            for f in ("held", "reserved", "keys", "evictions", "release_of_held_page"):
                row[f] = sum(r[f] for r in ranks)
            row["wal_bytes"] = st.get("wal", {}).get("bytes", "")
            row["snapshots"] = st.get("wal", {}).get("snapshots", "")
        except Failed as e:
            # The process figures still count; the failure is an error unless
            # it falls in a restart window (the sampler does not pause for them).
            self.ctl_errors.append((t, now(), "sample", str(e)))
        finally:
            s.close()
        row["data_dir_bytes"] = dir_bytes(self.data_dir)
        row["driver_requests"] = sum(sum(w.requests.values()) for w in self.workers)
        with self.sample_lock:
            self.samples.append(row)

    def sampler(self):
        while not self.stop_sampler.wait(self.args.sample_interval):
            try:
                self.sample("periodic")
            except Exception as e:  # a driver bug: say so, and go on sampling
                self.sampler_failures.append(f"{now() - self.t0:.1f} s: {e!r}")
                log(f"sampler: {e!r}")

    # ---- checks ----
    def check_all(self, label):
        t_start = now()
        c = Check(label, self.ctl_errors)
        for w in self.workers:
            with w.lock:
                check_worker(c, self.server.base, w)
        c.s.close()
        secs = now() - t_start
        self.checks.append({"label": label, "t": t_start - self.t0, "checked": c.checked,
                            "lost": len(c.lost), "unverified": len(c.unverified),
                            "deleted": c.deleted, "back": len(c.back), "seconds": secs})
        self.lost += [(label,) + key + (what,) for key, what in c.lost.items()]
        self.back += [(label,) + x for x in c.back]
        log(f"check {label}: {c.checked} acknowledged (rank, key) checked, {len(c.lost)} lost, "
            f"{len(c.unverified)} unverified; {c.deleted} deleted checked, {len(c.back)} back; "
            f"{secs:.1f} s")

    def restart(self, label):
        self.sample("pre-kill")
        t_kill = now()
        self.server.kill()
        t_ready = self.server.start()
        self.windows.append((t_kill, t_ready))
        self.sample("ready")
        log(f"{label}: killed at {t_kill - self.t0:.1f} s, answering after "
            f"{(t_ready - t_kill) * 1000:.0f} ms (lifetime {self.server.lifetime})")

    def run(self):
        a = self.args
        log(f"results in {self.out}; data dir {self.data_dir}")
        self.server.start()
        self.sample("ready")
        s = session()
        post(s, self.server.base + "/rank/0/initialize", "v/initialize",
             {"role": "scheduler"}, 200)  # a vLLM scheduler's call, no state change
        s.close()
        for w in self.workers:
            w.initialize()
        self.stop_sampler = threading.Event()
        smp = threading.Thread(target=self.sampler, daemon=True)
        smp.start()
        self.t_traffic = now()
        for w in self.workers:
            w.start()
        t_end = self.t_traffic + a.duration
        next_kill = self.t_traffic + a.kill_interval
        n = 0
        while now() < t_end:
            time.sleep(min(0.2, max(0.0, min(next_kill, t_end) - now())))
            if self.server.proc.poll() is not None:  # died without our SIGKILL
                t = now()
                self.unexpected_exits.append((t - self.t0, self.server.proc.returncode))
                log(f"server exited by itself with {self.server.proc.returncode}; restarting")
                self.server.start()
                continue
            if now() >= next_kill and next_kill < t_end:
                n += 1
                self.restart(f"restart {n}")
                self.check_all(f"after restart {n}")
                next_kill += a.kill_interval
                while next_kill <= now():
                    next_kill += a.kill_interval
        self.stop_ev.set()
        for w in self.workers:
            w.join()
        self.t_traffic_end = now()
        self.stop_sampler.set()
        smp.join()
        self.check_all("end of traffic (live server)")
        self.sample("pre-stop")
        self.stop_rc = self.server.stop()
        log(f"SIGTERM: exit status {self.stop_rc}")
        self.server.start()
        self.quiet_lifetime = self.server.lifetime
        self.sample("ready")
        self.check_all("after a clean stop and restart")
        self.sample("pre-stop")
        self.stop_rc2 = self.server.stop()
        log(f"SIGTERM: exit status {self.stop_rc2}")
        fsck = subprocess.run([self.binary, "fsck", self.data_dir], capture_output=True, text=True)
        self.fsck_rc, self.fsck_out = fsck.returncode, (fsck.stdout + fsck.stderr).strip()
        self.data_bytes_end = dir_bytes(self.data_dir)
        log(f"fsck: exit {self.fsck_rc}: {self.fsck_out[:200]}")
        self.write_results()
        if a.keep:
            log(f"kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp)

    # ---- results ----
    def window_of(self, t0, t1):
        """The restart (1, 2, ...) whose window the span [t0, t1] overlaps, or 0."""
        for i, (k, r) in enumerate(self.windows, 1):
            if t0 <= r and t1 >= k:
                return i
        return 0

    def write_results(self):
        rel = lambda t: f"{t - self.t0:.3f}"
        with open(os.path.join(self.out, "samples.csv"), "w", newline="") as f:
            wr = csv.DictWriter(f, SAMPLE_FIELDS)
            wr.writeheader()
            wr.writerows(self.samples)
        errors = []
        for w in self.workers:
            for t0, t1, op, route, what, conn in w.errors:
                errors.append((t0, t1, f"w{w.idx}", op, route, what, conn, self.window_of(t0, t1)))
        for t0, t1, op, what in self.ctl_errors:
            errors.append((t0, t1, "controller", op, "", what, True, self.window_of(t0, t1)))
        errors.sort()
        with open(os.path.join(self.out, "windows.csv"), "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["restart", "t_kill_s", "t_ready_s", "window_ms", "errors_in_window",
                         "failed_starts", "recovery_logged"])
            rec = recovery_lines(self.server.log_path)  # lifetime -> its recovery line
            for i, (k, r) in enumerate(self.windows, 1):
                wr.writerow([i, rel(k), rel(r), f"{(r - k) * 1000:.1f}",
                             sum(1 for e in errors if e[7] == i),
                             sum(1 for f in self.server.failed_starts if f[1] == i),
                             rec.get(i, "")])
        with gzip.open(os.path.join(self.out, "errors.csv.gz"), "wt", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["t_start_s", "t_end_s", "who", "op", "route", "what", "kind",
                         "window"])  # window: the restart it overlaps, 0 = outside every window
            for t0, t1, who, op, route, what, conn, inw in errors:
                wr.writerow([rel(t0), rel(t1), who, op, route, what,
                             "connection" if conn else "status", inw])
        try:
            text = self.summary(errors)
        except Exception:  # keep the raw files of a long run even if the summary has a bug
            import traceback
            text = "summary failed:\n" + traceback.format_exc()
        with open(os.path.join(self.out, "summary.txt"), "w") as f:
            f.write(text)
        log(f"wrote {self.out}/summary.txt")

    def summary(self, errors):
        a = self.args
        L = []
        p = L.append
        secs = self.t_traffic_end - self.t_traffic
        reqs = {}
        for w in self.workers:
            for k, v in w.requests.items():
                reqs[k] = reqs.get(k, 0) + v
        total = sum(reqs.values())
        outside = [e for e in errors if not e[7]]
        inside = [e for e in errors if e[7]]
        anomalies = sorted(x for w in self.workers for x in w.anomalies)
        lost_total = sum(c["lost"] for c in self.checks)
        back_total = sum(c["back"] for c in self.checks)
        max_evict = max((int(r["evictions"]) for r in self.samples if r.get("evictions", "") != ""),
                        default=0)
        p(f"kvpage soak — {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
        p(f"command: {' '.join(sys.argv)}")
        p(f"binary: {a.bin} (sha256 {sha256(a.bin)[:16]}), git {git_rev()}")
        p(f"nproc {os.cpu_count()}, kernel {os.uname().release}, loadavg at end "
          f"{open('/proc/loadavg').read().split()[:3]}")
        p(f"server: {' '.join(self.server.cmd[1:])}")
        p(f"traffic: {a.conns} connections for {secs:.0f} s, SIGKILL every {a.kill_interval:g} s, "
          f"{a.keys_per_conn} keys per connection, {BATCH}-key batches, seed {a.seed}")
        p("")
        p("RESULT")
        p(f"  errors outside restart windows:      {len(outside)}   (goal 0)")
        p(f"  acknowledged confirmations lost:     {lost_total}   (goal 0, over {len(self.checks)} checks)")
        p(f"  acknowledged (rank, key) left unverified (a check's request got no reply): "
          f"{sum(c['unverified'] for c in self.checks)}")
        p(f"  acknowledged keys reported missing during traffic: {len(anomalies)}   (goal 0)")
        p(f"  deleted keys (delete got 204) found again by a check: {back_total}   (goal 0)")
        p(f"  server exits not caused by the driver: {len(self.unexpected_exits)}")
        fs = self.server.failed_starts
        p(f"  restarts where the new process exited before answering /healthz: "
          f"{len({f[1] for f in fs})} ({len(fs)} failed starts)")
        for t, lt, rc, line in fs[:10]:
            p(f"    t={t - self.t0:.3f} lifetime {lt}: exit {rc}: {line}")
        p(f"  sampler failures (a driver bug if not 0): {len(self.sampler_failures)}"
          + (f", first: {self.sampler_failures[0]}" if self.sampler_failures else ""))
        p(f"  evictions (must be 0 for 'lost' to be unambiguous): max {max_evict} in any sample")
        p(f"  clean stops (SIGTERM): exit status {self.stop_rc}, {self.stop_rc2}")
        p(f"  kvpage fsck at the end: exit {self.fsck_rc}: {self.fsck_out.splitlines()[0] if self.fsck_out else ''}")
        p("")
        p("DEFINITIONS")
        p("  restart window: from the driver's SIGKILL until the restarted server answers")
        p("    GET /healthz with 200. An operation (a request; for a write, the allocate and")
        p("    confirm of the batch on every rank) is in a window if its span, from sending")
        p("    its first request to its end, overlaps one. Error: a reply other than the")
        p("    route's documented 2xx status, or a connection error or timeout.")
        p("  acknowledged: a (rank, key) whose confirm_write got 204, with its page; the")
        p("    driver forgets it before it sends a delete of that key. Lost: an acknowledged")
        p("    (rank, key) that a check does not find, or finds at another page. Checks:")
        p("    vLLM keys confirmed on every rank: batch_exists + get_locations on each rank;")
        p("    vLLM keys confirmed on some ranks only (write cut by a kill): get_page_indices")
        p("    on the rank, pool kv; SGLang keys: /{rank}/exists + get_page_indices.")
        p(f"    Each rank has {NUM_PAGES} pages, more than it can ever hold here: no eviction.")
        p("")
        p(f"TRAFFIC: {total} requests answered as expected, {total / secs:.0f}/s")
        for k in sorted(reqs):
            p(f"  {k:28s} {reqs[k]:9d}")
        ops = {op: sum(w.ops[op] for w in self.workers) for op in WEIGHTS}
        p("  operations done: " + ", ".join(f"{k} {v}" for k, v in ops.items()))
        p(f"  (rank, key) confirmations acknowledged with 204: {sum(w.acks for w in self.workers)}")
        p("  connections: " + "; ".join(
            f"w{w.idx} {w.desc()}" for w in self.workers[:len(ROLES)]))
        p("")
        wins = [(r - k) * 1000 for k, r in self.windows]
        p(f"RESTARTS: {len(self.windows)}")
        if wins:
            p(f"  window (SIGKILL to /healthz 200): min {min(wins):.0f} ms, median "
              f"{statistics.median(wins):.0f} ms, max {max(wins):.0f} ms (windows.csv)")
        rec = [x for lt, x in sorted(recovery_lines(self.server.log_path).items())
               if 1 <= lt <= len(self.windows)]
        ms = [int(m.group(1)) for m in (re.search(r"in (\d+) ms", x) for x in rec) if m]
        if ms:
            p(f"  recovery as the server logged it: max {max(ms)} ms; first restart: {rec[0]};"
              f" last: {rec[-1]}")
        snaps = {}
        for r in self.samples:
            if r.get("snapshots", "") != "":
                snaps[r["lifetime"]] = max(snaps.get(r["lifetime"], 0), int(r["snapshots"]))
        p(f"  snapshots written by the servers during the run (their /v1/stats): {sum(snaps.values())}")
        p(f"  errors in restart windows (expected, not counted): {len(inside)} "
          f"({sum(1 for e in inside if e[6])} connection, {sum(1 for e in inside if not e[6])} status)")
        statuses = sorted({e[5][:60] for e in inside if not e[6]})
        for st in statuses[:10]:
            p(f"    status reply in a window: {st}")
        p("")
        p(f"ERRORS OUTSIDE RESTART WINDOWS: {len(outside)} (every error is in errors.csv.gz)")
        for e in outside[:30]:
            p(f"  t={e[0] - self.t0:.3f}..{e[1] - self.t0:.3f} {e[2]} {e[3]} {e[4]}: {e[5]}")
        p("")
        p("CHECKS OF ACKNOWLEDGED KEYS")
        for c in self.checks:
            p(f"  t={c['t']:7.1f} s  {c['label']:34s} acknowledged {c['checked']:7d} lost {c['lost']}"
              f" unverified {c['unverified']};"
              f"  deleted {c['deleted']:6d} back {c['back']}  ({c['seconds']:.1f} s)")
        for x in self.lost[:30]:
            p(f"  LOST ({x[0]}): w{x[1]} rank {x[2]} key {x[3]}: {x[4]}")
        for x in self.back[:30]:
            p(f"  BACK ({x[0]}): w{x[1]} rank {x[2]} key {x[3]}: {x[4]}")
        for t, text in anomalies[:30]:
            p(f"  MISSING DURING TRAFFIC t={t - self.t0:.3f}: {text}")
        p("")
        p("SERVER PROCESS PER LIFETIME (VmRSS KiB, open fds; samples.csv, every "
          f"{self.args.sample_interval:g} s plus one after /healthz and one before the kill)")
        p("  life  samples  rss start    end    max   fds start  end  max  seconds")
        lifes = {}
        for r in self.samples:
            lifes.setdefault(int(r["lifetime"]), []).append(r)
        ends = []   # (t, rss, fds) at the end of each lifetime that had traffic
        for lt, rows in sorted(lifes.items()):
            rss_all = [int(r["rss_kib"]) for r in rows]
            fds_all = [int(r["fds"]) for r in rows]
            rows = [r for r in rows if r["why"] != "starting"]  # from the 'ready' sample on
            rss = [int(r["rss_kib"]) for r in rows]
            fds = [int(r["fds"]) for r in rows]
            dur = float(rows[-1]["t_s"]) - float(rows[0]["t_s"])
            quiet = lt == self.quiet_lifetime
            p(f"  {lt:4d}  {len(rows):7d}  {rss[0]:9d} {rss[-1]:6d} {max(rss_all):6d}"
              f"   {fds[0]:9d} {fds[-1]:4d} {max(fds_all):4d}  {dur:7.1f}"
              + ("  (after the clean stop, no traffic)" if quiet else ""))
            if not quiet:
                ends.append((float(rows[-1]["t_s"]), rss[-1], fds[-1]))
        p("  (start: just after /healthz answered, while the clients reconnect; end: just")
        p("  before the SIGKILL or SIGTERM; max: also over samples taken during recovery;")
        p("  samples: from /healthz on)")
        if len(ends) >= 3:
            p(f"  trend of the RSS at the end of each lifetime: {slope(ends, 1) * 60:+.0f} KiB/min"
              f" (first {ends[0][1]}, last {ends[-1][1]} KiB)")
            half = [e for e in ends if e[0] >= ends[-1][0] / 2]
            if len(half) >= 3:
                p(f"  the same over the second half of the run: {slope(half, 1) * 60:+.0f} KiB/min"
                  f" ({half[0][1]} .. {half[-1][1]} KiB)")
            p(f"  trend of the open fds at the end of each lifetime: {slope(ends, 2) * 60:+.2f} fds/min"
              f" (first {ends[0][2]}, last {ends[-1][2]})")
        allrss = [int(r["rss_kib"]) for r in self.samples]
        p(f"  RSS over all samples: min {min(allrss)}, max {max(allrss)} KiB")
        held = [int(r["held"]) for r in self.samples if r.get("held") not in (None, "")]
        resv = [int(r["reserved"]) for r in self.samples if r.get("reserved") not in (None, "")]
        if held:
            p(f"  held pages (all ranks): first sample {held[0]}, last {held[-1]}, max {max(held)};"
              f" reserved max {max(resv)}")
        dd = [int(r["data_dir_bytes"]) for r in self.samples]
        p(f"  data dir bytes: max {max(dd)}, at the end {self.data_bytes_end}")
        p("")
        p(f"FSCK ({self.fsck_rc}):")
        for line in self.fsck_out.splitlines()[:40]:
            p("  " + line)
        return "\n".join(L) + "\n"


def slope(points, col):
    xs = [pt[0] for pt in points]
    ys = [pt[col] for pt in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def recovery_lines(path):
    """lifetime -> the last 'recovered ...' line the server logged in it."""
    out, lifetime = {}, None
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"=== lifetime (\d+)", line)
            if m:
                lifetime = int(m.group(1))
            m = re.search(r"recovered \S+ (.*)", line)
            if m and lifetime is not None:
                out[lifetime] = m.group(1).strip()
    return out


def last_line(path):
    with open(path, errors="replace") as f:
        lines = [x.strip() for x in f if x.strip()]
    return lines[-1] if lines else ""


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def git_rev():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600, help="seconds of traffic (600)")
    ap.add_argument("--kill-interval", type=float, default=30, help="seconds between SIGKILLs (30)")
    ap.add_argument("--conns", type=int, default=16, help="connections, one thread each (16)")
    ap.add_argument("--bin", default=os.path.join(repo, "build", "kvpage"),
                    help="kvpage binary (build/kvpage of this repo)")
    ap.add_argument("--out", help="results directory (bench/soak/results/<UTC date-time>)")
    ap.add_argument("--keys-per-conn", type=int, default=8192,
                    help="distinct keys each connection writes, deletes and rewrites (8192)")
    ap.add_argument("--sample-interval", type=float, default=2, help="seconds between samples (2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra flag for kvpage serve (repeatable)")
    a = ap.parse_args()
    if not a.out:
        a.out = os.path.join(here, "results", time.strftime("%Y-%m-%d-%H%M", time.gmtime()))
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"soak: {a.bin} is not an executable (make build)")
    soak = Soak(a)
    try:
        soak.run()
    finally:  # never leave a server behind
        p = soak.server.proc
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
