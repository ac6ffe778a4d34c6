"""kvpage.Store with a page as several buffers (a list or tuple per key:
kvp_store_putv / getv): round trips with numpy arrays, torch tensors and
bytearrays on every backend the page file has here (psync, io_uring, psync
with mmap reads), the segments laid back to back in the page (read back as
one buffer), pages that fill less than bytes_per_page, zero-length segments,
keys of one buffer and of several in one call, a missing key leaving its
segments untouched, refused calls changing nothing."""
import errno
import os

import numpy as np
import pytest

import kvpage
from kvpage.errors import KvpageValueError

torch = pytest.importorskip("torch")

BPP = 16 * 1024


@pytest.fixture(params=["psync", "uring", "mmap"])
def store(request, tmp_path):
    kw = {"mmap_reads": True} if request.param == "mmap" else {"backend": request.param}
    try:
        s = kvpage.Store(tmp_path / "rank0.pages", 64 * BPP, BPP, **kw)
    except kvpage.KvpageError as e:  # io_uring refused by this kernel
        pytest.skip(f"{request.param}: {e}")
    yield s
    s.close()


def rand(n):
    return np.frombuffer(os.urandom(n), dtype=np.uint8).copy()


def layout(i):
    """Key i's segment lengths: the whole page, or less; zeros among them."""
    return [(5000, 0, 3000, 8384), (100, 200), (BPP,), (1, 1, 16382)][i % 4]


def test_round_trip_lists_of_buffers(store):
    keys = [f"k{i}" for i in range(10)]
    src = [[rand(n) for n in layout(i)] for i in range(10)]
    src[3] = tuple(src[3])  # a tuple does as well
    assert store.put(keys, src) == [kvpage.STORED] * 10
    # into zeroed segments of other kinds: torch tensors, bytearrays
    dst = [[torch.zeros(n, dtype=torch.uint8) if i % 2 else bytearray(n) for n in layout(i)]
           for i in range(10)]
    lead, res = store.get(keys, dst)
    assert lead == 10 and res == [sum(layout(i)) for i in range(10)]
    for s, d in zip(src, dst):
        for a, b in zip(s, d):
            got = b.numpy() if hasattr(b, "numpy") else np.frombuffer(b, np.uint8)
            assert np.array_equal(a, got)
    # the segments lie back to back: one buffer reads them so
    for i, k in enumerate(keys):
        one = np.zeros(sum(layout(i)), np.uint8)
        assert store.get([k], [one]) == (1, [one.nbytes])
        assert np.array_equal(one, np.concatenate(src[i]))


def test_mixed_keys_and_a_plain_page_read_in_pieces(store):
    whole = rand(BPP)
    parts = [rand(4096), rand(4096)]
    assert store.put(["whole", "parts"], [whole, parts]) == [kvpage.STORED] * 2
    a, b = np.zeros(1000, np.uint8), np.zeros(BPP - 1000, np.uint8)
    one = np.zeros(8192, np.uint8)
    assert store.get(["whole", "parts"], [[a, b], one]) == (2, [BPP, 8192])
    assert np.array_equal(np.concatenate([a, b]), whole)
    assert np.array_equal(one, np.concatenate(parts))


def test_missing_key_leaves_its_segments(store):
    store.put(["a"], [[bytearray(b"A" * 100), bytearray(b"B" * 100)]])
    miss = [bytearray(b"?" * 50), bytearray(b"?" * 50)]
    hit = [bytearray(150), bytearray(50)]
    lead, res = store.get(["missing", "a"], [miss, hit])
    assert lead == 0 and res == [-errno.ENOENT, 200]
    assert miss == [bytearray(b"?" * 50)] * 2
    assert bytes(hit[0]) + bytes(hit[1]) == b"A" * 100 + b"B" * 100


def test_refused_calls_change_nothing(store):
    big = [bytearray(BPP), bytearray(1)]  # one byte over the page
    with pytest.raises(KvpageValueError) as e:
        store.put(["ok", "big"], [[bytearray(10)], big])
    assert e.value.code == -errno.EINVAL
    assert store.exists(["ok", "big"]) == (0, [False, False])
    many = [bytearray(1)] * (kvpage.store.MAX_SEGMENTS + 1)
    with pytest.raises(KvpageValueError):
        store.put(["many"], [many])
    with pytest.raises(ValueError, match="read-only"):
        store.get(["ok"], [[bytearray(10), b"x"]])
    with pytest.raises(TypeError):
        store.put(["x"], [[bytearray(10), 42]])
    st = store.stats()
    assert st["keys"] == 0 and st["reserved"] == 0 and st["allocations"] == 0
