"""A full or failing disk under the data directory (protocol-notes: a full or
failing disk).

The real thing: a 4 MiB tmpfs (needs root and mount; skipped otherwise)
filled with a filler file until writes are refused with 507, then emptied
again. And injected faults that need no privileges: faultshim.c, preloaded,
makes the log's writes, zeros, fdatasync, new segments or the snapshot fail
with ENOSPC or EIO while a control file exists.

Every time: a refused change changes nothing, reads go on, /healthz and
/metrics say that writes are refused, writes come back by themselves once
the disk is well again, and after a restart every acknowledged key is there
and `kvpage fsck` is clean.
"""
import errno
import os
import shutil
import subprocess
import time

import pytest

from kvpserver import BIN, launch, finish
from kvptest import Client, expect, invariants, session

_HERE = os.path.dirname(os.path.abspath(__file__))
NUM_PAGES = 1_000_000
WAIT = 60  # seconds: generous, the ASan build on busy cores is slow
ENOSPC_MSG = "No space left on device"


def fsck(data_dir):
    return subprocess.run([BIN, "fsck", str(data_dir)], capture_output=True, text=True,
                          timeout=120)


def big_keys(prefix, start, n, size=200):
    """Keys that are not hex (so the log stores them whole) of about size bytes."""
    return [f"{prefix}-{start + i:08d}-".ljust(size, "x") for i in range(n)]


