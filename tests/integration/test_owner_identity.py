"""The owner of a page file is the metadata's identity, not its spelling
(issue 36 §2): every state (a data directory, a Redis prefix) has an
identity made with it, a kvpage serve reports its backend's in /v1/stats
(server.identity), and PATH.owner records it. http://localhost:P and
http://127.0.0.1:P are one owner, two servers over one Redis are one owner,
two states behind the same URL (a server restarted on another data
directory) are two; an owner record without an identity (an older
kvpage's) is compared by location, as before."""
import os
import re
import shutil
import subprocess
import time

import requests

from kvpserver import require_bin, run_kvp

BASE = ["--page-size", "64K"]


def kvp(*args, input=None):
    return run_kvp(*args, input=input, stdout="bytes")


def identity_of(srv):
    return requests.get(srv.url("/v1/stats"), timeout=10).json()["server"].get("identity")


def recorded(path):
    m = re.search(r"^identity (\S+)$", open(f"{path}.owner").read(), re.M)
    return m and m.group(1)


def test_localhost_and_127_are_one_owner(tmp_path, start_server):
    srv = start_server("--data-dir", tmp_path / "srv")
    ident = identity_of(srv)
    assert ident and re.fullmatch(r"[0-9a-f]{32}", ident)
    assert identity_of(srv) == ident  # the same state, the same identity
    path = tmp_path / "r.pages"
    f = ["--file", path, *BASE]
    assert kvp("put", *f, "--file-size", "1M", "--meta", srv.url(), "K", input=b"kept")[0] == 0
    assert recorded(path) == ident
    local = f"http://localhost:{srv.port}"
    assert kvp("get", *f, "--meta", local, "K")[:2] == (0, b"kept")
    assert kvp("put", *f, "--meta", local, "K2", input=b"two")[0] == 0
    assert kvp("get", *f, "--meta", srv.url(), "K2")[:2] == (0, b"two")
    # another state is still another owner: the file's own data directory
    rc, _, err = kvp("get", *f, "K")
    assert rc == 2 and "the page file belongs to" in err


def test_two_servers_over_one_redis_are_one_owner(tmp_path, start_server):
    import redisfix
    loc = redisfix.fresh_location()
    a, b = start_server("--meta", loc), start_server("--meta", loc)
    # opening a prefix writes nothing: its identity is made with its first namespace
    assert identity_of(a) is None and identity_of(b) is None
    other = start_server("--meta", redisfix.fresh_location())  # another prefix: another state
    path = tmp_path / "r.pages"
    f = ["--file", path, *BASE]
    assert kvp("put", *f, "--file-size", "1M", "--meta", a.url(), "K", input=b"one")[0] == 0
    assert identity_of(a) and identity_of(a) == identity_of(b)
    assert identity_of(other) != identity_of(a)
    assert kvp("get", *f, "--meta", b.url(), "K")[:2] == (0, b"one")
    assert kvp("get", *f, "--meta", loc, "K")[:2] == (0, b"one")  # Redis itself, embedded
    before = open(f"{path}.owner").read()
    rc, _, err = kvp("get", *f, "--meta", other.url(), "K")
    assert rc == 2 and f"belongs to {a.url()}" in err
    assert open(f"{path}.owner").read() == before


def test_another_state_at_the_same_url_is_another_owner(tmp_path, start_server):
    srv = start_server("--data-dir", tmp_path / "a")
    path = tmp_path / "r.pages"
    f = ["--file", path, *BASE, "--meta", srv.url()]
    assert kvp("put", *f, "--file-size", "1M", "K", input=b"of a")[0] == 0
    first = identity_of(srv)
    assert srv.stop() == 0
    # the same port, the same URL, another data directory: another state
    again = subprocess.Popen([require_bin(), "serve", "--listen", f"127.0.0.1:{srv.port}",
                              "--data-dir", tmp_path / "b"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert again.poll() is None, again.stderr.read().decode()
            try:
                second = identity_of(srv)
                break
            except requests.RequestException:
                assert time.monotonic() < deadline, "the second server did not start"
                time.sleep(0.05)
        assert second and second != first
        before = (open(path, "rb").read(), open(f"{path}.owner").read())
        for cmd in (["get", *f, "K"], ["put", *f, "K2"], ["exists", *f, "K"]):
            rc, _, err = kvp(*cmd, input=b"x")
            assert rc == 2, (cmd, err)
            assert f"another state: identity {second}, the record's {first}" in err
        assert (open(path, "rb").read(), open(f"{path}.owner").read()) == before
    finally:
        again.terminate()
        assert again.wait(timeout=60) == 0


def test_recreated_data_directory_is_another_owner(tmp_path):
    """PATH.meta removed and made again is a new state: refused, and the
    refused open removes the directory it made."""
    path = tmp_path / "e.pages"
    f = ["--file", path, *BASE]
    assert kvp("put", *f, "--file-size", "1M", "K", input=b"x")[0] == 0
    ident = recorded(path)
    assert ident and open(f"{path}.meta/IDENTITY").read().strip() == ident
    assert kvp("put", *f, "K2", input=b"y")[0] == 0  # the same state: reopened
    shutil.rmtree(f"{path}.meta")
    rc, _, err = kvp("put", *f, "K3", input=b"z")
    assert rc == 2 and "another state" in err
    assert not os.path.exists(f"{path}.meta")


def test_old_owner_record_without_identity_still_works(tmp_path, start_server):
    srv = start_server("--data-dir", tmp_path / "srv")
    path = tmp_path / "r.pages"
    f = ["--file", path, *BASE]
    assert kvp("put", *f, "--file-size", "1M", "--meta", srv.url(), "K", input=b"old")[0] == 0
    text = open(f"{path}.owner").read()
    old = "".join(line for line in text.splitlines(True) if not line.startswith("identity "))
    assert old != text
    with open(f"{path}.owner", "w") as o:
        o.write(old)
    assert kvp("get", *f, "--meta", srv.url(), "K")[:2] == (0, b"old")
    assert kvp("put", *f, "--meta", srv.url(), "K2", input=b"new")[0] == 0
    assert open(f"{path}.owner").read() == old  # kept as it was
    # compared by its location, as before: another spelling is another owner
    rc, _, err = kvp("get", *f, "--meta", f"http://localhost:{srv.port}", "K")
    assert rc == 2 and f"belongs to {srv.url()}" in err
    # the embedded default, from an older kvpage's record
    p2 = tmp_path / "e.pages"
    assert kvp("put", "--file", p2, *BASE, "--file-size", "1M", "K", input=b"e")[0] == 0
    lines = open(f"{p2}.owner").read().splitlines(True)
    with open(f"{p2}.owner", "w") as o:
        o.write("".join(x for x in lines if not x.startswith("identity ")))
    assert kvp("get", "--file", p2, *BASE, "K")[:2] == (0, b"e")
