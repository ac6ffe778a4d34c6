#!/usr/bin/python3
"""The reference engines' plain-file fallback, done as well as stdlib Python can:
a pool of 16 threads, each task one os.preadv/os.pwritev of one page (the
mock client seeks and reads under no lock; pread/pwrite is its correct form).
Same workload as bench_io: random batches of `batch` pages between random
slots of a host pool and random pages of the file.

usage: py_baseline.py FILE BPP read|write DIRECT(0|1) SECONDS [POOL_BYTES] [BATCH] [WARMUP]
Prints one line of key=value pairs like bench_io.
"""
import concurrent.futures
import mmap
import os
import random
import sys
import time


def main():
    path, bpp, rw, direct, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    pool_bytes = int(sys.argv[6]) if len(sys.argv) > 6 else 1 << 30
    batch = int(sys.argv[7]) if len(sys.argv) > 7 else 8
    warmup = float(sys.argv[8]) if len(sys.argv) > 8 else 1.0
    flags = os.O_RDWR | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    size = os.fstat(fd).st_size
    pages, slots = size // bpp, pool_bytes // bpp
    # An anonymous mapping is page aligned, as O_DIRECT needs; huge pages as in
    # bench_io. It must be private: a shared anonymous mapping is shmem, which
    # gets no transparent huge pages (shmem_enabled=never on Debian 12).
    pool = mmap.mmap(-1, pool_bytes, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        pool.madvise(mmap.MADV_HUGEPAGE)
    view = memoryview(pool)
    step = 1 << 20
    chunk = os.urandom(step)
    for off in range(0, pool_bytes, step):
        view[off:off + step] = chunk
    # ... and every 4 KiB page made distinct, as bench_io's pool is: repeated
    # pages could be merged by same-page merging (KSM, guest or host), and a
    # read into a merged page faults.
    for off in range(0, pool_bytes, 4096):
        view[off:off + 8] = off.to_bytes(8, "little")
    write = rw == "write"
    op = os.pwritev if write else os.preadv
    rng = random.Random(12345)

    def one(slot, page):
        n = op(fd, [view[slot * bpp:(slot + 1) * bpp]], page * bpp)
        if n != bpp:
            raise OSError(f"short transfer {n} of {bpp}")
        return n

    total = batches = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
        t_end_warm = time.monotonic() + warmup
        t0 = None
        while True:
            now = time.monotonic()
            if t0 is None and now >= t_end_warm:
                t0, total, batches = now, 0, 0
            if t0 is not None and now - t0 >= seconds:
                break
            chosen = rng.sample(range(slots), batch)
            futs = [ex.submit(one, s, rng.randrange(pages)) for s in chosen]
            for f in futs:
                total += f.result()
            batches += 1
        dt = time.monotonic() - t0
    os.close(fd)
    print(f"tool=python rw={rw} direct={direct} bpp={bpp} batch={batch} threads=16 "
          f"batches={batches} seconds={dt:.2f} gbps={total / dt / 1e9:.3f}")


if __name__ == "__main__":
    main()
