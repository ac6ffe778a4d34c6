"""kvpage.compat.Hf3fsClient called the way the engines call it: groups of
`entries` pages from a thread pool (numjobs clients on one file, and one
client shared by many threads), success meaning a result equal to
bytes_per_page; every rule of check() at its edge with its message, each
followed by a good batch on the same client; close() twice; SGLang's
five-argument construction."""
import concurrent.futures as cf
import os

import numpy as np
import pytest

from kvpage.compat import Hf3fsClient

torch = pytest.importorskip("torch")

BPP = 64 * 1024
ENTRIES = 8
SIZE = 256 * BPP


@pytest.fixture
def client(tmp_path):
    c = Hf3fsClient(str(tmp_path / "hicache.0.bin"), SIZE, BPP, ENTRIES)
    yield c
    c.close()


def pages(n, fill=None):
    if fill is None:
        return [torch.frombuffer(bytearray(os.urandom(BPP)), dtype=torch.uint8) for _ in range(n)]
    return [torch.full((BPP,), fill, dtype=torch.uint8) for _ in range(n)]


def good_batch(c):
    src = pages(2)
    assert c.batch_write([0, BPP], src) == [BPP, BPP]
    dst = pages(2, 0)
    assert c.batch_read([0, BPP], dst) == [BPP, BPP]
    assert all(torch.equal(a, b) for a, b in zip(src, dst))


@pytest.mark.parametrize("offsets,sizes,needle", [
    ([0] * (ENTRIES + 1), [BPP] * (ENTRIES + 1), f"9 operations, more than entries = {ENTRIES}"),
    ([SIZE - BPP + 1], [BPP], f"operation 0: offset {SIZE - BPP + 1} + size {BPP} is outside"),
    ([0, -1], [BPP, BPP], "operation 1: offset -1"),
    ([0, BPP], [BPP, BPP + 1], f"operation 1: size {BPP + 1} exceeds bytes_per_page {BPP}"),
])
def test_check_rules_at_their_edge(client, offsets, sizes, needle):
    tensors = [torch.zeros(s, dtype=torch.uint8) for s in sizes]
    for call in (lambda: client.check(offsets, tensors),
                 lambda: client.batch_read(offsets, tensors),
                 lambda: client.batch_write(offsets, tensors)):
        with pytest.raises(ValueError) as ei:
            call()
        assert str(ei.value).startswith("Hf3fsClient.check Failed")
        good_batch(client)  # still open, still works
    with pytest.raises(ValueError, match=needle.replace("+", r"\+")):
        client.check(offsets, tensors)


def test_edges_that_pass(client):
    # the last page exactly, a full batch, an empty batch (the reference refuses it)
    client.check([SIZE - BPP], [torch.zeros(BPP, dtype=torch.uint8)])
    assert client.batch_write([SIZE - BPP], pages(1)) == [BPP]
    assert client.batch_write([i * BPP for i in range(ENTRIES)], pages(ENTRIES)) == [BPP] * ENTRIES
    assert client.batch_read([], []) == []


def test_mixed_batch_refused_whole(client):
    """any(), not all(): one bad operation refuses the batch; nothing is written."""
    before = pages(1, 7)
    client.batch_write([0], before)
    with pytest.raises(ValueError, match="op(eration)? 1"):
        client.batch_write([0, SIZE], [pages(1, 9)[0], pages(1, 9)[0]])
    out = pages(1, 0)
    client.batch_read([0], out)
    assert torch.equal(out[0], before[0])


def test_non_contiguous_tensor(client):
    t = torch.zeros(256, 256, dtype=torch.uint8).t()
    with pytest.raises(ValueError, match="Hf3fsClient.check Failed.*not contiguous"):
        client.check([0], [t])
    with pytest.raises(ValueError, match="^Hf3fsClient.check Failed: buffer 0 .*non-contiguous"):
        client.batch_write([0], [t])
    with pytest.raises(ValueError, match="^Hf3fsClient.check Failed: buffer 0 .*non-contiguous"):
        client.batch_read([0], [t])
    good_batch(client)


