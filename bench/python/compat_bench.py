#!/usr/bin/python3
"""kvpage.compat.Hf3fsClient from Python, on the workload of bench/io's
bench_io and py_baseline.py: random batches of `batch` pages between random
slots of a host pool (1 GiB per caller, so copies land in cold memory) and
random pages of the file. CALLERS threads share one client, each with its own
pool (as bench_io --callers).

usage: compat_bench.py FILE BPP read|write SECONDS CALLERS [POOL_BYTES] [BATCH] [WARMUP]
Prints one line of key=value pairs like bench_io.

With KVPB_CLOOP=PATH (bench/python/cloop.c built as a shared object) the
Python client and bench_io's C loop take turns in this process, on the same
handle and pools: ROUNDS (KVPB_ROUNDS, default 10) rounds of SECONDS/ROUNDS
on each side, alternating which goes first; the first round is warm-up. The
line then has gbps (Python), c_gbps (C) and their ratio.
"""
import ctypes
import mmap
import os
import random
import sys
import threading
import time

import numpy as np

from kvpage.compat import Hf3fsClient


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


def make_table(c, pool, bpp, slots, pages, batch):
    # The random batches are drawn before timing (an engine has its offsets
    # and pages at hand; random.sample costs 5-10 us a batch, bench_io's
    # generator nothing): 4096 batches cycled.
    rng = random.Random(12345 + c)
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
    done = {"py": [0] * callers, "c": [0] * callers}  # batches per caller and side
    errors = []
    turn = seconds / rounds if cloop else 0.0

    def caller(c):
        pool = pools[c][1]
        table = make_table(c, pool, bpp, slots, pages, batch)
        fn = client.batch_write if write else client.batch_read
        base = ctypes.addressof(ctypes.c_char.from_buffer(pool))
        seed = ctypes.c_uint64(777 + c)
        i = 0
        mine = done["py"]
        while True:
            start.wait()
            if phase[0] == "end":
                return
            if phase[0] == "c":
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

    th = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    [t.start() for t in th]
    spent = {"py": 0.0, "c": 0.0}
    counted = {"py": 0, "c": 0}

    def run_phase(side, secs, count):
        phase[0] = side
        running[0] = True
        n0 = sum(done[side])
        start.wait()
        t0 = time.monotonic()
        if side == "py":
            time.sleep(secs)
            running[0] = False
        finish.wait()
        if count:
            spent[side] += time.monotonic() - t0
            counted[side] += sum(done[side]) - n0

    if cloop:
        for r in range(rounds + 1):  # round 0: warm-up
            for side in (("py", "c") if r % 2 else ("c", "py")):
                run_phase(side, turn, r > 0)
    else:
        run_phase("py", warmup, False)
        run_phase("py", seconds, True)
    phase[0] = "end"
    start.wait()
    [t.join() for t in th]
    client.close()
    if errors:
        sys.exit(f"compat_bench: a batch failed: {errors[0]}")
    gbps = counted["py"] * batch * bpp / spent["py"] / 1e9
    line = (f"tool=compat rw={rw} bpp={bpp} batch={batch} callers={callers} "
            f"seconds={spent['py']:.2f} gbps={gbps:.3f}")
    if cloop:
        c_gbps = counted["c"] * batch * bpp / spent["c"] / 1e9
        line += f" rounds={rounds} c_seconds={spent['c']:.2f} c_gbps={c_gbps:.3f} ratio={gbps / c_gbps:.3f}"
    print(line)


if __name__ == "__main__":
    main()
