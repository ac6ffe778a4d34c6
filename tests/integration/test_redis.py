"""kvpage serve --meta redis://: many servers over one Redis (issue 15).

Each test starts its own redis-server (or a Redis Cluster of three masters,
with or without a replica each) on free loopback ports
(tests/integration/redisfix.py) and real `kvpage serve` processes on it.
The suite as a whole also runs against Redis with KVPAGE_TEST_BACKEND=redis
(make integration-redis); these are the cases that need several servers, a
Redis that dies, or a cluster.
"""
import json
import os
import re
import signal
import socket
import threading
import time

import pytest
import requests

from kvpserver import launch, require_bin
from kvptest import counts, every_route_unavailable, expect, invariants, session
import redisfix


@pytest.fixture
def redis():
    r = redisfix.Redis().start()
    yield r
    r.close()


def _keys(tag, n):
    return [f"{tag}-{i:05d}" for i in range(n)]


def test_two_servers_answer_as_one(redis, start_server):
    loc = redis.url(prefix="two")
    a, b = start_server("--meta", loc).client(), start_server("--meta", loc).client()
    a.v_init(0, 64)
    a.v_init(1, 64)
    b.v_init(0, 64)  # the same again through the other: no change
    keys = _keys("k", 10)
    pages0 = a.v_write(0, keys)
    assert b.v_exists(keys) == [False] * 10  # rank 1 holds none yet: not complete
    b.v_write(1, keys)
    assert a.v_exists(keys) == [True] * 10
    assert b.v_loc(0, keys) == pages0
    # The SGLang dialect, another pool, through both.
    a.s_init(0, 32, ns="extra")
    sp = a.s_write(0, keys[:4], ns="extra")
    assert b.s_get(0, keys[:4] + ["nope"], ns="extra") == sp + [None]
    b.s_delete(0, keys[:2], ns="extra")
    assert a.s_get(0, keys[:4], ns="extra") == [None, None] + sp[2:]
    for c in (a, b):
        st = invariants(c.get("/v1/stats").json())
        assert counts(st, 0) == (64, 54, 0, 10)
        assert counts(st, 0, pool="extra") == (32, 30, 0, 2)


def test_a_rank_added_through_another_server_counts_at_once(redis, start_server):
    # batch_exists asks every rank with the list of ranks it last saw, in one
    # round trip, and again when the list has changed: a rank initialized
    # through another server must count in the very next answer.
    loc = redis.url(prefix="newrank")
    a, b = start_server("--meta", loc).client(), start_server("--meta", loc).client()
    a.v_init(0, 64)
    keys = _keys("n", 6)
    a.v_write(0, keys)
    assert a.v_exists(keys) == [True] * 6
    b.v_init(1, 64)
    assert a.v_exists(keys) == [False] * 6  # rank 1 holds none of them
    b.v_write(1, keys[:3])
    assert a.v_exists(keys) == [True] * 3 + [False] * 3
    b.post("/clear")
    assert a.v_exists(keys) == [False] * 6


