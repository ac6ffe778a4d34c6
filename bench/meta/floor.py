#!/usr/bin/python3
"""bench/meta/floor.py — what Redis itself spends on the structure operations
an allocate + confirm pair of 64 keys needs (issue 27, deliverable 1).

The redis:// backend's scripts (src/meta/redis/redis_lua.h) do, per pair of 64
fresh keys on a rank with room (no eviction, no expiry): allocate HMGET k2p,
HSET p2k (the reservation marks); confirm HMGET p2k, HMGET k2p, HSET p2k,
HSET k2p, ZADD lru; and a few one-element commands (GET and SET of the
rank's fields, TIME, ZADD res, HSET rb, HINCRBY rb, ZREM res, HDEL rb).

This runs those same commands on a redis-server it starts (state: HELD keys
already in the three structures, the keys 64 hex digits as the engines'
hashes are), three ways, and reports the Redis time per pair from INFO
commandstats (reset before each way):

  native   the commands sent by the client, pipelined (no script)
  floor    two scripts (allocate, confirm) that only issue the commands, with
           every argument list built by the client (no Lua logic at all)
  kvpage   the real scripts are not run here: bench/meta/redis.sh measures them

Usage: floor.py [PAIRS (3000)] [HELD (200000)] [REDIS_ARGS...]
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

PAIRS = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
HELD = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
REDIS_ARGS = sys.argv[3:] or ["--appendonly", "yes", "--appendfsync", "everysec"]
N = 64
TAG = "{kvb:r0}"
M, FREE, RES, LRU, GRACE, K2P, P2K, RB = (f"kvb:{TAG}:{x}" for x in
                                          ("m", "free", "res", "lru", "grace", "k2p", "p2k", "rb"))


def enc(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if not isinstance(a, bytes):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")

    def send(self, cmds):
        self.s.sendall(b"".join(enc(*c) for c in cmds))

    def reply(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t in (b"+", b":"):
            return rest
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            v = self.f.read(n + 2)[:-2]
            return v
        if t == b"*":
            n = int(rest)
            return [self.reply() for _ in range(max(n, 0))]
        raise RuntimeError(f"bad reply {line!r}")

    def run(self, cmds):
        self.send(cmds)
        return [self.reply() for _ in cmds]


def key(i):
    return ("%064x" % (i * 0x9E3779B97F4A7C15 % (1 << 256)))


ALLOC_FLOOR = """
local n = tonumber(ARGV[1])
redis.call('GET', KEYS[1]); redis.call('TIME')
redis.call('HMGET', KEYS[6], unpack(ARGV, 2, 1 + n))
redis.call('ZADD', KEYS[3], ARGV[2 + 3 * n], ARGV[3 + 3 * n])
redis.call('HSET', KEYS[8], ARGV[3 + 3 * n], 'pages', '#' .. ARGV[3 + 3 * n], '64')
redis.call('HSET', KEYS[7], unpack(ARGV, 2 + n, 1 + 3 * n))
redis.call('SET', KEYS[1], ARGV[4 + 3 * n])
return 0
"""
# ARGV: n, pages (n), keys (n), p2k pairs (2n), lru pairs (2n), reservation, fields
CONFIRM_FLOOR = """
local n = tonumber(ARGV[1])
local a = 2
redis.call('GET', KEYS[1])
redis.call('HMGET', KEYS[7], unpack(ARGV, a, a + n - 1))
redis.call('HMGET', KEYS[6], unpack(ARGV, a + n, a + 2 * n - 1))
redis.call('HINCRBY', KEYS[8], '#' .. ARGV[a + 6 * n], -64)
redis.call('ZREM', KEYS[3], ARGV[a + 6 * n])
redis.call('HDEL', KEYS[8], ARGV[a + 6 * n], '#' .. ARGV[a + 6 * n])
redis.call('HSET', KEYS[7], unpack(ARGV, a + 2 * n, a + 4 * n - 1))
redis.call('HSET', KEYS[6], unpack(ARGV, a + 6 * n + 2, a + 8 * n + 1))
redis.call('ZADD', KEYS[4], unpack(ARGV, a + 4 * n, a + 6 * n - 1))
redis.call('SET', KEYS[1], ARGV[a + 6 * n + 1])
return 0
"""


def stats(c):
    info = c.run([["INFO", "commandstats"]])[0].decode()
    out = {}
    for line in info.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line.split(":", 1)
            f = dict(kv.split("=") for kv in rest.split(","))
            out[name[8:]] = (int(f["calls"]), int(f["usec"]))
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="kvpage-floor.")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rs = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                           "--dir", tmp, "--save", ""] + REDIS_ARGS,
                          stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                c = Conn(port)
                c.run([["PING"]])
                break
            except OSError:
                time.sleep(0.05)
        # HELD keys on pages 0..HELD-1
        for b in range(0, HELD, 1000):
            cmds = []
            for i in range(b, min(b + 1000, HELD)):
                cmds.append(["HSET", K2P, key(i), i])
                cmds.append(["HSET", P2K, i, key(i)])
                cmds.append(["ZADD", LRU, i, i])
            c.run(cmds)
        fields = "%d %d %d 0 0 0 0 0 0 0 0 0 0" % (1 << 30, HELD, HELD)
        c.run([["SET", M, fields]])
        sha_a = c.run([["SCRIPT", "LOAD", ALLOC_FLOOR]])[0].decode()
        sha_c = c.run([["SCRIPT", "LOAD", CONFIRM_FLOOR]])[0].decode()
        keys8 = [M, FREE, RES, LRU, GRACE, K2P, P2K, RB]
        nxt = [HELD]

        def pair_args():
            p0 = nxt[0]
            nxt[0] += N
            pages = [str(p0 + j) for j in range(N)]
            keys = [key(p0 + j) for j in range(N)]
            res = str(p0)
            mark = "\0" + res
            p2k_res = [x for p in pages for x in (p, mark)]
            p2k_held = [x for j in range(N) for x in (pages[j], keys[j])]
            k2p = [x for j in range(N) for x in (keys[j], pages[j])]
            lru = [x for j in range(N) for x in (str(p0 + j), pages[j])]
            return pages, keys, res, p2k_res, p2k_held, k2p, lru

        def native(k):
            pages, keys, res, p2k_res, p2k_held, k2p, lru = pair_args()
            return [["GET", M], ["TIME"], ["HMGET", K2P] + keys,
                    ["ZADD", RES, 1000 + k, res], ["HSET", RB, res, " ".join(pages), "#" + res, 64],
                    ["HSET", P2K] + p2k_res, ["SET", M, fields],
                    ["GET", M], ["HMGET", P2K] + pages, ["HMGET", K2P] + keys,
                    ["HINCRBY", RB, "#" + res, -64], ["ZREM", RES, res],
                    ["HDEL", RB, res, "#" + res], ["HSET", P2K] + p2k_held,
                    ["HSET", K2P] + k2p, ["ZADD", LRU] + lru, ["SET", M, fields]]

        def scripted(k):
            pages, keys, res, p2k_res, p2k_held, k2p, lru = pair_args()
            a = ["EVALSHA", sha_a, 8] + keys8 + [N] + keys + p2k_res + [1000 + k, res, fields]
            cf = (["EVALSHA", sha_c, 8] + keys8 + [N] + pages + keys + p2k_held + lru +
                  [res, fields] + k2p)
            return [a, cf]

        results = {}
        for way, build in (("native", native), ("floor", scripted)) * 2:
            c.run([["CONFIG", "RESETSTAT"]])
            for k in range(0, PAIRS, 50):
                cmds = []
                for j in range(k, min(k + 50, PAIRS)):
                    cmds += build(j)
                c.run(cmds)
            st = stats(c)
            own = {n: v for n, v in st.items() if n not in ("config", "info")}
            if way == "floor":
                usec = sum(v[1] for n, v in own.items() if n == "evalsha")
            else:
                usec = sum(v[1] for v in own.values())
            results.setdefault(way, []).append(usec / PAIRS)
            per = ", ".join(f"{n} {v[1] / v[0]:.1f}" for n, v in sorted(own.items())
                            if n in ("hmget", "hset", "zadd", "evalsha"))
            print(f"{way:7s} {usec / PAIRS:7.1f} us per pair  (us per call: {per})", flush=True)
        for way, v in results.items():
            print(f"{way}: best {min(v):.1f} us per pair of {N} keys "
                  f"({PAIRS} pairs, {HELD} held keys, redis {' '.join(REDIS_ARGS)})")
    finally:
        rs.terminate()
        rs.wait()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