class Writer:
    """allocate + confirm through the vLLM dialect, remembering what was acknowledged."""

    def __init__(self, srv):
        self.c = srv.client()
        self.acked = {}
        self.n = 0

    def batch(self, n=200, size=200, prefix="k"):
        """One allocate + confirm of n fresh keys: (status, response, keys, pages)."""
        keys = big_keys(prefix, self.n, n, size)
        self.n += n
        r = self.c.post("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in keys]})
        if r.status_code != 200:
            return r.status_code, r, keys, None
        pages = [p for _, p in r.json()["results"]]
        assert all(p >= 0 for p in pages), r.text[:300]
        r = self.c.post("/keys/confirm_write",
                        {"rank": 0, "confirmations": [[k, p] for k, p in zip(keys, pages)]})
        if r.status_code == 204:
            self.acked.update(zip(keys, pages))
        return r.status_code, r, keys, pages

    def until_refused(self, limit=400, **kw):
        for _ in range(limit):
            st, r, keys, pages = self.batch(**kw)
            if st != 204:
                return st, r, keys, pages
        pytest.fail(f"writes were never refused ({limit} batches acknowledged)")

    def until_accepted(self, timeout=WAIT):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            st, r, _, _ = self.batch(n=4, size=40, prefix="again")
            if st == 204:
                return
            last = r
            time.sleep(0.2)
        pytest.fail(f"writes did not resume within {timeout} s: {last.status_code} {last.text[:300]}")


def begin(srv):
    """Rank 0 initialized and one batch acknowledged: (client, writer)."""
    c = srv.client()
    c.v_init(0, NUM_PAGES)
    w = Writer(srv)
    assert w.batch()[0] == 204
    return c, w


def healthz(srv):
    r = session().get(srv.url("/healthz"), timeout=20)
    expect(r, 200)
    return r.text


def wait_healthz(srv, want_ok, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = healthz(srv)
        if (text == "ok") == want_ok:
            return text
        time.sleep(0.1)
    pytest.fail(f"/healthz stayed {text!r}")


def wal_stats(srv):
    return srv.stats()["wal"]


def metric(srv, name):
    r = session().get(srv.url("/metrics"), timeout=20)
    expect(r, 200)
    return [line for line in r.text.splitlines() if line.startswith(name)]


def check_nothing_changed(c, keys, pages=None):
    """The refused keys are nowhere, on both dialects."""
    assert c.v_exists(keys) == [False] * len(keys)
    assert c.v_loc(0, keys) == [None] * len(keys)
    assert c.s_exists(0, keys) == [False] * len(keys)
    assert c.s_get(0, keys) == [None] * len(keys)


def check_reads(c, acked):
    keys = list(acked)[:500]
    assert c.v_loc(0, keys) == [acked[k] for k in keys]
    assert c.v_exists(keys) == [True] * len(keys)
    assert c.s_get(0, keys) == [acked[k] for k in keys]


def check_every_route_refused(c, status, why, acked):
    """Every change route of both dialects refuses with status, and changes nothing."""
    some = list(acked)[:3]
    fresh = big_keys("fresh", 0, 3, 40)
    calls = [
        ("/rank/1/initialize", {"num_pages": 8}),
        ("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in fresh]}),
        ("/keys/confirm_write", {"rank": 0, "confirmations": [[k, NUM_PAGES - 1 - i]
                                                               for i, k in enumerate(fresh)]}),
        ("/keys/delete", {"keys": some}),
        ("/clear", {}),
        ("/ns/other/rank/0/initialize", {"num_pages": 8}),
        ("/1/initialize", {"num_pages": 8}),
        ("/0/reserve_and_allocate_page_indices", {"keys": [[k, ""] for k in fresh]}),
        ("/0/confirm_write", {"written_keys_to_confirm": [[k, NUM_PAGES - 1 - i]
                                                          for i, k in enumerate(fresh)]}),
        ("/0/delete_keys", {"keys": some}),
        ("/0/clear", {}),
    ]
    for path, body in calls:
        r = c.post(path, body)
        assert r.status_code == status, f"{path}: {r.status_code} {r.text[:300]}"
        assert why in r.json()["detail"], f"{path}: {r.text[:300]}"
    check_nothing_changed(c, fresh)
    assert c.v_loc(0, some) == [acked[k] for k in some]
    r = c.post("/keys/get_locations", {"rank": 1, "keys": ["x"]})
    assert r.status_code == 404, r.text  # rank 1 was never initialized
    r = c.post("/ns/other/keys/get_locations", {"rank": 0, "keys": ["x"]})
    assert r.status_code == 404, r.text


def restart_and_check(tmp_path, data, acked, absent=(), flags=()):
    srv = launch(tmp_path, ["--data-dir", data, *flags])
    try:
        c = srv.client()
        keys = list(acked)
        for i in range(0, len(keys), 2000):
            chunk = keys[i:i + 2000]
            assert c.v_loc(0, chunk) == [acked[k] for k in chunk], "an acknowledged key was lost"
        if absent:
            assert c.v_loc(0, list(absent)) == [None] * len(absent)
        invariants(srv.stats())
        assert healthz(srv) == "ok"
    finally:
        finish(srv)
    r = fsck(data)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- a real full disk

@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the tmpfs variant needs root to mount a 4 MiB tmpfs "
                    "(the injected-fault variants below cover the same paths)")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(path):
    """Writes a file until the file system is full."""
    chunk = b"\xa5" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError:
                break
        while True:  # the last few bytes
            try:
                if f.write(b"\xa5" * 512) == 0:
                    break
            except OSError:
                break


def test_full_tmpfs_refuses_with_507_and_recovers(tmp_path, small_fs):
    data = small_fs / "data"
    srv = launch(tmp_path, ["--data-dir", data])
    try:
        c, w = begin(srv)
        filler = small_fs / "filler"
        fill(filler)
        st, r, keys, pages = w.until_refused()
        why = f"cannot write the log in {data}: {ENOSPC_MSG}"
        assert st == 507, r.text
        assert r.json() == {"detail": f"Insufficient storage: {why}; writes are refused until "
                                      "space is freed"}
        check_nothing_changed(c, keys)
        check_reads(c, w.acked)
        assert healthz(srv) == f"degraded: writes refused: {why}"
        assert metric(srv, "kvpage_wal_writable") == ['kvpage_wal_writable{errno="ENOSPC"} 0']
        ws = wal_stats(srv)
        assert ws["writable"] is False and ws["errno"] == "ENOSPC" and ws["refused_writes"] >= 1
        check_every_route_refused(c, 507, why, w.acked)
        assert srv.stderr().count("writes refused:") == 1, srv.stderr()

        filler.unlink()
        w.until_accepted()
        wait_healthz(srv, True)
        assert metric(srv, "kvpage_wal_writable") == ['kvpage_wal_writable{errno=""} 1']
        for _ in range(3):
            assert w.batch()[0] == 204
        check_reads(c, w.acked)
        assert srv.stderr().count("writes resume") == 1, srv.stderr()
    finally:
        finish(srv)
    restart_and_check(tmp_path, data, w.acked, absent=keys)

    # A start on a full disk: reads are served, writes refused until space is freed.
    fill(filler)
    srv = launch(tmp_path, ["--data-dir", data])
    try:
        c = srv.client()
        assert healthz(srv) == f"degraded: writes refused: {why}"
        check_reads(c, w.acked)
        w.c = c  # the same acknowledged keys, through the new server
        st, r, keys2, _ = w.batch()
        assert st == 507, r.text
        check_nothing_changed(c, keys2)
        filler.unlink()
        w.until_accepted()
        wait_healthz(srv, True)
    finally:
        finish(srv)
    restart_and_check(tmp_path, data, w.acked, absent=keys + keys2)


# ---------------------------------------------------------------- injected faults

@pytest.fixture(scope="session")
def shim(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler to build the fault-injection shim")
    out = tmp_path_factory.mktemp("shim") / "faultshim.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out),
                        os.path.join(_HERE, "faultshim.c"), "-ldl"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def faulty(tmp_path, shim, flags=()):
    ctl = tmp_path / "fault.ctl"
    data = tmp_path / "data"
    opts = os.environ.get("ASAN_OPTIONS",
                          "abort_on_error=0:detect_leaks=1:allocator_may_return_null=1")
    env = {"LD_PRELOAD": str(shim), "KVP_FAULT_CTL": str(ctl),
           # the shim comes before the ASan runtime in the preload list
           "ASAN_OPTIONS": opts + ":verify_asan_link_order=0"}
    srv = launch(tmp_path, ["--data-dir", data, *flags], env=env)
    return srv, ctl, data


@pytest.mark.parametrize("point,err,status", [
    ("zero", "ENOSPC", 507),
    ("zero", "EDQUOT", 507),
    ("zero", "EIO", 503),
])
def test_no_room_ahead_refuses_before_any_change(tmp_path, shim, point, err, status):
    """The zeros ahead of the log cannot be written: the change is refused
    before it is made, and the next write after the fault is gone succeeds."""
    srv, ctl, data = faulty(tmp_path, shim)
    try:
        c, w = begin(srv)
        ctl.write_text(f"{point} {err}\n")
        st, r, keys, _ = w.until_refused(size=1000, n=300)
        cause = os.strerror(getattr(errno, err))
        why = f"cannot write the log in {data}: {cause}"
        assert st == status, r.text
        until = "space is freed" if status == 507 else "the log recovers"
        assert r.json() == {"detail": ("Insufficient storage" if status == 507 else
                                       "Service unavailable") +
                            f": {why}; writes are refused until {until}"}
        check_nothing_changed(c, keys)
        check_reads(c, w.acked)
        assert healthz(srv) == f"degraded: writes refused: {why}"
        assert metric(srv, "kvpage_wal_writable") == [f'kvpage_wal_writable{{errno="{err}"}} 0']
        check_every_route_refused(c, status, why, w.acked)
        ctl.unlink()
        wait_healthz(srv, True)  # the background retry, without a write
        w.until_accepted()
        assert w.batch()[0] == 204
        log = srv.stderr()
        assert log.count("writes refused:") == 1 and log.count("writes resume") == 1, log
    finally:
        finish(srv)
    restart_and_check(tmp_path, data, w.acked, absent=keys)


@pytest.mark.parametrize("point,err,status", [
    ("append", "EIO", 503),
    ("append", "ENOSPC", 507),
    ("fdatasync", "EIO", 503),
    ("fdatasync", "ENOSPC", 507),
])
def test_log_write_error_is_not_acknowledged_and_recovers(tmp_path, shim, point, err, status):
    """Writing or syncing the records fails: that change is applied in memory
    but not acknowledged (503 / 507, never 500), later changes are refused
    until a snapshot covers the state, then writes resume by themselves."""
    srv, ctl, data = faulty(tmp_path, shim)
    try:
        c, w = begin(srv)
        ctl.write_text(f"{point} {err}\n")
        st, r, keys, pages = w.batch(n=5)
        assert st == status, r.text
        detail = r.json()["detail"]
        assert f"cannot write the log in {data}" in detail, detail
        assert "not acknowledged" in detail and "retrying it is safe" in detail, detail
        # while the fault lasts: refused, or (after a recovery snapshot) failing again
        for _ in range(3):
            st2, r2, keys2, _ = w.batch(n=2)
            assert st2 in (503, 507), r2.text
        assert metric(srv, "kvpage_wal_refused_writes_total")
        check_reads(c, w.acked)
        ctl.unlink()
        w.until_accepted()
        wait_healthz(srv, True)
        # the unacknowledged change was applied; confirming it again is safe
        r = c.post("/keys/confirm_write",
                   {"rank": 0, "confirmations": [[k, p] for k, p in zip(keys, pages)]})
        expect(r, 204)
        w.acked.update(zip(keys, pages))
        assert w.batch()[0] == 204
        assert "writes resume" in srv.stderr()
    finally:
        finish(srv)
    restart_and_check(tmp_path, data, w.acked)


@pytest.mark.parametrize("point", ["rotate", "snapshot"])
def test_snapshot_without_space_is_retried_and_the_log_goes_on(tmp_path, shim, point):
    """A snapshot (and the new segment it starts) that fails for lack of
    space is reported and tried again later; writes go on meanwhile."""
    srv, ctl, data = faulty(tmp_path, shim, ["--snapshot-bytes", "65536"])
    try:
        c = srv.client()
        c.v_init(0, NUM_PAGES)
        w = Writer(srv)
        ctl.write_text(f"{point} ENOSPC\n")
        deadline = time.monotonic() + WAIT
        while wal_stats(srv)["snapshot_failures"] < 2:
            assert time.monotonic() < deadline, "no snapshot was tried"
            assert w.batch(n=50)[0] == 204
            time.sleep(0.05)
        assert healthz(srv) == "ok"
        assert metric(srv, "kvpage_wal_writable") == ['kvpage_wal_writable{errno=""} 1']
        assert not list(data.glob("snap-*.tmp")), "a failed snapshot left its file"
        done = wal_stats(srv)["snapshots"]
        ctl.unlink()
        deadline = time.monotonic() + WAIT
        while wal_stats(srv)["snapshots"] == done:
            assert time.monotonic() < deadline, "the snapshot was not retried"
            assert w.batch(n=50)[0] == 204
            time.sleep(0.2)
    finally:
        finish(srv)
    restart_and_check(tmp_path, data, w.acked)