@pytest.mark.parametrize("op", ["batch_read", "batch_write"])
def test_errors_name_the_clients_call(client, op):
    """The engines call batch_read and batch_write: a refused batch says
    which, never kvpage's PageFile.read / PageFile.write underneath."""
    call = getattr(client, op)
    bad = [([0] * (ENTRIES + 1), [np.zeros(16, np.uint8)] * (ENTRIES + 1)),
           ([0], [np.zeros(BPP + 1, np.uint8)]),
           ([0, BPP], [np.zeros(16, np.uint8)]),
           (["x"], [np.zeros(16, np.uint8)]),
           ([0], [np.zeros((64, 64), np.uint8)[:, ::2]]),
           ([0], ["not a buffer"])]
    for offsets, tensors in bad:
        with pytest.raises((ValueError, TypeError)) as ei:
            call(offsets, tensors)
        msg = str(ei.value)
        assert op in msg and "PageFile" not in msg, msg
        if isinstance(ei.value, ValueError):
            assert msg.startswith("Hf3fsClient.check Failed: "), msg
    good_batch(client)


def test_numpy_and_bytearray(client):
    a = np.frombuffer(os.urandom(BPP), dtype=np.uint8).copy()
    assert client.batch_write([2 * BPP], [a]) == [BPP]
    b = bytearray(BPP)
    assert client.batch_read([2 * BPP], [b]) == [BPP]
    assert bytes(b) == a.tobytes()


def test_close_twice_get_size_flush(tmp_path):
    c = Hf3fsClient(str(tmp_path / "f"), SIZE, BPP, ENTRIES, 5)  # SGLang's client_timeout
    assert c.get_size() == SIZE
    c.flush()
    c.close()
    c.close()
    # closed: no exception, 0 bytes for the operation (the engines' contract,
    # test_compat_close.py)
    assert c.batch_read([0], pages(1, 0)) == [0]


def test_cuda_tensor_without_cuda(client):
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    meta = torch.empty(BPP, dtype=torch.uint8, device="meta")
    with pytest.raises((ValueError, RuntimeError, NotImplementedError)):
        client.batch_write([0], [meta])


def engine_io(clients, npages, write, data, numjobs):
    """As SGLang's _batch_set/_batch_get: chunks of `entries` pages, client
    chosen round-robin, run on a pool of numjobs threads; True iff every
    result equals bytes_per_page."""
    offsets = [i * BPP for i in range(npages)]
    chunks = [(i, offsets[i:i + ENTRIES], data[i:i + ENTRIES]) for i in range(0, npages, ENTRIES)]
    with cf.ThreadPoolExecutor(numjobs) as ex:
        futs = [ex.submit(clients[k % len(clients)].batch_write if write
                          else clients[k % len(clients)].batch_read, o, d)
                for k, (_, o, d) in enumerate(chunks)]
        results = [r for f in futs for r in f.result()]
    return [r == BPP for r in results]


@pytest.mark.parametrize("nclients", [1, 4])
def test_engine_style_thread_pool(tmp_path, nclients):
    path = str(tmp_path / "hicache.0.bin")
    clients = [Hf3fsClient(path, SIZE, BPP, ENTRIES) for _ in range(nclients)]
    src = pages(128)
    assert all(engine_io(clients, 128, True, src, 16))
    dst = pages(128, 0)
    assert all(engine_io(clients, 128, False, dst, 16))
    assert all(torch.equal(a, b) for a, b in zip(src, dst))
    for c in clients:
        c.close()


def test_mmap_reads_from_the_environment(tmp_path, monkeypatch):
    """Engines construct the client themselves: KVPAGE_MMAP_READS turns it on."""
    monkeypatch.setenv("KVPAGE_MMAP_READS", "1")
    c = Hf3fsClient(str(tmp_path / "hicache.0.bin"), SIZE, BPP, ENTRIES)
    assert c._pf.mmap_reads
    good_batch(c)
    c.close()
    monkeypatch.delenv("KVPAGE_MMAP_READS")
    c = Hf3fsClient(str(tmp_path / "hicache.0.bin"), SIZE, BPP, ENTRIES, mmap_reads=True)
    assert c._pf.mmap_reads
    c.close()
    c = Hf3fsClient(str(tmp_path / "hicache.0.bin"), SIZE, BPP, ENTRIES)
    assert not c._pf.mmap_reads
    c.close()
