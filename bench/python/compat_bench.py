#!/usr/bin/python3
"""kvpage.compat.Hf3fsClient from Python, on the workload of bench/io's
bench_io and py_baseline.py: random batches of `batch` pages between random
slots of a host pool (1 GiB per caller, so copies land in cold memory) and
random pages of the file. CALLERS threads share one client, each with its own
pool (as bench_io --callers).

usage: compat_bench.py FILE BPP read|write SECONDS CALLERS [POOL_BYTES] [BATCH] [WARMUP]
Prints one line of key=value pairs like bench_io.

With KVPB_CLOOP=PATH (bench/python/cloop.c built as a shared object) three
sides take turns in this process: the Python client, bench_io's C loop (on
the same handle and pools), and the plain 16-thread os.preadv/os.pwritev pool
of bench/io/py_baseline.py (driven by one thread, on caller 0's pool, the
same batches). ROUNDS (KVPB_ROUNDS, default 10) rounds of SECONDS/ROUNDS on
each side, which side goes first rotating; the first round is warm-up. The
line then has gbps (Python), c_gbps (C), pool_gbps (the pool), ratio
(Python / C) and pool_ratio (Python / the pool).

With KVPB_TENSORS=torch the client gets CPU torch tensors over the pools'
memory (what the engines pass: slices of their host pool) instead of numpy
views; the C loop and the plain pool move the same bytes of the same slots.
"""
import concurrent.futures
import ctypes
import mmap
import os
import random
import sys
import threading
import time

import numpy as np

from kvpage.compat import Hf3fsClient

TENSORS = os.environ.get("KVPB_TENSORS", "numpy") == "torch"


