"""`kvpage clear` through the real binary (issue 36, §4): a rank, a
namespace, every namespace of a location, or --drop to remove namespaces;
nothing without --yes. Embedded (a data directory), against a real `kvpage
serve` (its backend: in process, or Redis with KVPAGE_TEST_BACKEND=redis)
and straight on Redis. Also the server's POST /drop route, the drop
surviving restarts, and the resize refusal that names the clear command."""
import os
import re
import shutil
import signal
import subprocess

import pytest
import requests

from kvpserver import launch, require_bin, run_kvp
import redisfix

PAGE = "64K"


def kvp(*args, cwd=None):
    """Runs the kvpage binary; returns (exit status, stdout text, stderr text)."""
    return run_kvp(*args, cwd=cwd, stdout="replace")


@pytest.fixture
def redis():
    if not shutil.which("redis-server"):
        pytest.skip("redis-server is not installed")
    r = redisfix.Redis().start()
    yield r
    r.close()


@pytest.fixture(params=["embedded", "remote", "redis"])
def meta(request, tmp_path):
    """A metadata location: a data directory, a kvpage serve, or Redis."""
    if request.param == "embedded":
        d = tmp_path / "state"
        d.mkdir()
        return str(d)
    if request.param == "remote":
        return request.getfixturevalue("start_server")().url()
    return request.getfixturevalue("redis").url(prefix="clr")


def put(tmp_path, meta, key, rank=0, deployment="default", pool="kv", size="1M"):
    """Puts key (its own bytes) on its own page file of (deployment, pool, rank)."""
    f = tmp_path / f"{deployment}-{pool}-{rank}.pages"
    rc, _, err = _put(f, meta, key, rank, deployment, pool, size)
    assert rc == 0, err
    return f


def _put(f, meta, key, rank, deployment, pool, size):
    p = subprocess.run([require_bin(), "put", "--file", str(f), "--file-size", size,
                        "--page-size", PAGE, "--rank", str(rank), "--meta", meta,
                        "--deployment", deployment, "--pool", pool, key],
                       input=key.encode(), capture_output=True, timeout=120)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def present(tmp_path, meta, key, rank=0, deployment="default", pool="kv"):
    f = tmp_path / f"{deployment}-{pool}-{rank}.pages"
    rc, out, err = kvp("exists", "--file", f, "--page-size", PAGE, "--rank", rank, "--meta",
                       meta, "--deployment", deployment, "--pool", pool, key)
    assert rc in (0, 1), err
    return out == f"{key}\tpresent\n"


def files_of(d):
    """Every file of a directory: name -> (bytes, mode, owner)."""
    out = {}
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        st = os.stat(p)
        with open(p, "rb") as f:
            out[n] = (f.read(), st.st_mode, st.st_uid)
    return out


# `kvpage exists` asks whether a key is complete (on every rank of its
# namespace), so the tests put a key on each rank they use, and read one
# rank's keys from clear's own preview.


def test_without_yes_changes_nothing_and_says_what(tmp_path, meta):
    put(tmp_path, meta, "k", rank=0)
    put(tmp_path, meta, "k", rank=1)
    before = files_of(meta) if os.path.isdir(meta) else None
    rc, out, err = kvp("clear", "--meta", meta, "--rank", 0)
    assert rc == 2 and out == ""
    assert "nothing changed" in err
    assert "clear rank 0 of default/kv" in err and "(1 keys)" in err
    assert "add --yes to do it" in err
    rc, _, err = kvp("clear", "--meta", meta)
    assert rc == 2 and "clear namespace default/kv" in err and "2 ranks, 2 keys" in err
    rc, _, err = kvp("clear", "--meta", meta, "--drop")
    assert rc == 2 and "drop namespace default/kv" in err
    if before is not None:  # a refusal writes nothing, not even a snapshot
        assert files_of(meta) == before
    assert present(tmp_path, meta, "k", 0)


def test_clear_rank(tmp_path, meta):
    for k in ("k", "j"):
        put(tmp_path, meta, k, rank=0)
        put(tmp_path, meta, k, rank=1)
    rc, out, err = kvp("clear", "--meta", meta, "--rank", 0, "--yes")
    assert (rc, err) == (0, "")
    assert out.startswith("cleared rank 0 of default/kv at ")
    assert not present(tmp_path, meta, "k", 0)
    # rank 1 keeps its keys; rank 0 stays initialized (listed), with none
    rc, _, err = kvp("clear", "--meta", meta, "--rank", 1)
    assert rc == 2 and "clear rank 1 of default/kv" in err and "(2 keys)" in err
    rc, _, err = kvp("clear", "--meta", meta, "--rank", 0)
    assert rc == 2 and "clear rank 0 of default/kv" in err and "(0 keys)" in err
    # its pages are free: a key put again gets one
    put(tmp_path, meta, "k", rank=0)
    assert present(tmp_path, meta, "k", 0)
    # a rank that is not there
    rc, out, err = kvp("clear", "--meta", meta, "--rank", 7, "--yes")
    assert rc == 1 and "rank 7 of default/kv" in err and "not initialized" in err


