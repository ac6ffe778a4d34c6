"""The USRBIO backend from Python, over tests/usrbio_emu (a stand-in for
3FS's library, built beside libkvpage; it aborts the process on any breach
of the USRBIO header's contract): PageFile, Store and compat.Hf3fsClient
pick it on the emulated 3FS mount, alloc()/alloc_host() memory moves without
a copy, and off the mount nothing changes. Not 3FS itself: see the README."""
import os
import subprocess
import sys

import numpy as np
import pytest

import kvpage
from kvpage import compat
from kvpage.errors import KvpageError

from conftest import usrbio_lib

PAGE = 64 * 1024


@pytest.fixture
def mount(tmp_path, monkeypatch):
    """tmp_path as an emulated 3FS mount."""
    monkeypatch.setenv("KVPAGE_USRBIO_LIB", usrbio_lib())
    monkeypatch.setenv("KVPAGE_USRBIO_EMU_MOUNT", str(tmp_path))
    monkeypatch.setenv("KVPAGE_USRBIO_EMU_REG_RESULT", "dup")
    monkeypatch.delenv("KVPAGE_USRBIO", raising=False)
    return tmp_path


def pattern(i, n=PAGE):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + i).astype(np.uint8)


def test_pagefile_picks_usrbio_on_the_mount(mount, tmp_path_factory):
    with kvpage.PageFile(mount / "pf", 16 * PAGE, PAGE) as pf:
        assert pf.backend() == pf.backend(True) == "usrbio"
        assert "usrbio wants this file" in pf.backend_note
        bufs = [pattern(i) for i in range(8)]
        assert pf.write([i * PAGE for i in range(8)], bufs) == [PAGE] * 8
        back = [np.zeros(PAGE, np.uint8) for _ in range(8)]
        assert pf.read([i * PAGE for i in range(8)], back) == [PAGE] * 8
        assert all((a == b).all() for a, b in zip(bufs, back))
    # the bytes are in the file, read by another backend
    with kvpage.PageFile(mount / "pf", 16 * PAGE, PAGE, backend="psync") as pf:
        b = np.zeros(PAGE, np.uint8)
        assert pf.read([3 * PAGE], [b]) == [PAGE] and (b == pattern(3)).all()
    # off the mount, and with KVPAGE_USRBIO=0, auto is what it always was
    off = tmp_path_factory.mktemp("off3fs")
    with kvpage.PageFile(off / "pf", 16 * PAGE, PAGE) as pf:
        assert pf.backend(True) == "psync"
    os.environ["KVPAGE_USRBIO"] = "0"
    with kvpage.PageFile(mount / "pf0", 16 * PAGE, PAGE) as pf:
        assert pf.backend(True) == "psync"
    # asked for off the mount: a clear error, no file
    with pytest.raises(KvpageError, match="is not on a 3FS mount") as e:
        kvpage.PageFile(off / "no", 16 * PAGE, PAGE, backend="usrbio")
    assert e.value.rule == "io" and not (off / "no").exists()
    with pytest.raises(ValueError, match="backend 'fuse' is not one of"):
        kvpage.PageFile(mount / "no", 16 * PAGE, PAGE, backend="fuse")


def test_alloc_moves_pages_without_a_copy(mount):
    with kvpage.PageFile(mount / "zc", 16 * PAGE, PAGE, backend="usrbio") as pf:
        mv = pf.alloc(8 * PAGE)
        assert len(mv) == 8 * PAGE and not mv.readonly and mv[0] == 0
        pool = np.frombuffer(mv, np.uint8)
        for i in range(8):
            pool[i * PAGE:(i + 1) * PAGE] = pattern(i)
        views = [pool[i * PAGE:(i + 1) * PAGE] for i in range(8)]
        assert pf.write([(7 - i) * PAGE for i in range(8)], views) == [PAGE] * 8
        want = pool.copy()
        pool[:] = 0
        assert pf.read([(7 - i) * PAGE for i in range(8)], views) == [PAGE] * 8
        assert (pool == want).all()
        # a second allocation: both registered, both usable
        mv2 = pf.alloc(PAGE)
        two = np.frombuffer(mv2, np.uint8)
        assert pf.read([0], [two]) == [PAGE] and (two == pattern(7)).all()
        del pool, views, two
        mv.release()
        mv2.release()
    with pytest.raises(KvpageError, match="closed"):
        pf.alloc(PAGE)


def test_store_on_the_mount(mount):
    with kvpage.Store(mount / "st", 64 * PAGE, PAGE) as s:
        assert s.backend == "usrbio"
        bufs = [pattern(i) for i in range(20)]
        keys = [f"k{i}" for i in range(20)]
        assert s.put(keys, bufs) == [kvpage.STORED] * 20
        back = [np.zeros(PAGE, np.uint8) for _ in range(20)]
        assert s.get(keys, back) == (20, [PAGE] * 20)
        assert all((a == b).all() for a, b in zip(bufs, back))
    with kvpage.Store(mount / "st2", 64 * PAGE, PAGE, backend="psync") as s:
        assert s.backend == "psync"


def test_hf3fs_client_on_the_mount(mount):
    torch = pytest.importorskip("torch")
    c = compat.Hf3fsClient(str(mount / "rank0" / "kv"), 16 * PAGE, PAGE, 8)
    try:
        assert c.backend == "usrbio"
        pool = c.alloc_host(8 * PAGE)  # the engine's host pool: 3FS's memory
        assert pool.dtype == torch.uint8 and pool.numel() == 8 * PAGE
        pages = [pool[i * PAGE:(i + 1) * PAGE] for i in range(8)]
        for i, p in enumerate(pages):
            p.copy_(torch.from_numpy(pattern(i)))
        assert c.batch_write([i * PAGE for i in range(8)], pages) == [PAGE] * 8
        want = pool.clone()
        pool.zero_()
        assert c.batch_read([i * PAGE for i in range(8)], pages) == [PAGE] * 8
        assert torch.equal(pool, want)
        # ordinary tensors are staged, as before
        t = torch.zeros(PAGE, dtype=torch.uint8)
        assert c.batch_read([5 * PAGE], [t]) == [PAGE] and torch.equal(t, want[5 * PAGE:6 * PAGE])
        with pytest.raises(ValueError, match="Hf3fsClient.check Failed"):
            c.batch_read([15 * PAGE + 1], [t])
        assert c.batch_read([0], [t]) == [PAGE]  # still open
    finally:
        c.close()


def test_without_the_library_names_what_it_tried(tmp_path):
    """In a fresh process: once loaded, the library stays loaded."""
    env = dict(os.environ, KVPAGE_USRBIO_LIB="/nonexistent/libhf3fs_api_shared.so",
               KVPAGE_USRBIO_EMU_MOUNT=str(tmp_path),
               PYTHONPATH=os.path.dirname(os.path.dirname(kvpage.__file__)))
    code = ("import kvpage, sys\n"
            "try:\n"
            "    kvpage.PageFile(sys.argv[1], 1 << 20, 65536, backend='usrbio')\n"
            "except kvpage.KvpageError as e:\n"
            "    print(e)\n"
            "print(kvpage.PageFile(sys.argv[1], 1 << 20, 65536).backend(True))\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "USRBIO is unavailable (cannot load KVPAGE_USRBIO_LIB=/nonexistent/" in lines[0]
    assert lines[1] == "psync"  # auto without the library: as without 3FS
