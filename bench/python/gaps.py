#!/usr/bin/python3
"""How long a Python caller spends outside kvp_pagefile_read between two
batches (the gap), against the time of a batch inside it, with gapshim.c in
place of libkvpage.so. One thread reads random batches of 8 pages of FILE
into random slots of a 1 GiB pool (those of compat_bench.py), in four ways:

  raw      the ctypes call alone, the ops of every batch built beforehand
  touch    raw, after one attribute of each buffer read (data_ptr() of a
           tensor, nbytes of an array): what reaching the 8 objects costs
  build    the ops built per batch by kvpage._buffers.fast_words, then the call
  pf.read  kvpage.PageFile.read
  compat   kvpage.compat.Hf3fsClient.batch_read and the engines' check of
           the results (one list.count)

usage: KVPAGE_LIB=gapshim.so gaps.py FILE BPP [numpy|torch] [MMAP_READS(0|1)] [ROUNDS]
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_bench import make_pool, make_table  # noqa: E402
from layers import make_steps  # noqa: E402

from kvpage.compat import Hf3fsClient  # noqa: E402


def main():
    path, bpp = sys.argv[1], int(sys.argv[2])
    tensors = len(sys.argv) > 3 and sys.argv[3] == "torch"
    mmap_reads = len(sys.argv) > 4 and sys.argv[4] == "1"
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    shim = ctypes.CDLL(os.environ["KVPAGE_LIB"])
    if not hasattr(shim, "kvpb_gaps"):
        sys.exit("gaps.py: KVPAGE_LIB must be gapshim.so (see gapshim.c)")
    size, batch, pool_bytes = os.stat(path).st_size, 8, 1 << 30
    client = Hf3fsClient(path, size, bpp, batch, mmap_reads=mmap_reads)
    _, pool = make_pool(pool_bytes)
    table = make_table(0, pool, bpp, pool_bytes // bpp, size // bpp, batch, tensors)
    steps = make_steps(client, table, batch, bpp, tensors)
    gap, inside = ctypes.c_double(), ctypes.c_double()
    for r in range(rounds):
        for name, step in steps.items():
            shim.kvpb_gaps(ctypes.byref(gap), ctypes.byref(inside))
            for i in range(6000):
                step(i & 4095)
            shim.kvpb_gaps(ctypes.byref(gap), ctypes.byref(inside))
            print(f"round {r} {name:8s} gap {gap.value / 1e3:6.1f} us  "
                  f"inside {inside.value / 1e3:6.1f} us")
    client.close()


if __name__ == "__main__":
    main()