def _thread_reads(pid):
    """{tid: (name, read(2) calls so far)} of every thread of process pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/io") as f:
                out[tid] = (name, int(re.search(r"syscr: (\d+)", f.read()).group(1)))
        except (OSError, AttributeError):
            pass  # a thread that ended
    return out


def test_connections_opened_at_once_go_round_the_workers(redis, start_server):
    # Each of MHD's workers accepts up to eleven waiting connections in a row,
    # and with a backend whose calls wait for Redis a worker serves its
    # connections one round trip at a time: the connections an engine's pool
    # opens at once must not pile up on one worker. kvpage serve accepts them
    # itself and deals them out; here eight, opened at once, are all served,
    # by (nearly) eight different workers.
    srv = start_server("--meta", redis.url(prefix="deal"), "--threads", "8")
    c = srv.client()
    c.v_init(0, 64)
    c.v_write(0, ["held"])
    socks = [socket.socket() for _ in range(8)]
    for s in socks:
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", srv.port))
    for s in socks:
        s.setblocking(True)
        s.settimeout(30)
    body = json.dumps({"keys": ["held", "other"]}).encode()
    req = (b"POST /keys/batch_exists HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    # every thread: a worker that has not run yet does not carry its name
    before = _thread_reads(srv.proc.pid)
    for _ in range(60):
        for s in socks:
            s.sendall(req)
        for s in socks:
            got = b""
            while b"]}" not in got:
                chunk = s.recv(4096)
                assert chunk, "the server closed a connection"
                got += chunk
            assert b" 200 " in got.split(b"\r\n", 1)[0] and b"[true, false]" in got, got
    after = {t: n for t, (name, n) in _thread_reads(srv.proc.pid).items()
             if name.startswith("MHD-worker")}
    assert len(after) == 8, after
    busy = [t for t in after if after[t] - before.get(t, ("", 0))[1] >= 50]
    for s in socks:
        s.close()
    # 60 requests on each connection: a worker serving one read at least 60
    # times. Dealt out by descriptor, eight connections opened together go
    # to eight workers; allow two to share (another descriptor in between).
    assert len(busy) >= 6, {t: after[t] - before.get(t, ("", 0))[1] for t in after}


def test_concurrent_allocations_through_two_servers_never_share_a_page(redis, start_server):
    loc = redis.url(prefix="conc")
    servers = [start_server("--meta", loc), start_server("--meta", loc)]
    servers[0].client().v_init(0, 1000)
    got, errors = {}, []
    lock = threading.Lock()

    def worker(t):
        try:
            c = servers[t % 2].client()
            for j in range(10):
                ks = _keys(f"t{t}-b{j}", 10)
                pages = c.v_alloc(0, ks)
                with lock:
                    got.update(zip(ks, pages))
                c.v_confirm(0, list(zip(ks, pages)))
        except Exception as e:  # reported below
            errors.append(repr(e))

    th = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    [t.start() for t in th]
    [t.join() for t in th]
    assert not errors, errors
    assert len(got) == 800 and min(got.values()) >= 0
    assert len(set(got.values())) == 800, "one page handed to two keys"
    for s in servers:
        st = invariants(s.stats())
        assert counts(st, 0) == (1000, 200, 0, 800)
    assert servers[1].client().v_loc(0, list(got)) == list(got.values())


def test_sigkill_of_one_server_loses_nothing_acknowledged(tmp_path, redis, start_server):
    loc = redis.url(prefix="kill")
    a, b = launch(tmp_path, ["--meta", loc]), start_server("--meta", loc)  # a is killed
    b.client().v_init(0, 100000)
    acked, stop = [], threading.Event()

    def writer():
        c = a.client()
        i = 0
        while not stop.is_set():
            ks = _keys(f"w{i}", 8)
            i += 1
            try:
                c.v_write(0, ks)
            except (requests.RequestException, AssertionError):
                return  # the server is gone
            acked.extend(ks)

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(0.7)
    a.stop(signal.SIGKILL)
    a.assert_no_sanitizer_report()
    stop.set()
    t.join()
    assert len(acked) > 8
    cb = b.client()
    assert all(cb.v_exists(acked)), "an acknowledged key is gone"
    more = _keys("after", 8)
    cb.v_write(0, more)
    assert cb.v_exists(acked + more) == [True] * (len(acked) + len(more))
    invariants(b.stats())


def test_redis_restart_with_aof_always_loses_nothing_acknowledged(start_server):
    r = redisfix.Redis(["--appendonly", "yes", "--appendfsync", "always"]).start()
    try:
        srv = start_server("--meta", r.url(prefix="aof"))
        c = srv.client()
        c.v_init(0, 256)
        keys = _keys("a", 100)
        pages = c.v_write(0, keys)
        r.kill()  # SIGKILL: only what appendfsync always wrote survives
        r.start(r.port)
        deadline = time.monotonic() + 20
        while True:  # the server reconnects by itself
            resp = c.post("/keys/get_locations", {"rank": 0, "keys": keys})
            if resp.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        expect(resp, 200)
        assert resp.json()["locations"] == pages
        assert "can be lost" not in srv.stderr()
        invariants(srv.stats())
    finally:
        r.close()


def test_redis_stopped_gives_503_with_the_cause_then_recovers(redis, start_server):
    srv = start_server("--meta", redis.url(prefix="down"))
    c = srv.client()
    c.v_init(0, 16)
    c.v_write(0, ["x"])
    redis.kill()
    every_route_unavailable(c, str(redis.port))  # names the node
    assert c.get("/healthz").status_code == 200  # liveness: no restart loop
    redis.start(redis.port)  # empty again: it had no persistence
    deadline = time.monotonic() + 20
    while c.post("/rank/0/initialize", {"num_pages": 16}).status_code != 200:
        assert time.monotonic() < deadline, "no recovery after Redis came back"
        time.sleep(0.1)
    c.v_write(0, ["z"])
    assert c.v_exists(["z"]) == [True]
    invariants(srv.stats())


OUTAGE = "every call that needs it fails until it answers again"
RECOVERY = "answers again, after"


def test_redis_outage_and_recovery_are_logged_once_each_and_healthz_says_the_truth(
        redis, start_server):
    """While Redis is down every request fails with 503, and the log says so
    once (naming the node and the cause), not once per request; /healthz
    (still 200: a liveness probe) says that reads fail as well as writes;
    when Redis answers again the log says so once."""
    srv = start_server("--meta", redis.url(prefix="outage"))
    c = srv.client()
    c.v_init(0, 16)
    c.v_write(0, ["x"])
    assert c.get("/healthz").text == "ok"
    redis.kill()
    node = f"redis 127.0.0.1:{redis.port}"
    for _ in range(3):
        for path, body in (("/keys/batch_exists", {"keys": ["x"]}),
                           ("/keys/get_locations", {"rank": 0, "keys": ["x"]}),
                           ("/keys/batch_allocate", {"rank": 0, "keys": [["y", ""]]}),
                           ("/0/exists", {"keys": ["x"]}),
                           ("/0/get_page_indices", {"keys": ["x"]})):
            expect(c.post(path, body), 503)
    h = c.get("/healthz")
    assert h.status_code == 200, h.text
    assert h.text.startswith(f"unavailable: {node}: ") and \
        h.text.endswith("; reads and writes fail with 503 until it answers"), h.text
    assert "writes refused" not in h.text, h.text
    st = c.get("/v1/stats")
    assert st.status_code == 503 and node in st.json()["detail"], st.text
    log = srv.stderr()
    assert log.count(OUTAGE) == 1, log
    line = next(ln for ln in log.splitlines() if OUTAGE in ln)
    assert " WARN " in line and node in line, line
    assert RECOVERY not in log, log
    redis.start(redis.port)
    deadline = time.monotonic() + 20
    while c.post("/rank/0/initialize", {"num_pages": 16}).status_code != 200:
        assert time.monotonic() < deadline, "no recovery after Redis came back"
        time.sleep(0.1)
    for _ in range(5):
        assert c.v_exists(["z"]) == [False]
    assert c.get("/healthz").text == "ok"
    log = srv.stderr()
    assert log.count(OUTAGE) == 1 and log.count(RECOVERY) == 1, log
    line = next(ln for ln in log.splitlines() if RECOVERY in ln)
    assert " INFO " in line and node in line, line
    # A second outage is a second pair of lines.
    redis.kill()
    expect(c.post("/keys/batch_exists", {"keys": ["x"]}), 503)
    expect(c.post("/0/exists", {"keys": ["x"]}), 503)
    assert srv.stderr().count(OUTAGE) == 2, srv.stderr()


def test_banner_names_redis_without_the_password(redis, start_server):
    """The start banner and /v1/stats name the Redis in use and what it
    promises, not a data directory, and never the password."""
    redis.cli("ACL", "SETUSER", "kvp", "on", ">sekrit", "~*", "&*", "+@all")
    loc = f"redis://kvp:sekrit@127.0.0.1:{redis.port}/0?prefix=banner"
    srv = start_server("--meta", loc)
    srv.client().v_init(0, 4)
    log = srv.stderr()
    want = (f"state in Redis 127.0.0.1:{redis.port} db 0, prefix banner (appendonly no, "
            "appendfsync everysec: changes since the last RDB save may be lost)")
    assert want in log, log
    assert "kvpage-data" not in log and "write-ahead log" not in log, log
    assert "sekrit" not in log and "redis://kvp:***@127.0.0.1" in log, log  # the durability warning
    state = srv.stats()["server"]["state"]
    assert state == want[len("state in "):], state


def test_server_started_before_redis_waits_for_it(tmp_path, start_server):
    port = redisfix.free_port()
    r = redisfix.Redis()
    box = []
    # The server starts in a thread; Redis, 1.5 s later, from this one (a
    # redis-server dies with the thread that started it: PR_SET_PDEATHSIG).
    th = threading.Thread(target=lambda: box.append(
        start_server("--meta", f"redis://127.0.0.1:{port}/0?prefix=late")))
    th.start()
    try:
        time.sleep(1.5)
        r.start(port)
        th.join(60)
        assert box, "the server did not come up once Redis did"
        box[0].client().v_init(0, 8)
        assert "cannot reach" in box[0].stderr()
    finally:
        th.join(60)
        r.close()


@pytest.mark.parametrize("aof, warned", [
    (["--appendonly", "no"], "everything since its last snapshot"),
    (["--appendonly", "yes", "--appendfsync", "everysec"], "up to about a second"),
    (["--appendonly", "yes", "--appendfsync", "always"], None),
])
def test_durability_settings_are_checked_at_start(aof, warned, start_server):
    r = redisfix.Redis(aof).start()
    try:
        srv = start_server("--meta", r.url(prefix="dur"))
        err = srv.stderr()
        if warned:
            assert warned in err and "--fsync batch asks for appendonly yes and appendfsync always" in err, err
        else:
            assert "can be lost" not in err and "appendfsync always" in err, err
        # --fsync never asks for nothing: no warning
        quiet = start_server("--meta", r.url(prefix="dur"), "--fsync", "never").stderr()
        assert "can be lost" not in quiet, quiet
    finally:
        r.close()


@pytest.mark.parametrize("args, message", [
    (["--meta", "redis://127.0.0.1:1", "--data-dir", "x"], "--meta and --data-dir exclude each other"),
    (["--meta", "file:/tmp/x"], "expected the location of a remote backend: http://..., "
                                "redis://... or redis-sentinel://... (a data directory goes in "
                                "--data-dir)"),
])
def test_bad_meta_flags_are_usage_errors(args, message):
    import subprocess
    p = subprocess.run([require_bin(), "serve", "--listen", "127.0.0.1:0"] + args,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr


@pytest.mark.parametrize("setup, found", [
    (("zadd", "old:{old}:namespaces", "1", "d/6b76"), "format 1 (no old:{old}:format)"),
    (("set", "old:{old}:format", "9"), "format 9"),
])
def test_state_of_another_format_is_refused_at_start(redis, setup, found):
    # The data model of the scripts changed (issue 27); an older kvpage's
    # state under the same prefix is refused with what to do, never misread.
    import subprocess
    redis.cli(*setup)
    p = subprocess.run([require_bin(), "serve", "--listen", "127.0.0.1:0", "--meta",
                        redis.url(prefix="old")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert f"prefix 'old' holds kvpage state of {found}, this kvpage reads format 2" in p.stderr, \
        p.stderr
    assert "use another ?prefix=" in p.stderr
    before = redis.cli("dbsize")
    assert redis.cli("exists", "old:{old}:format") == ("1" if "9" in found else "0")  # untouched
    assert redis.cli("dbsize") == before


def test_a_bad_redis_url_is_refused_at_start(tmp_path):
    import subprocess
    p = subprocess.run([require_bin(), "serve", "--listen", "127.0.0.1:0", "--meta",
                        "redis://127.0.0.1:notaport"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr  # a bad location, as a bad flag (issue 36)
    assert "cannot open the state in redis://127.0.0.1:notaport" in p.stderr, p.stderr


def test_redis_cluster_flows(start_server):
    cl = redisfix.Cluster(3).start()
    try:
        a = start_server("--meta", cl.url(prefix="cl")).client()
        b = start_server("--meta", cl.url(prefix="cl")).client()
        # Ranks and pools spread over the shards (each rank is one slot).
        for rank in range(6):
            a.v_init(rank, 64)
        keys = _keys("c", 20)
        locs = {}
        for rank in range(6):
            locs[rank] = a.v_write(rank, keys)
        assert b.v_exists(keys) == [True] * 20
        for rank in range(6):
            assert b.v_loc(rank, keys) == locs[rank]
        for pool in ("p1", "p2", "p3", "p4"):
            b.s_init(0, 16, ns=pool)
            pages = b.s_write(0, keys[:5], ns=pool)
            assert a.s_get(0, keys[:5], ns=pool) == pages
        a.v_delete(keys[:10])
        assert b.v_exists(keys) == [False] * 10 + [True] * 10
        st = invariants(a.get("/v1/stats").json())
        assert counts(st, 3) == (64, 54, 0, 10)
        used = {n.port: int(n.cli("dbsize")) for n in cl.nodes}
        assert sum(1 for v in used.values() if v) >= 2, f"every key on one shard: {used}"
    finally:
        cl.close()


def _replicated(cl):
    """Waits until every replica has every write of its master (Redis
    replicates asynchronously: a write acknowledged just before its master
    dies can be lost, with or without kvpage)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        behind = []
        for m in cl.masters():
            info = dict(line.split(":", 1) for line in m.cli("info", "replication").splitlines()
                        if ":" in line)
            want = int(info["master_repl_offset"])
            got = [int(dict(kv.split("=") for kv in v.split(","))["offset"])
                   for k, v in info.items() if k.startswith("slave") and "offset=" in v]
            if len(got) < cl.replicas or min(got) < want:
                behind.append((m.port, want, got))
        if not behind:
            return
        time.sleep(0.05)
    raise AssertionError(f"replicas did not catch up: {behind}")


