#!/usr/bin/python3
"""Reproducer: after a SIGKILL of `kvpage serve` during a snapshot, the
snapshot child lives on and keeps the data directory's LOCK, so the restarted
server exits 1 ("data directory ... is in use by another kvpage process")
until the child has finished.

    bench/soak/repro_snapshot_lock.py [path/to/kvpage]

Starts a server with --snapshot-bytes 1M, fills 300,000 keys (so a snapshot
takes a while), keeps writing until a snapshot child exists, SIGKILLs the
server, starts a new one at once on the same directory, and then every 0.1 s
until one answers /healthz. Prints what happened; exit status 1 if the bug
shows (the first restart failed), 0 if not.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "build", "kvpage")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """Child processes of any thread of pid (the snapshot thread forks)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except FileNotFoundError:
        pass
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="kvpage-repro.")
    data, port = os.path.join(tmp, "data"), free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [BIN, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data,
           "--fsync", "batch", "--snapshot-bytes", "1M"]
    logf = open(os.path.join(tmp, "server.log"), "ab")

    def start():
        p = subprocess.Popen(cmd, stdout=logf, stderr=logf)
        while True:
            if p.poll() is not None:
                return p, None
            try:
                if requests.get(base + "/healthz", timeout=1).status_code == 200:
                    return p, time.monotonic()
            except requests.RequestException:
                time.sleep(0.01)

    s = requests.Session()
    s.trust_env = False
    n = 0

    def write(count):
        nonlocal n
        for _ in range(count // 1024):
            keys = [f"{i:064x}" for i in range(n, n + 1024)]
            n += 1024
            r = s.post(base + "/keys/batch_allocate",
                       data=json.dumps({"rank": 0, "keys": keys}), timeout=30).json()
            s.post(base + "/keys/confirm_write",
                   data=json.dumps({"rank": 0, "confirmations": r["results"]}), timeout=30)

    proc, _ = start()
    s.post(base + "/rank/0/initialize", data=json.dumps({"num_pages": 1 << 22}))
    write(300_000)
    child = []
    deadline = time.monotonic() + 120
    while not child and time.monotonic() < deadline:
        write(1024)
        child = children(proc.pid)
    if not child:
        print("no snapshot child seen in 120 s; try again")
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp)
        return 2
    proc.send_signal(signal.SIGKILL)
    t_kill = time.monotonic()
    proc.wait()
    s.close()
    alive = [c for c in child if os.path.exists(f"/proc/{c}")]
    print(f"SIGKILL of server {proc.pid} during snapshot child {child}; "
          f"child alive after the server was reaped: {bool(alive)}")
    failed = 0
    while True:
        p, t_ready = start()
        if t_ready is not None:
            break
        failed += 1
        if failed == 1:
            with open(os.path.join(tmp, "server.log"), errors="replace") as f:
                last = [x.strip() for x in f if x.strip()][-1]
            print(f"first restart: exit {p.returncode}: {last}")
        time.sleep(0.1)
    print(f"restarted server answered /healthz {t_ready - t_kill:.2f} s after the SIGKILL, "
          f"after {failed} failed start(s); the child {'was' if alive else 'was not'} alive")
    p.send_signal(signal.SIGTERM)
    p.wait()
    print("data dir:", sorted(os.listdir(data)))
    shutil.rmtree(tmp)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
