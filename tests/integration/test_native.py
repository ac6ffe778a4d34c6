"""Native routes (protocol.md §4) and the process itself: /healthz, /metrics,
/v1/stats, signals, --help, bad flags, a port already in use."""
import math
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from kvpserver import free_port, require_bin, sanitizer_report
from kvptest import RANK_FIELDS, counts, expect, invariants, rank_stats


def test_healthz(server, client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.text.strip() == "ok"
    # keep-alive: the same connection serves many requests
    for _ in range(20):
        assert client.get("/healthz").status_code == 200


# ---- /v1/stats -------------------------------------------------------------------

def test_stats_empty(server, client):
    st = server.stats()
    assert st["namespaces"] == []
    assert isinstance(st["requests"], dict)


def test_stats_shape_and_values(server, client):
    client.v_init(1, 6)
    client.v_init(0, 8)
    client.v_write(0, ["a"])
    client.v_write(0, ["b"])
    assert client.v_alloc(0, ["a", "c", "d"]) == [0, 2, 3]  # 1 hit, 2 new
    assert client.v_loc(0, ["a", "zz"]) == [None, None]  # incomplete: rank 1 lacks a
    client.v_write(1, ["a", "b"])
    assert client.v_loc(0, ["a", "zz"]) == [0, None]  # 1 hit, 1 miss
    client.v_confirm(0, [], [3, 0])  # release a reservation and a held page
    client.s_init(0, 3, ns="mamba")
    st = server.stats()
    assert set(st) >= {"namespaces", "requests"}, st
    assert isinstance(st["requests"], dict)
    byname = {(ns["deployment"], ns["pool"]): ns for ns in st["namespaces"]}
    assert set(byname) == {("default", "kv"), ("default", "mamba")}
    for ns in st["namespaces"]:
        assert set(ns) >= {"deployment", "pool", "ranks"}, ns
        for r in ns["ranks"]:
            assert set(r) >= set(RANK_FIELDS), r
            for f in RANK_FIELDS:
                assert type(r[f]) is int, (f, r)
    kv = byname[("default", "kv")]
    assert sorted(r["rank"] for r in kv["ranks"]) == [0, 1]
    r0 = rank_stats(st, 0)
    expected0 = {"rank": 0, "num_pages": 8, "free": 5, "reserved": 1, "held": 2, "keys": 2,
                 "allocations": 4, "evictions": 0, "expired_reservations": 0, "release_of_held_page": 1}
    assert {k: r0[k] for k in expected0} == expected0, r0
    # hits: the allocation hit on a + the lookup that returned a's page;
    # misses: 4 new allocations + 3 lookups that returned null.
    assert (r0["hits"], r0["misses"]) == (2, 7), r0
    r1 = rank_stats(st, 1)
    assert (r1["num_pages"], r1["free"], r1["reserved"], r1["held"], r1["keys"]) == (6, 4, 0, 2, 2)
    m = rank_stats(st, 0, pool="mamba")
    assert (m["num_pages"], m["free"], m["reserved"], m["held"]) == (3, 3, 0, 0)
    invariants(st)


def test_stats_counts_evictions(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 2)
    c.v_write(0, ["a", "b"])
    c.v_write(0, ["c"])
    c.v_write(0, ["d", "e"])
    st = invariants(srv.stats())
    r = rank_stats(st, 0)
    assert r["evictions"] == 3
    assert r["allocations"] == 5
    assert counts(st, 0) == (2, 0, 0, 2)


def test_stats_requests_grow(server, client):
    a = server.stats()["requests"]
    for _ in range(3):
        client.v_exists(["x"])
    b = server.stats()["requests"]
    assert b != a


# ---- /metrics ----------------------------------------------------------------

SAMPLE_RE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*\})?'
    r' ([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|\+Inf|-Inf|Inf))( -?[0-9]+)?$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse_metrics(text):
    """Parses Prometheus text format 0.0.4 strictly; returns
    (types {family: type}, samples [(name, {label: value}, float)])."""
    types, helps, samples = {}, {}, []
    assert text.endswith("\n"), "exposition must end with a newline"
    for ln, line in enumerate(text.split("\n")[:-1], 1):
        if line == "":
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] == "TYPE":
                assert len(parts) == 4 and parts[3] in ("counter", "gauge", "histogram", "summary", "untyped"), line
                assert parts[2] not in types, f"line {ln}: second TYPE for {parts[2]}"
                types[parts[2]] = parts[3]
            elif len(parts) >= 3 and parts[1] == "HELP":
                helps[parts[2]] = parts[3] if len(parts) > 3 else ""
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"line {ln} is not a valid sample: {line!r}"
        labels = dict(LABEL_RE.findall(m.group(2) or ""))
        v = m.group(3)
        val = float(v.replace("Inf", "inf")) if "Inf" in v else float(v)
        samples.append((m.group(1), labels, val))
    for name, _, _ in samples:
        fam = family(name, types)
        assert fam in types, f"sample {name} has no # TYPE line"
    return types, samples


