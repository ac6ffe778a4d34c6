"""kvpage.Store from Python, embedded, on a real kvpage serve and on Redis: put/get
round trips with numpy, bytearrays and CPU torch tensors, hits not rewritten,
a missing key leaving its buffer untouched, exists, delete, clear, stats,
errors as exceptions, reopen, threads; a page put from Python through
kvpage get and kvpage put into another store."""
import errno
import os
import threading

import numpy as np
import pytest

import kvpage

torch = pytest.importorskip("torch")

BPP = 16 * 1024


@pytest.fixture(params=["embedded", "remote", "redis"])
def store(request, tmp_path):
    meta = None
    if request.param == "remote":
        srv = request.getfixturevalue("start_server")("--data-dir", str(tmp_path / "srv"))
        meta = srv.url()
    elif request.param == "redis":  # the metadata in Redis (redis-server on a free port)
        import redisfix
        meta = redisfix.fresh_location()
    s = kvpage.Store(tmp_path / "rank0.pages", 64 * BPP, BPP, meta=meta)
    yield s
    s.close()


def test_put_get(store):
    keys = [f"k{i}" for i in range(20)]
    src = [np.frombuffer(os.urandom(BPP), dtype=np.uint8) for _ in keys]
    assert store.put(keys, src) == [kvpage.STORED] * 20
    dst = [torch.zeros(BPP, dtype=torch.uint8) for _ in keys]
    lead, res = store.get(keys, dst)
    assert lead == 20 and res == [BPP] * 20
    for a, b in zip(src, dst):
        assert (a == b.numpy()).all()
    # hits are not rewritten
    assert store.put(keys[:5] + ["new"], src[:6]) == [kvpage.ALREADY] * 5 + [kvpage.STORED]
    st = store.stats()
    assert st["stored"] == 21 and st["already"] == 5 and st["held"] == 21 and st["reserved"] == 0


def test_missing_key_leaves_buffer(store):
    store.put(["a", "b", "d"], [bytearray(b"A" * BPP), bytearray(b"B" * BPP), bytearray(b"D" * BPP)])
    bufs = [bytearray(b"?" * BPP) for _ in range(4)]
    lead, res = store.get(["a", "b", "c", "d"], bufs)
    assert lead == 2 and res[2] == -2 and res[3] == BPP  # -ENOENT
    assert bufs[2] == bytearray(b"?" * BPP) and bufs[3] == bytearray(b"D" * BPP)
    assert store.exists(["a", "b", "c", "d"]) == (2, [True, True, False, True])


def test_delete_clear(store):
    store.put(["x", "y"], [bytearray(BPP), bytearray(BPP)])
    store.delete(["x", "unknown"])
    assert store.exists(["x", "y"]) == (0, [False, True])
    store.clear()
    assert store.exists(["y"]) == (0, [False])
    assert store.stats()["free"] == 64


def test_errors(store):
    with pytest.raises(kvpage.KvpageValueError) as ei:
        store.put(["ok", "bad\0key"], [bytearray(BPP), bytearray(BPP)])
    assert ei.value.rule == "key" and ei.value.index == 1 and "NUL" in str(ei.value)
    with pytest.raises(kvpage.KvpageValueError, match="over the page size"):
        store.put(["big"], [bytearray(BPP + 1)])
    with pytest.raises(TypeError, match="list of keys"):
        store.put("k", [bytearray(BPP)])
    with pytest.raises(kvpage.KvpageValueError, match="2 keys but 1 buffers"):
        store.get(["a", "b"], [bytearray(BPP)])
    assert store.stats()["allocations"] == 0  # nothing changed


