"""kvpage's vLLM tier (kvpage.vllm_tier.KvpageTier) against vLLM's fs tier's
way of moving blocks, in one run: store and load GB/s of jobs of 16 blocks
between the rows of a primary view and the tier, for each block size.

  fs       what vLLM's fs tier does, rewritten here from its code
           (vllm-project/vllm vllm/v1/kv_offload/tiering/fs/io.py
           @ 0320ab4d28fec5e7c8351a46bca98e867402b6ff, fs/thread_pool.py
           @ 0252031c941fffe07123e8782d310fc93773766e, fs/manager.py
           @ 1d0a6c68db87c40d4d5bbf47ed7ea10ae3409251): one file per block at
           <root>/<hhh>/<hh>_g<group>/<hash>.bin; a store skips a block whose
           file exists, else writes it with O_DIRECT to a temporary file and
           renames it into place; a load opens the file with O_DIRECT and
           readv's it straight into the row; a job's blocks are tasks split
           evenly over a pool of 16 load-priority and 16 store-priority
           threads (n_read_threads = n_write_threads = 16, its defaults).
  kvpage   KvpageTier with its defaults: 4 jobs at once, each job's 16 pages
           one io_uring batch with O_DIRECT (as the fs tier, past the page
           cache), the page file preallocated, integrity (a checksum per
           block written with it and checked on load) and therefore not
           durable (no fdatasync per job: the fs tier does not sync either),
           embedded metadata. KVPB_TIER='{"direct": false}' (JSON) passes
           other keys of the tier's config.

Every job of a phase is submitted at once, then the phase waits for all
(drain). Before the loads, the page cache of kvpage's file is dropped
(its data synced, untimed, then posix_fadvise DONTNEED), as the fs tier's
O_DIRECT loads never read from it. Each rep starts from empty directories;
which side goes first alternates.

  python3 tier_bench.py DIR [--sizes 262144,2097152] [--mib 256] [--reps 3]
"""
import argparse
import itertools
import json
import mmap
import os
import random
import statistics
import sys
import threading
import time
import types
from collections import deque

import numpy as np

from kvpage.vllm_tier import KvpageTier

BLOCKS_PER_JOB = 16
TIER_CONFIG = json.loads(os.environ.get("KVPB_TIER", "{}"))  # other keys of the tier's config
O_DIRECT = getattr(os, "O_DIRECT", 0)


# ----------------------------------------------------------------- the fs tier

class FsPool:
    """vLLM's DualQueueThreadPool: load and store queues, 16 threads that
    prefer loads and 16 that prefer stores; a job's tasks are cut into one
    batch per thread of its kind; a job finishes when its last batch does."""

    def __init__(self, n_read=16, n_write=16):
        self.load_q, self.store_q = deque(), deque()
        self.cond = threading.Condition()
        self.stop = False
        self.inflight = 0
        self.finished = deque()
        self.n_read, self.n_write = n_read, n_write
        self.threads = [threading.Thread(target=self.worker, args=(i < n_read,), daemon=True)
                        for i in range(n_read + n_write)]
        for t in self.threads:
            t.start()

    def enqueue(self, q, n_threads, job_id, tasks):
        n = len(tasks)
        per, extra = divmod(n, n_threads)
        sizes = [per + 1 if i < extra else per for i in range(min(n, n_threads))]
        state = {"left": n, "ok": True, "lock": threading.Lock(), "id": job_id}
        it = iter(tasks)
        with self.cond:
            self.inflight += 1
            for s in sizes:
                q.append((list(itertools.islice(it, s)), state))
            self.cond.notify(len(sizes))

    def worker(self, load_first):
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.stop or self.load_q or self.store_q)
                if self.stop:
                    return
                a, b = (self.load_q, self.store_q) if load_first else (self.store_q, self.load_q)
                batch, state = a.popleft() if a else b.popleft()
            ok = True
            try:
                for fn in batch:
                    fn()
            except OSError:
                ok = False
            with state["lock"]:
                state["left"] -= len(batch)
                state["ok"] &= ok
                done = state["left"] == 0
            if done:
                with self.cond:
                    self.finished.append((state["id"], state["ok"]))
                    self.inflight -= 1
                    self.cond.notify_all()

    def wait_idle(self):
        with self.cond:
            self.cond.wait_for(lambda: self.inflight == 0)

    def shutdown(self):
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        for t in self.threads:
            t.join()


_tls = threading.local()


def _tmp_suffix():
    if not hasattr(_tls, "s"):
        _tls.s = f"_{random.randint(0, 2**63 - 1)}.tmp"
    return _tls.s


def fs_store_block(dest, flat, off, bs):
    """fs/io.py store_block: skip an existing file, else O_DIRECT write of a
    temporary file, then os.replace."""
    if os.path.exists(dest):
        return
    tmp = dest + _tmp_suffix()
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_TRUNC | O_DIRECT, 0o644)
    try:
        if os.write(fd, flat[off:off + bs]) < bs:
            raise OSError("short write")
    finally:
        os.close(fd)
    os.replace(tmp, dest)


def fs_load_block(src, flat, off, bs):
    """fs/io.py load_block: O_DIRECT open, readv straight into the row."""
    fd = os.open(src, os.O_RDONLY | O_DIRECT)
    try:
        if os.readv(fd, [flat[off:off + bs]]) < bs:
            raise OSError("short read")
    finally:
        os.close(fd)


