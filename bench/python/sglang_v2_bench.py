#!/usr/bin/python3
"""kvpage.sglang's v2 path (SGLang's hybrid pools) against its KV (v1) path
on the same bytes (issue 35): GB/s of batch_set_v2 / batch_get_v2 of a pool
over GB/s of batch_set_v1 / batch_get_v1 of the KV pool, BATCH pages of 2 MiB
a call, taking turns in one process (which side goes first alternating),
ROUNDS rounds a side; a round's keys are deleted after it (untimed) and the
next round rewrites those pages, as store_bench.py does.

The KV pool: an MHA page_first host pool, 16 tokens a page, 32 layers, 8
heads of 128 fp16: K and V 1 MiB each (the keys {key}-k and {key}-v). The
v2 pools, each 2 MiB a page:
  swa      the same MHA geometry as another pool (mode split: zero copy);
  indexer  a DSA indexer page_first pool (mode ptr: zero copy);
  mamba    a Mamba slot: temporal state (8, 32, 60) fp32 and two conv
           states (2, 512) fp16, 32 layers (mode vec: zero copy, the three
           buffers of a slot moved as one page by kvp_store_putv / getv);
           then again with the pool's mode set to staged (the one staging
           copy it took before, kept for pages of over 1024 pointers), the
           baseline of vec in the same run.
Host pools are the stand-ins of tests/python/sglang_v2_standins.py. Embedded
metadata, durable false, files in the page cache.

usage: sglang_v2_bench.py DIR [BATCH] [ROUNDS]
Prints one line per pool: pool=... mode=... put_ratio=... get_ratio=...
(medians of the per-round ratios) and the sides' median GB/s."""
import os
import statistics
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

from kvpage.sglang import KvpageHiCacheStorage  # noqa: E402
from sglang_v2_standins import (IndexerHostPool, MambaHostPool, MHAHostPool,  # noqa: E402
                                PoolName, PoolTransfer)

PAGE = 16  # tokens a KV page
MIB2 = 2 << 20


def pools(batch):
    slots = 2 * batch  # written at pages 0.., read back at pages batch..
    return {
        "kv": MHAHostPool(slots * PAGE, PAGE, 32, 8, 128),
        "swa": MHAHostPool(slots * PAGE, PAGE, 32, 8, 128),
        "indexer": IndexerHostPool(slots * PAGE, PAGE, 32, 4096),
        "mamba": MambaHostPool(slots, 32, (8, 32, 60), ((2, 512), (2, 512))),
    }


def page_bytes(name, pool):
    """The bytes of one page of the pool (an MHA page: its K and its V)."""
    if name in ("kv", "swa"):
        return 2 * pool.get_ksize_per_token() * PAGE
    return pool.get_ksize_per_token() * pool.page_size


def indices(pool, first, n):
    ps = pool.page_size
    return torch.arange(first * ps, (first + n) * ps, dtype=torch.int64)


def timed(fn):
    t = time.perf_counter()
    ok = fn()
    return time.perf_counter() - t, ok


def main():
    d = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    hp = pools(batch)
    for name, p in hp.items():
        assert page_bytes(name, p) == MIB2, (name, page_bytes(name, p))
        gen = torch.Generator().manual_seed(1)
        for i in range(batch):
            p.fill(i * p.page_size, gen)
    cfg = types.SimpleNamespace(tp_rank=0, tp_size=1, is_mla_model=False, is_page_first_layout=True,
                                model_name="bench", extra_config={
                                    "file_path_prefix": os.path.join(d, "v2"),
                                    "file_size": 4 * batch * MIB2, "entries": 8,
                                    "durable": False})
    b = KvpageHiCacheStorage(cfg, {})
    b.register_mem_pool_host(hp["kv"])
    for name in ("swa", "indexer", "mamba"):
        b.register_mem_host_pool_v2(hp[name], PoolName(name))
    keys = [f"{i:064x}" for i in range(batch)]
    kv = hp["kv"]

    def v1_round():
        tp = timed(lambda: b.batch_set_v1(keys, indices(kv, 0, batch)))
        tg = timed(lambda: b.batch_get_v1(keys, indices(kv, batch, batch)))
        assert all(tp[1]) and all(tg[1])
        b.store.delete([f"{k}{s}" for k in keys for s in ("-k", "-v")])
        return tp[0], tg[0]

    def v2_round(name):
        p = hp[name]
        put = [PoolTransfer(PoolName(name), host_indices=indices(p, 0, batch), keys=keys)]
        get = [PoolTransfer(PoolName(name), host_indices=indices(p, batch, batch), keys=keys)]
        tp = timed(lambda: b.batch_set_v2(put))
        tg = timed(lambda: b.batch_get_v2(get))
        assert all(tp[1][PoolName(name)]) and all(tg[1][PoolName(name)])
        b._pools[name].store.delete(b._pools[name].store_keys(keys))
        return tp[0], tg[0]

    gb = batch * MIB2 / 1e9
    for name, mode in (("swa", None), ("indexer", None), ("mamba", None), ("mamba", "staged")):
        if mode:
            b._pools[name].mode = mode
        v2_round(name)  # warm-up, untimed
        v1_round()
        rp, rg, s1, s2 = [], [], [], []
        for r in range(rounds):
            if r % 2:
                a, c = v2_round(name), v1_round()
            else:
                c, a = v1_round(), v2_round(name)
            rp.append(c[0] / a[0])  # v2 GB/s / v1 GB/s = v1 time / v2 time
            rg.append(c[1] / a[1])
            s1.append(c)
            s2.append(a)
        # the bytes landed where they should (the last round's reads)
        for i in range(batch):
            want = hp[name].page_bytes(i * hp[name].page_size)
            got = hp[name].page_bytes((batch + i) * hp[name].page_size)
            assert (want == got).all(), (name, i)
        med = statistics.median
        print(f"pool={name} mode={b._pools[name].mode} batch={batch} page_bytes={MIB2} "
              f"rounds={rounds} put_ratio={med(rp):.3f} get_ratio={med(rg):.3f} "
              f"v1_put_gbs={gb / med(t[0] for t in s1):.2f} "
              f"v2_put_gbs={gb / med(t[0] for t in s2):.2f} "
              f"v1_get_gbs={gb / med(t[1] for t in s1):.2f} "
              f"v2_get_gbs={gb / med(t[1] for t in s2):.2f}", flush=True)
    b.close()


if __name__ == "__main__":
    main()
