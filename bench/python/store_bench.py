#!/usr/bin/python3
"""kvpage.Store.put / get from Python, the way `kvpage bench store` measures
the C store: ROUNDS batches of BATCH new keys of BPP-byte pages, each put
then got back, embedded metadata beside the file, --no-durable (the C run
gets the same flags). The file is written once before timing.

usage: store_bench.py DIR BPP [BATCH] [ROUNDS]
Prints one line of key=value pairs.
"""
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
    size = batch * bpp * rounds
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
    for r in range(rounds):
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
    s.close()
    gb = batch * bpp * rounds / 1e9
    print(f"tool=py-store bpp={bpp} batch={batch} rounds={rounds} put_gbs={gb / t_put:.3f} "
          f"get_gbs={gb / t_get:.3f}")
    os.unlink(path)
    shutil.rmtree(path + ".meta", ignore_errors=True)


if __name__ == "__main__":
    main()