def test_clear_namespace_and_all(tmp_path, meta):
    put(tmp_path, meta, "a", rank=0, pool="p1")
    put(tmp_path, meta, "a", rank=1, pool="p1")
    put(tmp_path, meta, "b0", rank=0, pool="p2")
    put(tmp_path, meta, "c0", rank=0, deployment="other")
    rc, out, err = kvp("clear", "--meta", meta, "--pool", "p1", "--yes")
    assert (rc, err) == (0, "") and "cleared namespace default/p1" in out
    assert not present(tmp_path, meta, "a", 0, pool="p1")
    rc, _, err = kvp("clear", "--meta", meta, "--pool", "p1")
    assert rc == 2 and "(2 ranks, 0 keys)" in err
    assert present(tmp_path, meta, "b0", 0, pool="p2")
    assert present(tmp_path, meta, "c0", 0, deployment="other")
    rc, out, err = kvp("clear", "--meta", meta, "--pool", "nope", "--yes")
    assert rc == 1 and "no namespace default/nope" in err
    rc, out, err = kvp("clear", "--meta", meta, "--all", "--yes")
    assert (rc, err) == (0, "")
    assert "cleared namespace default/p2" in out and "cleared namespace other/kv" in out
    assert not present(tmp_path, meta, "b0", 0, pool="p2")
    assert not present(tmp_path, meta, "c0", 0, deployment="other")


def test_drop_namespace(tmp_path, meta):
    put(tmp_path, meta, "a", rank=0, deployment="bench")
    put(tmp_path, meta, "a", rank=3, deployment="bench")
    put(tmp_path, meta, "keep", rank=0)
    rc, out, err = kvp("clear", "--meta", meta, "--deployment", "bench", "--drop", "--yes")
    assert (rc, err) == (0, "") and out.startswith("dropped namespace bench/kv at ")
    # gone: the preview of --all no longer lists it
    rc, _, err = kvp("clear", "--meta", meta, "--all")
    assert rc == 2 and "bench/kv" not in err and "default/kv" in err
    rc, _, err = kvp("clear", "--meta", meta, "--deployment", "bench", "--drop", "--yes")
    assert rc == 1 and "no namespace bench/kv" in err
    assert present(tmp_path, meta, "keep", 0)
    # the next user creates it again, empty
    assert not present(tmp_path, meta, "a", 0, deployment="bench")
    put(tmp_path, meta, "again", rank=0, deployment="bench")
    assert present(tmp_path, meta, "again", 0, deployment="bench")
    rc, out, err = kvp("clear", "--meta", meta, "--all", "--drop", "--yes")
    assert rc == 0 and "dropped namespace bench/kv" in out and "dropped namespace default/kv" in out
    rc, out, err = kvp("clear", "--meta", meta, "--all", "--yes")
    assert rc == 0 and "no namespace at" in out