def test_redis_cluster_master_killed_its_replica_takes_over(start_server):
    # Three masters with a replica each; a master dies (SIGKILL), its replica
    # is promoted after the node timeout, and the server finds it (it reads
    # the slot map again after a connection error): requests on the dead
    # master's slots fail with 503 meanwhile, then every rank answers with
    # what it had, and takes new writes.
    cl = redisfix.Cluster(3, replicas=1, node_timeout=1000).start()
    try:
        srv = start_server("--meta", cl.url(prefix="fo"))
        a = srv.client()
        for rank in range(6):
            a.v_init(rank, 64)
        keys = _keys("f", 20)
        locs = {rank: a.v_write(rank, keys) for rank in range(6)}
        _replicated(cl)
        victim = max(cl.masters(), key=lambda n: int(n.cli("dbsize")))
        assert int(victim.cli("dbsize")) > 0
        victim.kill()
        statuses = set()
        deadline = time.monotonic() + 60
        while True:
            codes = [a.post("/keys/get_locations", {"rank": r, "keys": keys}).status_code
                     for r in range(6)]
            statuses.update(codes)
            if codes == [200] * 6:
                break
            assert set(codes) <= {200, 503}, codes  # never a 500, never a hang
            assert time.monotonic() < deadline, (
                f"no recovery after the failover: {codes}, seen {statuses}")
            time.sleep(0.1)
        assert len(cl.masters()) == 3  # the replica took the dead master's place
        for rank in range(6):
            assert a.v_loc(rank, keys) == locs[rank], rank
        assert a.v_exists(keys) == [True] * 20
        more = _keys("g", 5)
        for rank in range(6):
            assert len(set(a.v_write(rank, more)) | set(locs[rank])) == 25
        st = invariants(a.get("/v1/stats").json())
        for rank in range(6):
            assert counts(st, rank) == (64, 39, 0, 25), (rank, counts(st, rank))
        assert srv.alive(), srv.stderr()
    finally:
        cl.close()