def family(name, types):
    if name in types:
        return name
    for suf in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suf) and name[: -len(suf)] in types:
            return name[: -len(suf)]
    return name


def scrape(client):
    r = client.get("/metrics")
    assert r.status_code == 200
    ctype = r.headers.get("Content-Type", "")
    assert ctype.startswith("text/plain"), ctype
    assert "version=0.0.4" in ctype, ctype
    return parse_metrics(r.text)


def test_metrics_is_prometheus_text(server, client):
    client.v_init(0, 7)
    client.v_write(0, ["a", "b"])
    client.v_alloc(0, ["r"])
    client.v_exists(["a"])
    assert client.v_loc(0, ["a", "b", "zz"]) == [0, 1, None]
    client.v_confirm(0, [], [0])  # refused release of a held page
    client.post("/keys/batch_allocate", {"rank": 99, "keys": []})  # a 404
    types, samples = scrape(client)
    assert samples, "no samples"
    # at least one counter and one histogram family
    assert "counter" in types.values(), types
    hists = [f for f, t in types.items() if t == "histogram"]
    assert hists, types
    for h in hists:
        buckets = {}
        for name, labels, v in samples:
            if name == h + "_bucket":
                key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
                buckets.setdefault(key, []).append((labels["le"], v))
        assert buckets, f"histogram {h} has no buckets"
        for key, bs in buckets.items():
            les = [math.inf if le == "+Inf" else float(le) for le, _ in bs]
            assert les == sorted(les), (h, key)
            assert les[-1] == math.inf, (h, key)
            vals = [v for _, v in bs]
            assert vals == sorted(vals), f"{h}{key}: buckets not cumulative {vals}"
            count = [v for n, lab, v in samples if n == h + "_count" and
                     tuple(sorted(lab.items())) == key]
            assert count == [vals[-1]], (h, key, count, vals[-1])
            assert any(n == h + "_sum" and tuple(sorted(lab.items())) == key for n, lab, _ in samples), (h, key)
    # per-rank page gauges: some sample for rank 0 equals num_pages, free,
    # reserved and held (7, 4, 1, 2)
    rank0 = {}
    for name, labels, v in samples:
        if labels.get("rank") == "0":
            rank0.setdefault(name, []).append((labels, v))
    assert rank0, "no metric with a rank=\"0\" label"

    def find(word, value):
        return [(n, lab) for n, lst in rank0.items() for lab, v in lst if word in n + str(lab) and v == value]

    assert find("free", 4), rank0
    assert find("held", 2), rank0
    assert find("reserved", 1), rank0
    assert find("total", 7) or find("pages", 7), rank0
    # every per-rank figure of /v1/stats is also a metric with the same value
    r0 = rank_stats(server.stats(), 0)
    for field, word in [("keys", "keys"), ("hits", "hit"), ("misses", "miss"), ("allocations", "alloc"),
                        ("evictions", "evict"), ("expired_reservations", "expired"),
                        ("release_of_held_page", "release")]:
        assert find(word, r0[field]), (field, r0[field], sorted(rank0))
    # labels name the namespace of the rank
    labels0 = [lab for lst in rank0.values() for lab, _ in lst]
    assert any("default" in lab.values() for lab in labels0), labels0
    # request counts per route and status
    routes = [lab for n, lab, v in samples if any("batch_allocate" in x for x in lab.values())]
    assert routes, "no sample labelled with the batch_allocate route"
    assert any("404" in lab.values() for lab in routes), routes


