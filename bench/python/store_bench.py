#!/usr/bin/python3
"""kvpage.Store.put / get from Python, the way `kvpage bench store` measures
the C store: ROUNDS batches of BATCH new keys of BPP-byte pages, each put
then got back, embedded metadata beside the file, --no-durable (the C run
gets the same flags). The file is written once before timing.

usage: store_bench.py DIR BPP [BATCH] [ROUNDS]
Prints one line of key=value pairs.

With KVPB_CLOOP=PATH (bench/python/cloop.c built as a shared object), the
same rounds of `kvpage bench store` in C (kvpb_store_round) take turns with
the Python ones on the same store and buffers, which side goes first
alternating; the line then has c_put_gbs, c_get_gbs and the ratios.
"""
import ctypes
import mmap
import os
import shutil
import sys
import time

import numpy as np

import kvpage


def main():
    d, bpp = sys.argv[1], int(sys.argv[2])
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    path = os.path.join(d, f"py-store-{bpp}.pages")
    cloop = os.environ.get("KVPB_CLOOP")
    # Turns: each round's keys are deleted after it (untimed), and the next
    # round rewrites those pages. Fresh pages for every round of both sides
    # (8 GiB at 2 MiB) would pass the kernel's dirty-page limits halfway and
    # stall the writes of whichever side comes then, 0.4x to 1.4x per rep.
    size = batch * bpp * (2 if cloop else rounds)
    s = kvpage.Store(path, size, bpp, entries=batch, durable=False)
    # Buffers as the C side's (posix_memalign: plain anonymous pages). numpy's
    # own large allocations ask for transparent huge pages, which on this
    # machine made reads into them half as fast (4 against 9 GB/s).
    msrc, mdst = mmap.mmap(-1, batch * bpp), mmap.mmap(-1, batch * bpp)
    src = np.frombuffer(msrc, dtype=np.uint8)
    src[:] = np.frombuffer(os.urandom(batch * bpp), dtype=np.uint8)
    dst = np.frombuffer(mdst, dtype=np.uint8)
    dst[:] = 0
    wv = [src[i * bpp:(i + 1) * bpp] for i in range(batch)]
    rv = [dst[i * bpp:(i + 1) * bpp] for i in range(batch)]
    pf = kvpage.PageFile(path, size, bpp, batch)  # write the file once, untimed
    for p in range(0, size // bpp, batch):
        pf.write([(p + i) * bpp for i in range(batch)], wv)
    pf.flush()
    pf.close()
    t_put = t_get = 0.0
    c_put, c_get = ctypes.c_double(0.0), ctypes.c_double(0.0)
    if cloop:
        c_round = ctypes.CDLL(cloop).kvpb_store_round
        c_round.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                            ctypes.c_int, ctypes.c_uint64, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double)]
        src_at = ctypes.addressof(ctypes.c_char.from_buffer(src))
        dst_at = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    for r in range(rounds):
        sides = ("py",) if not cloop else (("py", "c") if r % 2 else ("c", "py"))
        for side in sides:
            if side == "c":
                if c_round(s._h, src_at, dst_at, bpp, batch, r, 1, ctypes.byref(c_put),
                           ctypes.byref(c_get)):
                    sys.exit(f"store_bench: C round {r} failed")
                dst[:] = 0
                continue
            keys = [f"py-{os.getpid()}-{r}-{i}" for i in range(batch)]
            t0 = time.monotonic()
            res = s.put(keys, wv)
            t1 = time.monotonic()
            lead, _ = s.get(keys, rv)
            t2 = time.monotonic()
            if any(x != kvpage.STORED for x in res) or lead != batch or not (src == dst).all():
                sys.exit(f"store_bench: round {r} failed: {res[:4]} lead {lead}")
            dst[:] = 0
            t_put += t1 - t0
            t_get += t2 - t1
            if cloop:
                s.delete(keys)
    s.close()
    gb = batch * bpp * rounds / 1e9
    line = (f"tool=py-store bpp={bpp} batch={batch} rounds={rounds} put_gbs={gb / t_put:.3f} "
            f"get_gbs={gb / t_get:.3f}")
    if cloop:
        line += (f" c_put_gbs={gb / c_put.value:.3f} c_get_gbs={gb / c_get.value:.3f}"
                 f" put_ratio={c_put.value / t_put:.3f} get_ratio={c_get.value / t_get:.3f}")
    print(line)
    os.unlink(path)
    shutil.rmtree(path + ".meta", ignore_errors=True)


if __name__ == "__main__":
    main()