class FsTier:
    def __init__(self, root, flat, bs):
        self.root, self.flat, self.bs = root, flat, bs
        self.pool = FsPool()

    def path(self, key):
        h = key[:-4].hex()
        return f"{self.root}_r0/{h[:3]}/{h[3:5]}_g0/{h}.bin"

    def submit(self, kind, job_id, keys, rows):
        fn = fs_store_block if kind == "store" else fs_load_block
        tasks = [lambda p=self.path(k), o=r * self.bs: fn(p, self.flat, o, self.bs)
                 for k, r in zip(keys, rows)]
        if kind == "store":
            self.pool.enqueue(self.pool.store_q, self.pool.n_write, job_id, tasks)
        else:
            self.pool.enqueue(self.pool.load_q, self.pool.n_read, job_id, tasks)

    def drain(self):
        self.pool.wait_idle()
        done = list(self.pool.finished)
        self.pool.finished.clear()
        return done

    def before_loads(self):
        pass

    def close(self):
        self.pool.shutdown()


# --------------------------------------------------------------------- kvpage

class KvTier:
    def __init__(self, root, view, bs, nblocks):
        self.path = root + ".pages"
        self.tier = KvpageTier(None, view, "KvpageTier", path=self.path,
                               file_size=nblocks * bs, identity="bench", **TIER_CONFIG)

    def submit(self, kind, job_id, keys, rows):
        job = types.SimpleNamespace(job_id=job_id, keys=keys, block_ids=rows)
        (self.tier.submit_store if kind == "store" else self.tier.submit_load)(job)

    def drain(self):
        self.tier.drain_jobs()
        return [(r.job_id, r.success) for r in self.tier.get_finished_jobs()]

    def before_loads(self):
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def close(self):
        self.tier.shutdown()


# ---------------------------------------------------------------------- runs

def phase(tier, kind, keys, rows):
    """Submits every job, waits for all; returns GB/s."""
    t0 = time.perf_counter()
    for j in range(0, len(keys), BLOCKS_PER_JOB):
        tier.submit(kind, j, keys[j:j + BLOCKS_PER_JOB], rows[j:j + BLOCKS_PER_JOB])
    done = tier.drain()
    dt = time.perf_counter() - t0
    bad = [j for j, ok in done if not ok]
    if bad or len(done) != len(keys) // BLOCKS_PER_JOB:
        sys.exit(f"{kind}: {len(bad)} of {len(done)} jobs failed")
    return len(keys) * tier_bs(tier) / dt / 1e9


def tier_bs(tier):
    return tier.bs if isinstance(tier, FsTier) else tier.tier.block_size


def one(side, d, mm, bs, n, rep):
    view = memoryview(mm).cast("b", (2 * n, bs))
    arr = np.frombuffer(mm, np.uint8).reshape(2 * n, bs)
    keys = [os.urandom(32) + b"\0\0\0\0" for _ in range(n)]
    root = os.path.join(d, f"{side}-{bs}-{rep}")
    tier = FsTier(root, view.cast("B"), bs) if side == "fs" else KvTier(root, view, bs, n)
    try:
        st = phase(tier, "store", keys, list(range(n)))
        tier.before_loads()
        arr[n:] = 0
        ld = phase(tier, "load", keys, list(range(n, 2 * n)))
        if not np.array_equal(arr[n:], arr[:n]):
            sys.exit(f"{side}: the loaded rows differ from the stored ones")
    finally:
        tier.close()
        del arr
        view.release()
    os.system(f"rm -rf {root}*")
    return st, ld


def warm(d, mm):
    """Has the kernel read and write every page of the rows once, untimed:
    on this machine (a VM) the first time the kernel copies from or into
    anonymous memory that Python has just written runs at 0.2 GB/s, later
    times at 6-9 GB/s, whatever the file (bench/python/README.md)."""
    path = os.path.join(d, "warm.bin")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, mm, 0)
        os.preadv(fd, [mm], 0)
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--sizes", default="262144,2097152")
    ap.add_argument("--mib", type=int, default=256, help="MiB stored and loaded per phase")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows = {}
    for bs in [int(s) for s in a.sizes.split(",")]:
        n = (a.mib << 20) // bs // BLOCKS_PER_JOB * BLOCKS_PER_JOB
        mm = mmap.mmap(-1, 2 * n * bs)
        np.frombuffer(mm, np.uint8)[: n * bs] = np.random.default_rng(1).integers(
            0, 256, n * bs, np.uint8)
        warm(a.dir, mm)
        for rep in range(a.reps):
            order = ["fs", "kvpage"] if rep % 2 == 0 else ["kvpage", "fs"]
            res = {side: one(side, a.dir, mm, bs, n, rep) for side in order}
            for side in order:
                st, ld = res[side]
                print(f"bs={bs} rep={rep} side={side} store_GBps={st:.3f} load_GBps={ld:.3f}",
                      flush=True)
            rows.setdefault(bs, []).append(res)
        mm.close()
    print("\n| block | fs store GB/s | kvpage store GB/s | store × (target ≥ 1.5) "
          "| fs load GB/s | kvpage load GB/s | load × (target ≥ 1.0) |")
    print("|---|---|---|---|---|---|---|")
    for bs, reps in rows.items():
        med = {k: statistics.median(r[s][i] for r in reps)
               for k, (s, i) in {"fs_st": ("fs", 0), "kv_st": ("kvpage", 0),
                                 "fs_ld": ("fs", 1), "kv_ld": ("kvpage", 1)}.items()}
        rs = statistics.median(r["kvpage"][0] / r["fs"][0] for r in reps)
        rl = statistics.median(r["kvpage"][1] / r["fs"][1] for r in reps)
        print(f"| {bs >> 10} KiB | {med['fs_st']:.2f} | {med['kv_st']:.2f} | {rs:.2f} "
              f"| {med['fs_ld']:.2f} | {med['kv_ld']:.2f} | {rl:.2f} |")


if __name__ == "__main__":
    main()