def test_metrics_counters_grow(server, client):
    client.v_init(0, 4)
    _, s1 = scrape(client)
    for i in range(5):
        client.v_exists([f"k{i}"])
    client.v_write(0, ["a"])
    types, s2 = scrape(client)

    def route_counts(samples):
        out = {}
        for name, labels, v in samples:
            if types.get(family(name, types)) == "counter" and any("batch_exists" in x for x in labels.values()):
                out[(name, tuple(sorted(labels.items())))] = v
        return out

    c1, c2 = route_counts(s1), route_counts(s2)
    assert c2, "no counter labelled with the batch_exists route"
    grew = [k for k in c2 if c2[k] - c1.get(k, 0) >= 5]
    assert grew, (c1, c2)
    # counters never go down
    v1 = {(n, tuple(sorted(lab.items()))): v for n, lab, v in s1 if types.get(family(n, types)) == "counter"}
    v2 = {(n, tuple(sorted(lab.items()))): v for n, lab, v in s2 if types.get(family(n, types)) == "counter"}
    for k, v in v1.items():
        assert k in v2 and v2[k] >= v, k


# ---- process -------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_clean_shutdown(start_server, sig):
    srv = start_server()
    c = srv.client()
    c.v_init(0, 4)
    c.v_write(0, ["a"])
    c.v_alloc(0, ["b"])
    assert c.get("/healthz").status_code == 200  # an idle keep-alive connection stays open
    t0 = time.monotonic()
    rc = srv.stop(sig)
    assert time.monotonic() - t0 < 10, "shutdown took too long"
    srv.assert_clean_exit(rc)


