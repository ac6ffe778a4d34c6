"""kvpage.compat.Hf3fsClient against what the engines' own tests ask of
their clients (read, not run: the engines are not installable here):

- vLLM tests/v1/kv_connector/unit/test_hf3fs_client.py
  @ 11d166d246f56ae82823df6fac3e134b64367bc0: close() idempotent (three
  calls, `_closed` set); flush() after close() does nothing (no fsync); a
  constructor that fails leaves no file descriptor open.
- vLLM tests/v1/kv_connector/unit/test_hf3fs_connector.py
  @ 0c14331e0c3f2115e45c2c1c8a15d4843b73aaaa (TestHf3fsMockClient): the
  constructor creates the file at its size; float32/float16/bfloat16 round
  trips answer bytes_per_page per operation; several tensors in one batch;
  flush() and close() do not raise.
- SGLang's hf3fs client (python/sglang/srt/mem_cache/storage/hf3fs/, per
  issue 35): after close() every operation answers 0, never an exception.

And the rest of the contract: a batch running when close() comes answers
its real results or 0s, never an exception; a write after close() writes
nothing."""
import os
import threading

import pytest

from kvpage.compat import Hf3fsClient

torch = pytest.importorskip("torch")

BPP = 4096
ENTRIES = 8
SIZE = 16 * BPP


def page(v):
    return torch.full((BPP,), v, dtype=torch.uint8)


def open_fds():
    return sorted(os.listdir("/proc/self/fd"))


def test_close_is_idempotent_and_flush_after_it_does_nothing(tmp_path):
    c = Hf3fsClient(str(tmp_path / "f"), SIZE, BPP, ENTRIES)
    assert c._closed is False
    calls = []
    real_flush = c._pf.flush
    c._pf.flush = lambda: (calls.append(1), real_flush())
    c.flush()
    assert calls == [1]
    c.close()
    c.close()
    c.close()
    assert c._closed is True and c._pf.closed
    c.flush()  # neither an fsync nor an exception
    assert calls == [1]


def test_batches_after_close_answer_zero_and_move_nothing(tmp_path):
    path = str(tmp_path / "f")
    c = Hf3fsClient(path, SIZE, BPP, ENTRIES)
    assert c.batch_write([0, BPP], [page(1), page(2)]) == [BPP, BPP]
    c.close()
    dst = [torch.zeros(BPP, dtype=torch.uint8) for _ in range(2)]
    assert c.batch_read([0, BPP], dst) == [0, 0]
    assert all(int(d.count_nonzero()) == 0 for d in dst)  # nothing read into them
    assert c.batch_write([0, 2 * BPP], [page(9), page(9)], None) == [0, 0]
    assert c.batch_write([0], [page(9)]) == [0]
    # batches a live client refuses (more than entries, outside the file) still answer 0s
    assert c.batch_read([0] * (ENTRIES + 1), [page(0)] * (ENTRIES + 1)) == [0] * (ENTRIES + 1)
    assert c.batch_write([SIZE], [page(3)]) == [0]
    assert c.batch_read([], []) == []
    with open(path, "rb") as f:  # the writes after close wrote nothing
        data = f.read(3 * BPP)
    assert data == bytes([1]) * BPP + bytes([2]) * BPP + bytes(BPP)


def test_a_live_client_still_refuses_a_bad_batch(tmp_path):
    c = Hf3fsClient(str(tmp_path / "f"), SIZE, BPP, ENTRIES)
    try:
        with pytest.raises(ValueError, match="Hf3fsClient.check Failed"):
            c.batch_read([SIZE], [page(0)])
        assert c.batch_read([0], [page(0)]) == [BPP]  # and stays open
    finally:
        c.close()


def test_batches_racing_close_never_raise(tmp_path):
    """Readers and writers run while the client closes under them: each
    result is the full page or 0, never an exception; afterwards only 0s."""
    c = Hf3fsClient(str(tmp_path / "f"), SIZE, BPP, ENTRIES)
    results, errors = [], []
    started = threading.Barrier(5)

    def run(i):
        started.wait()
        buf = [torch.zeros(BPP, dtype=torch.uint8) for _ in range(4)]
        try:
            while True:
                if i % 2:
                    r = c.batch_write([j * BPP for j in range(4)], [page(i)] * 4)
                else:
                    r = c.batch_read([j * BPP for j in range(4)], buf)
                results.append(r)
                if r == [0] * 4 and c._closed:
                    return
        except Exception as e:  # noqa: BLE001 - the test is that nothing gets here
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait()
    c.close()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert all(r in ([BPP] * 4, [0] * 4) for r in results), \
        {tuple(r) for r in results} - {(BPP,) * 4, (0,) * 4}
    assert results[-1] == [0] * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_of_each_dtype(tmp_path, dtype):
    path = str(tmp_path / "f")
    c = Hf3fsClient(path, 8 * BPP, BPP, 4)
    assert os.path.getsize(path) == 8 * BPP
    n = BPP // torch.tensor([], dtype=dtype).element_size()
    src = [torch.arange(n, dtype=dtype) + k for k in range(3)]
    assert c.batch_write([k * BPP for k in range(3)], src, None) == [BPP] * 3
    dst = [torch.zeros(n, dtype=dtype) for _ in range(3)]
    assert c.batch_read([k * BPP for k in range(3)], dst) == [BPP] * 3
    assert all(torch.equal(a, b) for a, b in zip(src, dst))
    c.flush()
    c.close()


@pytest.mark.parametrize("how", ["directory", "owner"])
def test_a_failed_constructor_leaves_no_descriptor(tmp_path, how):
    before = open_fds()
    if how == "directory":  # the path is a directory: the page file cannot be opened
        os.mkdir(tmp_path / "d")
        args, kw = (str(tmp_path / "d"), SIZE, BPP, ENTRIES), {}
    else:  # the file belongs to another metadata owner
        Hf3fsClient(str(tmp_path / "f"), SIZE, BPP, ENTRIES,
                    owner={"location": "http://127.0.0.1:1"}).close()
        before = open_fds()
        args, kw = (str(tmp_path / "f"), SIZE, BPP, ENTRIES), {"owner": {"location": "http://127.0.0.1:2"}}
    with pytest.raises(Exception):
        Hf3fsClient(*args, **kw)
    assert open_fds() == before
