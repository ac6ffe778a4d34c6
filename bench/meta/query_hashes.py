#!/usr/bin/python3
"""bench/meta/query_hashes.py — the query by block hashes on a big rank.

    /usr/bin/python3 bench/meta/query_hashes.py BUILD/kvpage [PAGES]

Starts `kvpage serve --data-dir none` on a free loopback port, fills rank 0
with PAGES (1048576) random 64-hex-digit keys (batch_allocate +
confirm_write, 4096 a request), then:

- times the first POST /v1/query of one SGLang block hash (in the
  in-process engine it builds the index of block hashes: one pass over the
  keys, once) and 10 more, reporting the first and their median;
- while another thread sends that query back to back, times 50
  /keys/batch_exists of 4 keys on the same namespace, reporting their median
  and maximum: how long the query holds up the namespace's other requests.

Prints one line. Python's client costs about 0.3 ms a request here, so the
figures have that floor.
"""
import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def main():
    binary = sys.argv[1]
    pages = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", "none",
         "--log-level", "warn"], stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def post(path, obj):
        r = urllib.request.Request(base + path, data=json.dumps(obj).encode(),
                                   headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(r) as f:
            b = f.read()
            return json.loads(b) if b else None

    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(base + "/healthz")
                break
            except OSError:
                time.sleep(0.05)
        post("/rank/0/initialize", {"num_pages": pages, "role": "worker"})
        rnd = random.Random(38)
        keys = ["%064x" % rnd.getrandbits(256) for _ in range(pages)]
        for i in range(0, pages, 4096):
            res = post("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in keys[i:i + 4096]]})
            post("/keys/confirm_write", {"rank": 0, "confirmations": res["results"],
                                         "pages_to_release": []})
        h = int(keys[5][:16], 16)
        q = {"block_hashes": [h - (1 << 64) if h >= 1 << 63 else h], "hash_format": "sglang"}
        ts = []
        for _ in range(11):
            t = time.monotonic()
            answer = post("/v1/query", q)
            ts.append(time.monotonic() - t)
        first, rest = ts[0], sorted(ts[1:])
        stop = threading.Event()

        def hammer():
            while not stop.is_set():
                post("/v1/query", q)

        th = threading.Thread(target=hammer)
        th.start()
        lat = []
        for _ in range(50):
            t = time.monotonic()
            post("/keys/batch_exists", {"keys": keys[:4]})
            lat.append(time.monotonic() - t)
        stop.set()
        th.join()
    finally:
        server.terminate()
        server.wait()
    lat.sort()
    print(f"pages={pages} first query {first * 1e3:.1f} ms, then median {rest[5] * 1e3:.1f} ms; "
          f"batch_exists during queries: median {lat[25] * 1e3:.2f} ms, max {lat[-1] * 1e3:.1f} ms; "
          f"answer {json.dumps(answer)[:120]}")


if __name__ == "__main__":
    main()