def run_cli(*args, timeout=30):
    p = subprocess.run([require_bin(), *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def test_serve_help():
    rc, out, err = run_cli("serve", "--help")
    assert rc == 0, (rc, out, err)
    text = out + err
    for flag in ("--listen", "--data-dir", "--allow", "--token", "--lease-seconds", "--read-grace-ms",
                 "--max-body", "--max-keys", "--snapshot-bytes"):
        assert flag in text, f"{flag} missing from --help:\n{text}"
    assert not sanitizer_report(err), err


def test_top_level_help():
    rc, out, err = run_cli("--help")
    assert rc == 0, (rc, out, err)
    assert "serve" in out


def test_no_command_exits_2():
    rc, out, err = run_cli()
    assert rc == 2
    assert err.strip()


@pytest.mark.parametrize("args,word", [
    (["--bogus-flag"], "bogus-flag"),
    (["--lease-seconds", "abc"], "lease-seconds"),
    (["--read-grace-ms", "-5"], "read-grace-ms"),
    (["--max-body", "lots"], "max-body"),
    (["--listen", "not-an-address"], "listen"),
    (["--allow", "300.1.2.3/8"], "allow"),
    (["--allow", "10.0.0.0/33"], "allow"),
    (["--log-level", "loud"], "log-level"),
    (["--listen"], "listen"),
    (["--snapshot-bytes", "63K"], "snapshot-bytes"),
    (["--snapshot-bytes", "big"], "snapshot-bytes"),
], ids=["unknown", "lease-nan", "grace-negative", "max-body-nan", "listen-bad", "allow-bad-ip",
        "allow-bad-prefix", "log-level-bad", "listen-missing-value", "snapshot-bytes-small",
        "snapshot-bytes-nan"])
def test_bad_flag_exits_2(args, word, tmp_path):
    listen = [] if "--listen" in args else ["--listen", f"127.0.0.1:{free_port()}"]
    try:
        rc, out, err = run_cli("serve", "--data-dir", "none", *listen, *args, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvpage serve {' '.join(args)} did not exit: the bad flag was accepted")
    assert rc == 2, (rc, out, err)
    assert word in err, f"stderr does not name {word}:\n{err}"
    assert not sanitizer_report(err), err


def test_port_in_use(tmp_path):
    binary = require_bin()
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        p = subprocess.run([binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", "none"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    finally:
        holder.close()
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, err
    assert p.returncode > 0, f"killed by a signal: {p.returncode}\n{err}"
    low = err.lower()
    assert "in use" in low or str(port) in err, f"unclear message:\n{err}"
    assert not sanitizer_report(err), err


@pytest.mark.parametrize("why", ["port-in-use", "bad-flag", "state-in-use"])
def test_refused_start_leaves_no_data_directory(tmp_path, why):
    """issue 36: a serve refused at start (port in use) left the data
    directory it created, with LOCK and a 1 MiB log. A refused start
    creates none (--data-dir is the default ./kvpage-data too), and leaves a
    directory in use as it was."""
    binary = require_bin()
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv = None
    (tmp_path / "busy").mkdir()  # the stderr of the server that holds the state
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = free_port() if why != "port-in-use" else holder.getsockname()[1]
        args = ["serve", "--listen", f"127.0.0.1:{port}"]
        before = {}
        if why == "bad-flag":
            args += ["--log-level", "loud"]
        if why == "state-in-use":
            from kvpserver import launch
            srv = launch(tmp_path / "busy", ["--data-dir", tmp_path / "kvpage-data"])
            before = {n: (tmp_path / "kvpage-data" / n).stat().st_size
                      for n in os.listdir(tmp_path / "kvpage-data")}
        p = subprocess.run([binary, *args], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=60, cwd=tmp_path)
        err = p.stderr.decode(errors="replace")
        assert p.returncode in (1, 2), err
        if why == "state-in-use":
            assert {n: (tmp_path / "kvpage-data" / n).stat().st_size
                    for n in os.listdir(tmp_path / "kvpage-data")} == before
        else:
            assert sorted(os.listdir(tmp_path)) == ["busy"], err
    finally:
        holder.close()
        if srv is not None:
            assert srv.stop() == 0, srv.stderr()


def test_every_thread_but_the_main_one_blocks_sigterm(tmp_path):
    """issue 36 (a flaky test_disk.py run exited -15): the log's and the
    snapshot's threads, started while the state opens, had SIGTERM
    unblocked, so a SIGTERM that arrived while the main thread was not in
    its sigwait (during start-up) killed the process. Every thread but the
    main one (which takes them in sigwait) blocks SIGINT and SIGTERM."""
    from kvpserver import launch
    srv = launch(tmp_path, ["--data-dir", tmp_path / "data"])
    try:
        pid = srv.proc.pid
        tasks = os.listdir(f"/proc/{pid}/task")
        assert len(tasks) >= 3  # main, the log's flusher, MHD's
        for tid in tasks:
            if int(tid) == pid:
                continue
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            blocked = int(st["SigBlk"], 16)
            for sig in (signal.SIGINT, signal.SIGTERM):
                assert blocked & (1 << (sig - 1)), (st["Name"], sig, st["SigBlk"])
    finally:
        assert srv.stop() == 0, srv.stderr()


def test_sigterm_during_start_up_is_a_clean_stop(tmp_path):
    """A SIGTERM that arrives while the state is still opening (its LOCK is
    there, the log is being made) waits for the server's sigwait: it stops
    cleanly, exit 0, where it killed the process (-15)."""
    binary = require_bin()
    for attempt in range(5):
        data = tmp_path / f"data{attempt}"
        p = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{free_port()}",
                              "--data-dir", str(data)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline and not (data / "LOCK").exists():
            pass
        assert p.poll() is None, p.stderr.read().decode(errors="replace")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        err = err.decode(errors="replace")
        if "port" in err and "in use" in err:
            continue  # another process took the free port meanwhile
        assert p.returncode == 0, (p.returncode, err)
        assert not sanitizer_report(err), err
        return
    pytest.fail("no free port in 5 tries")