def test_open_errors(tmp_path):
    with pytest.raises(kvpage.KvpageValueError, match="bytes_per_page"):
        kvpage.Store(tmp_path / "f", 1 << 20, 0)
    with kvpage.Store(tmp_path / "f", 1 << 20, BPP) as s:
        s.put(["k"], [bytearray(1)])
    with pytest.raises(kvpage.KvpageError) as ei:  # the data directory holds 64 pages' data
        kvpage.Store(tmp_path / "f", 1 << 20, BPP // 2)
    assert ei.value.errno == 17 and "64 pages" in str(ei.value)  # EEXIST


def test_reopen_finds_keys(tmp_path):
    with kvpage.Store(tmp_path / "f", 1 << 20, BPP) as s:
        s.put(["persist"], [bytearray(b"p" * BPP)])
    with kvpage.Store(tmp_path / "f", 1 << 20, BPP) as s:
        buf = bytearray(BPP)
        assert s.get(["persist"], [buf]) == (1, [BPP]) and buf == bytearray(b"p" * BPP)


def test_tp2_on_one_server(tmp_path, start_server):
    srv = start_server("--data-dir", str(tmp_path / "srv"))
    r0 = kvpage.Store(tmp_path / "r0", 16 * BPP, BPP, rank=0, meta=srv.url() + "/ns/tp2")
    r1 = kvpage.Store(tmp_path / "r1", 16 * BPP, BPP, rank=1, meta=srv.url() + "/ns/tp2")
    r0.put(["k"], [bytearray(BPP)])
    assert r0.exists(["k"]) == (0, [False]) and r1.exists(["k"]) == (0, [False])
    r1.put(["k"], [bytearray(BPP)])
    assert r0.exists(["k"]) == (1, [True]) and r1.exists(["k"]) == (1, [True])
    r0.close(), r1.close()


def test_threads_share_one_store(store):
    errors = []

    def work(t):
        keys = [f"t{t}-{i}" for i in range(6)]
        data = [bytearray(os.urandom(BPP)) for _ in keys]
        for _ in range(5):
            res = store.put(keys, data)
            if any(r < 0 for r in res):
                errors.append(res)
            out = [bytearray(BPP) for _ in keys]
            lead, _ = store.get(keys, out)
            if lead != 6 or out != data:
                errors.append(f"thread {t}: lead {lead}")

    th = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    [t.start() for t in th]
    [t.join() for t in th]
    assert errors == []
    st = store.stats()
    assert st["held"] == 48 and st["reserved"] == 0


def test_close_twice(tmp_path):
    s = kvpage.Store(tmp_path / "f", 1 << 20, BPP, meta="mem:")
    s.close()
    s.close()
    with pytest.raises(kvpage.KvpageError, match="closed"):
        s.exists(["k"])


def test_mmap_reads(tmp_path, monkeypatch):
    monkeypatch.delenv("KVPAGE_MMAP_READS", raising=False)
    with kvpage.Store(tmp_path / "r.pages", 64 * BPP, BPP) as s:
        assert not s.mmap_reads
    with kvpage.Store(tmp_path / "r.pages", 64 * BPP, BPP, mmap_reads=True) as s:
        assert s.mmap_reads
        keys = [f"m{i}" for i in range(10)]
        src = [np.frombuffer(os.urandom(BPP), dtype=np.uint8) for _ in keys]
        assert s.put(keys, src) == [kvpage.STORED] * 10
        dst = [np.zeros(BPP, dtype=np.uint8) for _ in keys]
        assert s.get(keys, dst) == (10, [BPP] * 10)
        assert all((a == b).all() for a, b in zip(src, dst))


def test_engine_page_through_the_command_line_unchanged(tmp_path):
    """A whole page put from Python (as an engine writes pages) comes back
    whole from `kvpage get`, and `kvpage put` of that into another store keeps
    it as it is (an input of exactly one page is stored raw)."""
    import subprocess
    from kvpserver import require_bin
    page = os.urandom(BPP)
    with kvpage.Store(tmp_path / "a.pages", 64 * BPP, BPP) as s:
        assert s.put(["k"], [bytearray(page)]) == [kvpage.STORED]
    flags = ["--page-size", str(BPP), "k"]
    got = subprocess.run([require_bin(), "get", "--file", str(tmp_path / "a.pages"), *flags],
                         capture_output=True, check=True, timeout=60).stdout
    assert got == page
    p = subprocess.run([require_bin(), "put", "--file", str(tmp_path / "b.pages"), "--file-size",
                        str(64 * BPP), *flags], input=got, capture_output=True, timeout=60)
    assert (p.returncode, p.stderr) == (0, b"")
    out = bytearray(BPP)
    with kvpage.Store(tmp_path / "b.pages", 64 * BPP, BPP) as s:
        assert s.get(["k"], [out]) == (1, [BPP])
    assert bytes(out) == page


def test_host_port_is_not_a_directory(tmp_path, monkeypatch):
    """meta="HOST:PORT" is refused by the library's rule (the CLI's too),
    naming the URL meant, and creates nothing; an existing directory of that
    name and file:HOST:PORT are directories."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(kvpage.KvpageValueError, match=r"did you mean http://127\.0\.0\.1:18504\?"):
        kvpage.Store("f", 1 << 20, BPP, meta="127.0.0.1:18504")
    with pytest.raises(kvpage.KvpageValueError, match="did you mean http://localhost:18000"):
        kvpage.store.claim("f", "localhost:18000")
    assert os.listdir(tmp_path) == []
    with kvpage.Store("f", 1 << 20, BPP, meta="file:127.0.0.1:18504") as s:
        assert s.put(["k"], [bytearray(BPP)]) == [kvpage.STORED]
    assert (tmp_path / "127.0.0.1:18504").is_dir()
    with kvpage.Store("f", 1 << 20, BPP, meta="127.0.0.1:18504") as s:  # now a directory
        assert s.exists(["k"]) == (1, [True])


def _files(d):
    """{path: (bytes, mtime_ns, mode, uid)} of every file under d."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode, p.stat().st_uid)
            for p in d.rglob("*") if p.is_file()}


def test_readonly_store_writes_nothing(tmp_path):
    """Store(readonly=True) reads what a writer put and writes nothing; two
    readers share the data directory, and a writer is kept out meanwhile."""
    path = tmp_path / "rank0.pages"
    with kvpage.Store(path, 8 * BPP, BPP) as w:
        assert w.put(["a"], [np.full(BPP, 7, dtype=np.uint8)]) == [kvpage.STORED]
    before = _files(tmp_path)
    r1 = kvpage.Store(path, 0, BPP, readonly=True)
    r2 = kvpage.Store(path, 0, BPP, readonly=True)
    try:
        dst = np.zeros(BPP, dtype=np.uint8)
        assert r1.get(["a", "b"], [dst, np.zeros(BPP, dtype=np.uint8)])[0] == 1
        assert (dst == 7).all()
        assert r2.exists(["a", "b"]) == (1, [True, False])
        with pytest.raises(kvpage.KvpageError) as e:
            r1.put(["b"], [dst])
        assert e.value.errno == errno.EROFS
        with pytest.raises(kvpage.KvpageError) as e:
            r1.delete(["a"])
        assert e.value.errno == errno.EROFS
        with pytest.raises(kvpage.KvpageError) as e:
            kvpage.Store(path, 8 * BPP, BPP)
        assert e.value.errno == errno.EBUSY
    finally:
        r1.close(), r2.close()
    assert _files(tmp_path) == before
    with pytest.raises(kvpage.KvpageError) as e:
        kvpage.Store(tmp_path / "none.pages", 8 * BPP, BPP, readonly=True)
    assert e.value.errno == errno.ENOENT
    assert _files(tmp_path) == before
