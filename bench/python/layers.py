#!/usr/bin/python3
"""Where the Python side's cost of a page-file read goes: five sides taking
turns in one process on one handle, pool and set of batches (those of
compat_bench.py), each as GB/s and as a fraction of the C loop:

  C        bench_io's caller loop in C (cloop.c's kvpb_loop)
  raw      the ctypes call alone, the ops of every batch built beforehand
  build    the ops built per batch by kvpage._buffers.fast_words, then the call
  pf.read  kvpage.PageFile.read
  compat   kvpage.compat.Hf3fsClient.batch_read and the engines' check of
           the results (one list.count)

usage: KVPB_CLOOP=cloop.so layers.py FILE BPP [MMAP_READS(0|1)] [ROUNDS]
(cloop.so as bench/python/run.sh builds it; FILE in the page cache.)
"""
import ctypes
import os
import statistics
import sys
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_bench import make_pool, make_table  # noqa: E402

from kvpage import _lib  # noqa: E402
from kvpage._buffers import fast_words  # noqa: E402
from kvpage.compat import Hf3fsClient  # noqa: E402


def make_steps(client, table, batch, bpp, tensors):
    """One read of batch i of table (compat_bench's) by each layer, as
    functions of i: raw, touch, build, pf.read, compat (see the docstring
    here and gaps.py's)."""
    prebuilt = [fast_words("q", bufs, offs)[0] for offs, bufs in table]
    addrs = [w.buffer_info()[0] for w in prebuilt]
    out = array("q", [0] * (batch + 64))
    res = out.buffer_info()[0]
    h, fn, rd, crd = client._pf._h, _lib.pagefile_read, client._pf.read, client.batch_read

    def raw(i, _keep=(prebuilt, out)):
        fn(h, addrs[i], batch, res, res + 8 * batch)

    def touch(i):
        bufs = table[i][1]
        if tensors:
            [b.data_ptr() for b in bufs]
        else:
            [b.nbytes for b in bufs]
        raw(i)

    def build(i):
        offs, bufs = table[i]
        w, _ = fast_words("q", bufs, offs)
        fn(h, w.buffer_info()[0], batch, res, res + 8 * batch)

    def pfread(i):
        rd(*table[i])

    def compat(i):
        crd(*table[i]).count(bpp)

    return {"raw": raw, "touch": touch, "build": build, "pf.read": pfread, "compat": compat}


def main():
    path, bpp = sys.argv[1], int(sys.argv[2])
    mmap_reads = len(sys.argv) > 3 and sys.argv[3] == "1"
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    size, batch, pool_bytes = os.stat(path).st_size, 8, 1 << 30
    client = Hf3fsClient(path, size, bpp, batch, mmap_reads=mmap_reads)
    _, pool = make_pool(pool_bytes)
    table = make_table(0, pool, bpp, pool_bytes // bpp, size // bpp, batch)
    steps = make_steps(client, table, batch, bpp, False)
    loop = ctypes.CDLL(os.environ["KVPB_CLOOP"]).kvpb_loop
    loop.restype = ctypes.c_int64
    loop.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64,
                     ctypes.c_uint64, ctypes.c_int, ctypes.c_double,
                     ctypes.POINTER(ctypes.c_uint64)]
    base = ctypes.addressof(ctypes.c_char.from_buffer(pool))
    seed = ctypes.c_uint64(5)

    def timed(step):
        def side(secs):
            i, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < secs:
                for _ in range(64):
                    step(i & 4095)
                    i += 1
            return i * batch * bpp / (time.perf_counter() - t0) / 1e9
        return side

    def c_loop(secs):
        n = loop(client._pf._h, 0, base, pool_bytes, bpp, batch, secs, ctypes.byref(seed))
        return n * batch * bpp / secs / 1e9

    sides = [("C", c_loop)] + [(k, timed(steps[k])) for k in ("raw", "build", "pf.read", "compat")]
    got = {name: [] for name, _ in sides}
    for r in range(rounds + 1):  # round 0: warm-up
        for name, side in sides[r % 5:] + sides[:r % 5]:
            v = side(0.5)
            if r:
                got[name].append(v)
    c = statistics.median(got["C"])
    for name, _ in sides:
        m = statistics.median(got[name])
        print(f"{name:8s} {m:6.2f} GB/s  {m / c:.3f} of C")
    client.close()


if __name__ == "__main__":
    main()