def make_pool(pool_bytes):
    # Private, as bench_io's posix_memalign pool: a shared anonymous mapping is
    # shmem, which gets no transparent huge pages (shmem_enabled=never here).
    m = mmap.mmap(-1, pool_bytes, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, dtype=np.uint8)
    # Distinct content in every 4 KiB page, as bench_io writes its pool:
    # pages of one value could be merged by same-page merging (KSM, in
    # the guest or its host), and a read into a merged page faults.
    w = a.view(np.uint64)
    w[:] = np.arange(w.size, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return m, a


def make_table(c, pool, bpp, slots, pages, batch, tensors=False):
    # The random batches are drawn before timing (an engine has its offsets
    # and pages at hand; random.sample costs 5-10 us a batch, bench_io's
    # generator nothing): 4096 batches cycled. tensors: the slots are CPU
    # torch tensors over the same memory, as the engines' host pools.
    rng = random.Random(12345 + c)
    if tensors:
        import torch
        pool = torch.from_numpy(pool)
    views = [pool[s * bpp:(s + 1) * bpp] for s in range(slots)]
    table = []
    for _ in range(4096):
        chosen = rng.sample(range(slots), batch)
        table.append(([rng.randrange(pages) * bpp for _ in range(batch)],
                      [views[s] for s in chosen]))
    return table


def main():
    path, bpp, rw = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    seconds, callers = float(sys.argv[4]), int(sys.argv[5])
    pool_bytes = int(sys.argv[6]) if len(sys.argv) > 6 else 1 << 30
    batch = int(sys.argv[7]) if len(sys.argv) > 7 else 8
    warmup = float(sys.argv[8]) if len(sys.argv) > 8 else 1.0
    cloop = os.environ.get("KVPB_CLOOP")
    rounds = int(os.environ.get("KVPB_ROUNDS", "10"))
    size = os.stat(path).st_size
    client = Hf3fsClient(path, size, bpp, batch)
    pages, slots = size // bpp, pool_bytes // bpp
    write = rw == "write"
    pools = [make_pool(pool_bytes) for _ in range(callers)]
    if cloop:
        loop = ctypes.CDLL(cloop).kvpb_loop
        loop.restype = ctypes.c_int64
        loop.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64,
                         ctypes.c_uint64, ctypes.c_int, ctypes.c_double,
                         ctypes.POINTER(ctypes.c_uint64)]
    start = threading.Barrier(callers + 1)
    finish = threading.Barrier(callers + 1)
    phase = ["py"]     # what the callers do next: "py", "c" or "end"
    running = [True]   # a list item, not an Event: is_set() is a Python call a batch
    done = {"py": [0] * callers, "c": [0] * callers, "pool": [0] * callers}  # batches per caller and side
    errors = []
    turn = seconds / rounds if cloop else 0.0

    def caller(c):
        pool = pools[c][1]
        table = make_table(c, pool, bpp, slots, pages, batch, TENSORS)
        # os.preadv takes buffers, not tensors: the pool's side has the same
        # batches as numpy views of the same memory.
        pool_table = make_table(c, pool, bpp, slots, pages, batch) if TENSORS else table
        fn = client.batch_write if write else client.batch_read
        base = ctypes.addressof(ctypes.c_char.from_buffer(pool))
        seed = ctypes.c_uint64(777 + c)
        i = 0
        mine = done["py"]
        while True:
            start.wait()
            if phase[0] == "end":
                return
            if phase[0] == "pool":
                if c == 0:  # the pool has one driver, as py_baseline.py
                    pool_side(pool_table)
            elif phase[0] == "c":
                n = loop(client._pf._h, int(write), base, pool_bytes, bpp, batch, turn,
                         ctypes.byref(seed))
                if n < 0:
                    errors.append("the C loop's batch failed")
                else:
                    done["c"][c] += n
            else:
                # The loop does what an engine's does with a batch (the check
                # of every result is one list.count) and nothing else, as
                # bench_io's.
                while running[0]:
                    offs, bufs = table[i & 4095]
                    res = fn(offs, bufs)
                    if res.count(bpp) != batch:
                        errors.append(res)
                        break
                    i += 1
                    mine[c] = i
            finish.wait()

    # The plain pool (bench/io/py_baseline.py): one os.preadv / os.pwritev per
    # page on 16 threads, on a descriptor of its own; here on prebuilt views.
    pfd = os.open(path, os.O_RDWR)
    pool_op = os.pwritev if write else os.preadv
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=16)

    def one(view, off):
        n = pool_op(pfd, [view], off)
        if n != bpp:
            raise OSError(f"short transfer {n} of {bpp}")
        return n

    def pool_side(table):
        i = done["pool"][0]
        while running[0]:
            offs, bufs = table[i & 4095]
            futs = [executor.submit(one, b, o) for o, b in zip(offs, bufs)]
            try:
                for f in futs:
                    f.result()
            except OSError as e:
                errors.append(f"the pool's batch failed: {e}")
                break
            i += 1
            done["pool"][0] = i

    th = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    [t.start() for t in th]
    spent = {"py": 0.0, "c": 0.0, "pool": 0.0}
    counted = {"py": 0, "c": 0, "pool": 0}

    def run_phase(side, secs, count):
        phase[0] = side
        running[0] = True
        n0 = sum(done[side])
        start.wait()
        t0 = time.monotonic()
        if side != "c":
            time.sleep(secs)
            running[0] = False
        finish.wait()
        if count:
            spent[side] += time.monotonic() - t0
            counted[side] += sum(done[side]) - n0

    if cloop:
        sides = ("py", "c", "pool")
        for r in range(rounds + 1):  # round 0: warm-up
            for k in range(3):
                run_phase(sides[(r + k) % 3], turn, r > 0)
    else:
        run_phase("py", warmup, False)
        run_phase("py", seconds, True)
    phase[0] = "end"
    start.wait()
    [t.join() for t in th]
    client.close()
    executor.shutdown()
    os.close(pfd)
    if errors:
        sys.exit(f"compat_bench: a batch failed: {errors[0]}")
    gbps = counted["py"] * batch * bpp / spent["py"] / 1e9
    line = (f"tool=compat rw={rw} bpp={bpp} batch={batch} callers={callers} "
            f"seconds={spent['py']:.2f} gbps={gbps:.3f}")
    if cloop:
        c_gbps = counted["c"] * batch * bpp / spent["c"] / 1e9
        pool_gbps = counted["pool"] * batch * bpp / spent["pool"] / 1e9
        line += (f" rounds={rounds} c_seconds={spent['c']:.2f} c_gbps={c_gbps:.3f} ratio={gbps / c_gbps:.3f}"
                 f" pool_seconds={spent['pool']:.2f} pool_gbps={pool_gbps:.3f}"
                 f" pool_ratio={gbps / pool_gbps:.3f}")
    print(line)


if __name__ == "__main__":
    main()