def test_bad_flags_change_nothing(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    put(tmp_path, str(d), "k")
    for args, words in [
        (["--rank", "0", "--all"], "--rank and --all"),
        (["--rank", "0", "--drop"], "not with --rank"),
        (["--all", "--pool", "kv"], "--all takes no"),
        (["--rank", "-1"], "is not a rank"),
        (["--frob"], "unknown flag"),
        (["extra"], "takes no arguments"),
    ]:
        rc, out, err = kvp("clear", "--meta", d, *args, "--yes")
        assert rc == 2 and words in err, (args, err)
    rc, _, err = kvp("clear", "--yes")
    assert rc == 2 and "--meta DIR|URL is required" in err
    rc, _, err = kvp("clear", "--meta", tmp_path / "missing", "--yes")
    assert rc == 2 and "not a data directory" in err
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").mkdir()
    rc, _, err = kvp("clear", "--meta", tmp_path / "empty", "--all", "--yes")
    assert rc == 2 and "holds no kvpage state" in err
    assert os.listdir(tmp_path / "empty") == []  # nothing written into it
    rc, _, err = kvp("clear", "--meta", "127.0.0.1:1", "--yes", cwd=tmp_path)
    assert rc == 2 and "did you mean http://127.0.0.1:1?" in err
    # the library's rule and words, as the store's commands give them
    rc2, _, err2 = kvp("put", "--file", tmp_path / "f.pages", "--file-size", "1M", "--page-size",
                       PAGE, "--meta", "127.0.0.1:1", "k", "-", cwd=tmp_path)
    words = "metadata location '127.0.0.1:1' looks like HOST:PORT, not a directory: did you mean"
    assert rc2 == 2 and words in err2 and err.endswith(err2[err2.index(words):]), (err, err2)
    assert not (tmp_path / "f.pages").exists()
    for same in ("file:127.0.0.1:1", "./127.0.0.1:1"):  # a directory, always
        rc, _, err = kvp("clear", "--meta", same, "--yes", cwd=tmp_path)
        assert rc == 2 and err.endswith("127.0.0.1:1 is not a data directory: nothing to "
                                        "clear\n"), err
    (tmp_path / "127.0.0.1:1").mkdir()  # an existing directory of that name is one
    rc, _, err = kvp("clear", "--meta", "127.0.0.1:1", "--yes", cwd=tmp_path)
    assert rc == 2 and f"{tmp_path}/127.0.0.1:1 holds no kvpage state" in err, err
    assert present(tmp_path, str(d), "k")
    rc, out, _ = kvp("clear", "--help")
    assert rc == 0 and "--drop" in out and "--yes" in out


def test_clear_refused_while_a_server_holds_the_directory(tmp_path, start_server):
    if redisfix.BACKEND == "redis":
        pytest.skip("about the in-process backend's data directory")
    srv = start_server("--data-dir", tmp_path / "srv")
    c = srv.client()
    c.v_init(0, 8)
    c.v_write(0, ["k"])
    rc, _, err = kvp("clear", "--meta", tmp_path / "srv", "--yes")
    assert rc == 3 and "cannot open the metadata" in err
    assert c.v_exists(["k"]) == [True]
    c.close()


def test_server_drop_route(start_server):
    srv = start_server()
    s = requests.Session()
    base = srv.url("/ns/bench")
    assert s.post(base + "/rank/0/initialize", json={"num_pages": 1048576}).ok
    assert s.post(srv.url("/rank/0/initialize"), json={"num_pages": 8}).ok
    st = s.get(srv.url("/v1/stats")).json()
    assert {(n["deployment"], n["pool"]) for n in st["namespaces"]} >= {("bench", "kv")}
    assert 'deployment="bench"' in s.get(srv.url("/metrics")).text
    r = s.post(base + "/drop", json={})
    assert (r.status_code, r.text) == (204, "")
    st = s.get(srv.url("/v1/stats")).json()
    assert [(n["deployment"], n["pool"]) for n in st["namespaces"]] == [("default", "kv")]
    assert 'deployment="bench"' not in s.get(srv.url("/metrics")).text
    r = s.post(base + "/drop", json={})
    assert r.status_code == 404 and "Namespace not found" in r.text
    r = s.post(srv.url("/drop"), json={"namespace": 5})
    assert r.status_code == 400 and "Invalid namespace" in r.text
    r = s.get(srv.url("/drop"))
    assert r.status_code == 405
    # an engine's next initialization creates it again, empty
    assert s.post(base + "/rank/0/initialize", json={"num_pages": 16}).ok
    st = s.get(srv.url("/v1/stats")).json()
    ns = [n for n in st["namespaces"] if n["deployment"] == "bench"]
    assert len(ns) == 1 and [r["num_pages"] for r in ns[0]["ranks"]] == [16]
    s.close()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_drop_survives_a_restart(tmp_path, start_server, how):
    """SIGTERM: recovered from the final snapshot; SIGKILL: from the log."""
    if redisfix.BACKEND == "redis":
        pytest.skip("about the in-process backend's data directory")
    d = tmp_path / "srv"
    srv = launch(tmp_path, ["--data-dir", str(d), "--fsync", "always"])
    c = srv.client(prefix="/ns/bench")
    c.v_init(0, 1048576)
    c.v_write(0, ["k"])
    c.close()
    rc, out, err = kvp("clear", "--meta", srv.url(), "--deployment", "bench", "--drop", "--yes")
    assert (rc, err) == (0, "")
    if how == "SIGKILL":
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
        srv.assert_no_sanitizer_report()
    else:
        srv.assert_clean_exit(srv.stop())
    rc, out, err = kvp("inspect", d)
    assert rc == 0 and "bench" not in out, out
    srv2 = start_server("--data-dir", d)
    st = srv2.stats()
    assert all(n["deployment"] != "bench" for n in st["namespaces"]), st
    # the status page draws /v1/stats; /metrics labels every namespace
    assert "bench" not in requests.get(srv2.url("/v1/stats")).text
    assert 'deployment="bench"' not in requests.get(srv2.url("/metrics")).text


def test_resize_refusal_names_the_clear_command(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    f = tmp_path / "r.pages"
    assert _put(f, str(d), "k", 2, "dep1", "p2", "1M")[0] == 0
    g = tmp_path / "bigger.pages"
    rc, _, err = _put(g, str(d), "k", 2, "dep1", "p2", "2M")
    assert rc == 2
    m = re.search(r"\(kvpage clear ([^)]*)\)", err)
    assert m, err
    cmd = m.group(1).split()
    assert cmd == ["--meta", str(d), "--deployment", "dep1", "--pool", "p2", "--rank", "2",
                   "--yes"], err
    rc, out, err2 = kvp("clear", *cmd)
    assert rc == 0, err2
    assert _put(g, str(d), "k", 2, "dep1", "p2", "2M")[0] == 0  # the advice worked
    # the store's default location (PATH.meta) is named by --file
    h = tmp_path / "own.pages"
    p = subprocess.run([require_bin(), "put", "--file", str(h), "--file-size", "1M",
                        "--page-size", PAGE, "k"], input=b"x", capture_output=True)
    assert p.returncode == 0
    p = subprocess.run([require_bin(), "put", "--file", str(h), "--file-size", "2M",
                        "--page-size", PAGE, "k2"], input=b"x", capture_output=True)
    err = p.stderr.decode()
    assert p.returncode == 2 and f"(kvpage clear --file {h} --rank 0 --yes)" in err, err


def test_help_man_page_and_completion_know_clear():
    from test_docs import _complete, _man_page, flags_of, run
    p = run("clear", "--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: kvpage clear")
    assert "examples:" in p.stdout
    assert run("help", "clear").stdout == p.stdout
    assert "  clear " in run("help").stdout
    flags = flags_of(p.stdout)
    assert {"--meta", "--rank", "--all", "--drop", "--yes"} <= set(flags)
    env = dict(os.environ, MANWIDTH="200", LC_ALL="C.UTF-8")
    man = subprocess.run(["man", "--nh", "--nj", "-l", _man_page()], capture_output=True,
                         text=True, env=env, timeout=60).stdout
    assert "kvpage clear" in man
    missing = [f for f in flags if f not in man and f != "--help"]
    assert not missing, missing
    assert "clear" in _complete("kvpage", "")
    assert set(flags) <= _complete("kvpage", "clear", "--")


def test_drop_while_an_engine_uses_the_namespace(start_server, tmp_path):
    """Engines keep calling while the namespace is dropped again and again
    (data directory: each drop logged; with KVPAGE_TEST_BACKEND=redis, the
    Redis backend): every answer is one the protocol allows (a rank not
    initialized after a drop, then initialized again), the server's
    invariants hold at the end and it exits cleanly (no sanitizer report
    under ASan)."""
    import threading
    flags = [] if redisfix.BACKEND == "redis" else ["--data-dir", tmp_path / "d"]
    srv = start_server(*flags)
    stop = threading.Event()
    bad = []

    def engine(rank):
        c = srv.client(prefix="/ns/busy")
        i = 0
        while not stop.is_set():
            i += 1
            if c.post(f"/rank/{rank}/initialize", {"num_pages": 64}).status_code != 200:
                bad.append("initialize")
            keys = [f"r{rank}-{i}-{j}" for j in range(4)]
            r = c.post("/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in keys]})
            if r.status_code == 404:  # dropped between the two
                continue
            if r.status_code != 200:
                bad.append(f"allocate {r.status_code} {r.text}")
                continue
            conf = [[k, p] for k, p in r.json()["results"] if p >= 0]
            r = c.post("/keys/confirm_write", {"rank": rank, "confirmations": conf})
            if r.status_code not in (204, 404):  # 404: dropped since the allocation
                bad.append(f"confirm {r.status_code} {r.text}")
            r = c.post("/keys/batch_exists", {"keys": keys})
            if r.status_code != 200:
                bad.append(f"exists {r.status_code}")
        c.close()

    threads = [threading.Thread(target=engine, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    drops = 0
    s = requests.Session()
    try:
        for _ in range(40):
            r = s.post(srv.url("/ns/busy/drop"), json={})
            assert r.status_code in (204, 404), r.text
            drops += r.status_code == 204
    finally:
        stop.set()
        for t in threads:
            t.join()
        s.close()
    assert not bad, bad[:5]
    assert drops > 0
