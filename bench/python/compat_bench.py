#!/usr/bin/python3
"""kvpage.compat.Hf3fsClient from Python, on the workload of bench/io's
bench_io and py_baseline.py: random batches of `batch` pages between random
slots of a host pool (1 GiB per caller, so copies land in cold memory) and
random pages of the file. CALLERS threads share one client, each with its own
pool (as bench_io --callers).

usage: compat_bench.py FILE BPP read|write SECONDS CALLERS [POOL_BYTES] [BATCH] [WARMUP]
Prints one line of key=value pairs like bench_io.
"""
import mmap
import os
import random
import sys
import threading
import time

import numpy as np

from kvpage.compat import Hf3fsClient


def main():
    path, bpp, rw = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    seconds, callers = float(sys.argv[4]), int(sys.argv[5])
    pool_bytes = int(sys.argv[6]) if len(sys.argv) > 6 else 1 << 30
    batch = int(sys.argv[7]) if len(sys.argv) > 7 else 8
    warmup = float(sys.argv[8]) if len(sys.argv) > 8 else 1.0
    size = os.stat(path).st_size
    client = Hf3fsClient(path, size, bpp, batch)
    pages, slots = size // bpp, pool_bytes // bpp
    write = rw == "write"
    pools = []
    for _ in range(callers):
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
        pools.append((m, a))
    start = threading.Barrier(callers + 1)
    running = [True]   # a list item, not an Event: is_set() is a Python call a batch
    done = [0] * callers  # batches done per caller, sampled by the main thread
    errors = []

    def caller(c):
        rng = random.Random(12345 + c)
        pool = pools[c][1]
        views = [pool[s * bpp:(s + 1) * bpp] for s in range(slots)]
        fn = client.batch_write if write else client.batch_read
        # The random batches are drawn before timing (an engine has its
        # offsets and pages at hand; random.sample costs 5-10 us a batch,
        # bench_io's generator nothing): 4096 batches cycled.
        table = []
        for _ in range(4096):
            chosen = rng.sample(range(slots), batch)
            table.append(([rng.randrange(pages) * bpp for _ in range(batch)],
                          [views[s] for s in chosen]))
        start.wait()
        i = 0
        # The loop does what an engine's does with a batch (the check of
        # every result is one list.count) and nothing else, as bench_io's.
        while running[0]:
            offs, bufs = table[i & 4095]
            res = fn(offs, bufs)
            if res.count(bpp) != batch:
                errors.append(res)
                return
            i += 1
            done[c] = i

    th = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    [t.start() for t in th]
    start.wait()
    time.sleep(warmup)
    t0, n0 = time.monotonic(), sum(done)
    time.sleep(seconds)
    t1, n1 = time.monotonic(), sum(done)
    running[0] = False
    [t.join() for t in th]
    dt = t1 - t0
    totals = [(n1 - n0) * batch * bpp]
    client.close()
    if errors:
        sys.exit(f"compat_bench: a batch failed: {errors[0]}")
    print(f"tool=compat rw={rw} bpp={bpp} batch={batch} callers={callers} seconds={dt:.2f} "
          f"gbps={sum(totals) / dt / 1e9:.3f}")


if __name__ == "__main__":
    main()
