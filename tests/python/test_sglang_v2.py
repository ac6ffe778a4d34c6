"""kvpage.sglang's HiCache storage v2 (SGLang's hybrid pools: KV + MAMBA +
SWA + INDEXER) through the stand-ins of sglang_v2_standins.py (written from
SGLang's hicache_storage.py, cache_controller.py, hybrid_cache_controller.py
and pool_host/{mamba,mha,dsa}.py at the commits its docstring records)."""
import hashlib
import importlib
import os
import sys
import types

import numpy as np
import pytest
import torch

import kvpage.sglang
import sglang_v2_standins
from kvpage import _sglang_pools
from kvpage.sglang import KvpageHiCacheStorage
from sglang_v2_standins import (DeepSeekV4PagedHostPool, HiCacheStorageExtraInfo,
                                HybridController, IndexerHostPool, LogicalHostPool,
                                MambaHostPool, MHAHostPool, MLAHostPool, PoolEntry,
                                PoolHitPolicy, PoolName, PoolTransfer)

PS = 4
ALL, TRAIL = PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES


def hashes(n, salt="h"):
    return [hashlib.sha256(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def kv_idx(pages, first=0):
    return torch.arange(first * PS, (first + pages) * PS, dtype=torch.int64)


def slot_idx(pool, slots):
    """host_indices of the pages slots of pool."""
    ps = pool.page_size
    return torch.cat([torch.arange(s * ps, (s + 1) * ps) for s in slots]).to(torch.int64)


def config(tmp_path, name="hc", tp_rank=0, tp_size=1, mla=False, **extra):
    extra.setdefault("file_size", 1 << 20)
    return types.SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, is_mla_model=mla,
                                 is_page_first_layout=True, model_name="m",
                                 extra_config=dict(file_path_prefix=str(tmp_path / name), **extra))


class Group:
    """A hybrid model's host pools: KV (MHA), MAMBA, SWA (window 2), INDEXER."""

    def __init__(self, kv=None, swa=None, seed=0):
        self.kv = kv or MHAHostPool()
        self.mamba, self.swa, self.indexer = MambaHostPool(), swa or MHAHostPool(), IndexerHostPool()
        self.entries = [PoolEntry(PoolName.MAMBA, self.mamba, TRAIL),
                        PoolEntry(PoolName.SWA, self.swa, TRAIL, window=2),
                        PoolEntry(PoolName.INDEXER, self.indexer, ALL, PoolName.KV)]
        self.gen = torch.Generator().manual_seed(seed)

    def fill(self, pages, mamba_slot, swa_slots):
        for p in range(pages):
            self.kv.fill(p * PS, self.gen)
            self.indexer.fill(p * PS, self.gen)
        self.mamba.fill(mamba_slot, self.gen)
        for s in swa_slots:
            self.swa.fill(s * PS, self.gen)

    def zero(self):
        for p in (self.kv, self.mamba, self.swa, self.indexer):
            p.zero()


def controller(tmp_path, group=None, **kw):
    g = group or Group()
    b = KvpageHiCacheStorage(config(tmp_path, **kw), {})
    c = HybridController(b, g.kv, g.entries, PS, tp_rank=kw.get("tp_rank", 0),
                         is_mla=kw.get("mla", False))
    return b, c, g


def written(tmp_path, n=5, **kw):
    """A backend whose group backed up n pages (mamba slot 3, swa pages 1, 2);
    the bytes of each pool's pages before the pools were zeroed."""
    b, c, g = controller(tmp_path, **kw)
    hs = hashes(n)
    g.fill(n, 3, [1, 2])
    want = {"kv": [g.kv.page_bytes(p * PS) for p in range(n)],
            "indexer": [g.indexer.page_bytes(p * PS) for p in range(n)],
            "mamba": g.mamba.page_bytes(3), "swa": [g.swa.page_bytes(s * PS) for s in (1, 2)]}
    res, done = c.backup(hs, kv_idx(n), {PoolName.MAMBA: [3], PoolName.SWA: [1, 2]})
    assert done == n
    assert res == {PoolName.MAMBA: [True], PoolName.SWA: [True, True],
                   PoolName.INDEXER: [True] * n}
    g.zero()
    return b, c, g, hs, want


def test_files_namespaces_and_modes(tmp_path):
    b, c, g = controller(tmp_path)
    for suffix in ("", ".mamba", ".swa", ".indexer"):
        assert os.path.exists(tmp_path / f"hc.0.bin{suffix}"), suffix
    modes = {t: p.mode for t, p in b._pools.items()}
    assert modes == {"mamba": "vec", "swa": "split", "indexer": "ptr"}
    st = b.get_stats()["pools"]
    assert st["mamba"]["bytes_per_page"] == g.mamba.get_size_per_token()
    assert st["swa"]["bytes_per_page"] == g.swa.get_ksize_per_token() * PS
    assert st["indexer"]["bytes_per_page"] == g.indexer.get_size_per_token() * PS
    assert b.registered_pools[PoolName.MAMBA] is g.mamba
    b.close()


def test_controller_backup_hit_query_prefetch(tmp_path):
    b, c, g, hs, want = written(tmp_path, n=5)
    assert c.hit_query(hs)[0] == 5
    # load into other host slots than the ones written
    done, pool_hits = c.prefetch(hs, kv_idx(5, first=7), {PoolName.MAMBA: [9],
                                                          PoolName.SWA: [12, 13]})
    assert done == 5 and pool_hits == {PoolName.MAMBA: 1, PoolName.SWA: 2}
    for p in range(5):
        assert np.array_equal(g.kv.page_bytes((7 + p) * PS), want["kv"][p]), p
        assert np.array_equal(g.indexer.page_bytes((7 + p) * PS), want["indexer"][p]), p
    assert np.array_equal(g.mamba.page_bytes(9), want["mamba"])
    assert np.array_equal(g.swa.page_bytes(12 * PS), want["swa"][0])
    assert np.array_equal(g.swa.page_bytes(13 * PS), want["swa"][1])
    assert not g.mamba.page_bytes(3).any()  # nothing landed where it was not asked
    b.close()


def test_exists_with_and_without_prefix_keys(tmp_path):
    b, c, g, hs, _ = written(tmp_path, n=6)
    prefix = hashes(3, salt="p")
    before = list(prefix)
    n1, r1 = c.hit_query(hs)
    n2, r2 = c.hit_query(hs, prefix_keys=prefix)
    assert n1 == n2 == 6 and r1.extra_pool_hit_pages == r2.extra_pool_hit_pages
    assert r1.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.MAMBA: 6, PoolName.SWA: 6,
                                       PoolName.INDEXER: 6}
    extra = HiCacheStorageExtraInfo(prefix_keys=prefix)
    assert b.batch_exists(hs, extra) == 6
    prefix.append("later")  # the controller grows its list after the call
    assert b.batch_exists(hs, extra) == 6 and prefix == before + ["later"]
    b.close()


def test_partial_hits_minimum_over_pools(tmp_path):
    b, c, g = controller(tmp_path)
    hs = hashes(6)
    g.fill(6, 0, [1, 2, 3])
    assert b.batch_set_v1(hs, kv_idx(6)) == [True] * 6
    # indexer pages 0..4 only; mamba state of page 3 (a prefix of 4); swa 2..3
    assert b.batch_set_v2([
        PoolTransfer(PoolName.INDEXER, host_indices=kv_idx(5), keys=hs[:5]),
        PoolTransfer(PoolName.MAMBA, host_indices=slot_idx(g.mamba, [0]), keys=[hs[3]]),
        PoolTransfer(PoolName.SWA, host_indices=slot_idx(g.swa, [2, 3]), keys=hs[2:4]),
    ]) == {PoolName.INDEXER: [True] * 5, PoolName.MAMBA: [True], PoolName.SWA: [True, True]}
    q = lambda *pools: b.batch_exists_v2(hs, [PoolTransfer(n, keys=k, hit_policy=p)  # noqa: E731
                                              for n, k, p in pools])
    r = q((PoolName.INDEXER, None, ALL))
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (5, {PoolName.KV: 6, PoolName.INDEXER: 5})
    r = q((PoolName.MAMBA, ["__placeholder__"], TRAIL))
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (4, {PoolName.KV: 6, PoolName.MAMBA: 4})
    r = q((PoolName.SWA, ["__placeholder__"] * 2, TRAIL))
    assert r.kv_hit_pages == 4
    r = q((PoolName.SWA, ["__placeholder__"] * 3, TRAIL))  # a window of 3: pages 1..3 absent
    assert r.kv_hit_pages == 0 and r.extra_pool_hit_pages == {PoolName.KV: 6}
    r = q((PoolName.INDEXER, None, ALL), (PoolName.MAMBA, ["__placeholder__"], TRAIL))
    assert r.kv_hit_pages == 4
    b.close()


def test_miss_in_the_middle_of_a_chain(tmp_path):
    b, c, g, hs, want = written(tmp_path, n=5)
    b.delete(hs[2])
    b._pools["indexer"].store.delete([f"{hs[2]}_indexer"])
    assert b.batch_exists_v2(hs, [PoolTransfer(PoolName.INDEXER)]).kv_hit_pages == 2
    # the Mamba state and the SWA window of a 2-page prefix were never written
    assert c.hit_query(hs)[0] == 0
    res = b.batch_get_v2([PoolTransfer(PoolName.INDEXER, host_indices=kv_idx(5), keys=hs)])
    assert res == {PoolName.INDEXER: [True, True, False, True, True]}
    for p in range(5):
        got = g.indexer.page_bytes(p * PS)
        assert (not got.any()) if p == 2 else np.array_equal(got, want["indexer"][p]), p
    # the controller stops at the miss: KV 0..1, no sidecar pools
    done, pool_hits = c.prefetch(hs, kv_idx(5, first=8), {PoolName.MAMBA: [5],
                                                          PoolName.SWA: [14, 15]})
    assert done == 2 and pool_hits == {}
    assert not g.mamba.page_bytes(5).any()
    b.close()


def test_placeholder_keys_are_never_pages(tmp_path):
    b, c, g = controller(tmp_path)
    g.fill(1, 0, [])
    t = PoolTransfer(PoolName.MAMBA, host_indices=slot_idx(g.mamba, [0]), keys=["__placeholder__"])
    assert b.batch_set_v2([t]) == {PoolName.MAMBA: [False]}
    assert b._pools["mamba"].store.stats()["keys"] == 0
    assert b.batch_get_v2([t]) == {PoolName.MAMBA: [False]}
    b.close()


def test_bad_transfers_change_nothing(tmp_path):
    b, c, g = controller(tmp_path)
    hs = hashes(3)
    short = PoolTransfer(PoolName.INDEXER, host_indices=kv_idx(3)[:5], keys=hs)
    assert b.batch_set_v2([short]) == {PoolName.INDEXER: [False] * 3}
    assert b._pools["indexer"].store.stats()["keys"] == 0
    assert b.batch_get_v2([PoolTransfer(PoolName.DRAFT, host_indices=kv_idx(3), keys=hs)]) == \
        {PoolName.DRAFT: [False] * 3}
    r = b.batch_exists_v2(hs, [PoolTransfer(PoolName.DRAFT)])
    assert r.kv_hit_pages == 0
    with pytest.raises(ValueError, match="registered already"):
        b.register_mem_host_pool_v2(MambaHostPool(), PoolName.MAMBA)
    b.register_mem_host_pool_v2(g.mamba, PoolName.MAMBA)  # the same pool again: nothing
    b.close()
    with pytest.raises(Exception, match="closed"):
        b.register_mem_host_pool_v2(IndexerHostPool(), PoolName.DRAFT_INDEXER)


def test_duck_typed_names_and_kv_through_v2(tmp_path):
    """Plain strings for names and policies (no SGLang types); KV by name
    goes through the v1 path."""
    b = KvpageHiCacheStorage(config(tmp_path), {})
    kv, mamba = MHAHostPool(), MambaHostPool()
    gen = torch.Generator().manual_seed(3)
    b.register_mem_host_pool_v2(kv, "kv")
    b.register_mem_host_pool_v2(mamba, "mamba")
    hs = hashes(2)
    for p in range(2):
        kv.fill(p * PS, gen)
    mamba.fill(1, gen)
    want_kv, want_m = [kv.page_bytes(p * PS) for p in range(2)], mamba.page_bytes(1)
    T = types.SimpleNamespace
    res = b.batch_set_v2([T(name="kv", keys=hs, host_indices=kv_idx(2)),
                          T(name="mamba", keys=hs[1:], host_indices=torch.tensor([1]))])
    assert res == {"kv": [True, True], "mamba": [True]}
    r = b.batch_exists_v2(hs, [T(name="mamba", keys=["x"], hit_policy="trailing_pages")])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (2, {"kv": 2, "mamba": 2})
    kv.zero()
    mamba.zero()
    res = b.batch_get_v2([T(name="kv", keys=hs, host_indices=kv_idx(2, first=3)),
                          T(name="mamba", keys=hs[1:], host_indices=[6])])
    assert res == {"kv": [True, True], "mamba": [True]}
    assert all(np.array_equal(kv.page_bytes((3 + p) * PS), want_kv[p]) for p in range(2))
    assert np.array_equal(mamba.page_bytes(6), want_m)
    b.close()


def test_layer_first_pool_goes_through_flat_pages(tmp_path):
    b = KvpageHiCacheStorage(config(tmp_path), {})
    b.register_mem_pool_host(MHAHostPool())
    ix = IndexerHostPool(layout="layer_first")
    b.register_mem_host_pool_v2(ix, PoolName.INDEXER)
    assert b._pools["indexer"].mode == "flat"
    gen = torch.Generator().manual_seed(4)
    for p in range(3):
        ix.fill(p * PS, gen)
    want = [ix.page_bytes(p * PS) for p in range(3)]
    hs = hashes(3)
    t = PoolTransfer(PoolName.INDEXER, host_indices=kv_idx(3), keys=hs)
    assert b.batch_set_v2([t]) == {PoolName.INDEXER: [True] * 3}
    ix.zero()
    t = PoolTransfer(PoolName.INDEXER, host_indices=kv_idx(3, first=5), keys=hs)
    assert b.batch_get_v2([t]) == {PoolName.INDEXER: [True] * 3}
    assert all(np.array_equal(ix.page_bytes((5 + p) * PS), want[p]) for p in range(3))
    # a miss leaves its host page as it was
    ix.fill(9 * PS, gen)
    before = ix.page_bytes(9 * PS)
    t = PoolTransfer(PoolName.INDEXER, host_indices=kv_idx(2, first=8), keys=[hs[0], "absent"])
    assert b.batch_get_v2([t]) == {PoolName.INDEXER: [True, False]}
    assert np.array_equal(ix.page_bytes(8 * PS), want[0])
    assert np.array_equal(ix.page_bytes(9 * PS), before)
    b.close()


def test_staged_miss_leaves_the_slot_alone(tmp_path):
    b, c, g, hs, want = written(tmp_path, n=3)
    g.mamba.fill(6, torch.Generator().manual_seed(9))
    before = g.mamba.page_bytes(6)
    t = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([5, 6]), keys=[hs[2], hs[1]])
    assert b.batch_get_v2([t]) == {PoolName.MAMBA: [True, False]}
    assert np.array_equal(g.mamba.page_bytes(5), want["mamba"])
    assert np.array_equal(g.mamba.page_bytes(6), before)
    b.close()


def test_mamba_vec_and_staged_modes_store_the_same_bytes(tmp_path, monkeypatch):
    """A Mamba slot moves zero copy (vec); a page of more pointers than a
    page may take keeps the staging copy (forced here): the same bytes."""
    b, c, g, hs, want = written(tmp_path / "vec", n=3)
    assert b._pools["mamba"].mode == "vec"
    b.close()
    monkeypatch.setattr(_sglang_pools, "MAX_SEGMENTS", 1)
    b, c, g, hs, want_staged = written(tmp_path / "staged", n=3)
    assert b._pools["mamba"].mode == "staged"
    assert np.array_equal(want_staged["mamba"], want["mamba"])
    t = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([5]), keys=[hs[2]])
    assert b.batch_get_v2([t]) == {PoolName.MAMBA: [True]}
    assert np.array_equal(g.mamba.page_bytes(5), want["mamba"])
    b.close()


def test_clear_forgets_every_pool(tmp_path):
    b, c, g, hs, _ = written(tmp_path, n=3)
    b.clear()
    assert c.hit_query(hs)[0] == 0
    assert all(p.store.stats()["keys"] == 0 for p in b._pools.values())
    b.close()


def test_embedded_metadata_survives_a_restart(tmp_path):
    b, c, g, hs, want = written(tmp_path, n=4)
    b.close()
    b2, c2, g2 = controller(tmp_path)
    assert c2.hit_query(hs)[0] == 4
    done, hits = c2.prefetch(hs, kv_idx(4), {PoolName.MAMBA: [0], PoolName.SWA: [0, 1]})
    assert done == 4 and hits == {PoolName.MAMBA: 1, PoolName.SWA: 2}
    assert np.array_equal(g2.mamba.page_bytes(0), want["mamba"])
    b2.close()


def test_mla_ranks(tmp_path, server):
    """MLA: KV and the indexer are rank 0's one copy; Mamba state is every
    rank's own (its own file and metadata rank)."""
    url = server.url("/ns/mla")
    groups = [Group(kv=MLAHostPool(), swa=MLAHostPool(), seed=r) for r in (0, 1)]
    ctl = [controller(tmp_path, groups[r], tp_rank=r, tp_size=2, mla=True, metadata_url=url)
           for r in (0, 1)]
    b0, b1 = ctl[0][0], ctl[1][0]
    assert b1._pools["mamba"].path == str(tmp_path / "hc.1.bin.mamba")
    assert b1._pools["indexer"].path == str(tmp_path / "hc.0.bin.indexer")
    assert not b1._pools["indexer"].writer and b1._pools["mamba"].writer
    assert not os.path.exists(tmp_path / "hc.1.bin.indexer")
    hs = hashes(3)
    want = []
    for r in (1, 0):  # rank 1 first: it writes only its Mamba state
        g = groups[r]
        g.fill(3, 2, [1, 2])
        want.insert(0, (g.mamba.page_bytes(2), [g.indexer.page_bytes(p * PS) for p in range(3)]))
        res, done = ctl[r][1].backup(hs, kv_idx(3), {PoolName.MAMBA: [2], PoolName.SWA: [1, 2]})
        assert res[PoolName.MAMBA] == [True] and done == (3 if r == 0 else 0)
        if r == 1:
            assert PoolName.INDEXER not in res and b0.batch_exists(hs) == 0
    assert b1._pools["mamba"].store.stats()["stored"] == 1
    assert b1._pools["indexer"].store.stats()["stored"] == 0
    assert not np.array_equal(want[0][0], want[1][0])
    for r in (0, 1):
        g = groups[r]
        g.zero()
        assert ctl[r][1].hit_query(hs)[0] == 3
        done, hits = ctl[r][1].prefetch(hs, kv_idx(3, first=4), {PoolName.MAMBA: [7],
                                                                  PoolName.SWA: [5, 6]})
        assert done == 3 and hits == {PoolName.MAMBA: 1, PoolName.SWA: 2}
        assert np.array_equal(g.mamba.page_bytes(7), want[r][0]), r  # its own state
        for p in range(3):  # rank 0's indexer pages on both ranks
            assert np.array_equal(g.indexer.page_bytes((4 + p) * PS), want[0][1][p]), (r, p)
    b1.clear()  # a reader clears its own Mamba state, not the one copy
    assert b0.batch_exists_v2(hs, [PoolTransfer(PoolName.INDEXER)]).kv_hit_pages == 3
    assert b1._pools["mamba"].store.stats()["keys"] == 0
    b0.close()
    b1.close()


def test_stock_hf3fs_naming_on_a_server(tmp_path, server):
    """What SGLang's hf3fs backend would find: file {file}.{pool}, namespace
    {pool}, key {key}_{pool}, the flat page at page index * bytes_per_page."""
    url = server.url("/ns/stock")
    b, c, g, hs, want = written(tmp_path, n=3, metadata_url=url)
    cl = server.client("/ns/stock")
    for tag, keys, pages in (("mamba", [hs[2]], [want["mamba"]]),
                             ("indexer", hs, want["indexer"])):
        body = {"keys": [f"{k}_{tag}" for k in keys], "namespace": tag}
        r = cl.post("/0/exists", body)
        assert r.status_code == 200 and r.json()["exists"] == [True] * len(keys)
        idx = cl.post("/0/get_page_indices", body).json()["indices"]
        bpp = b._pools[tag].bytes_per_page
        with open(tmp_path / f"hc.0.bin.{tag}", "rb") as f:
            for i, page in zip(idx, pages):
                f.seek(i * bpp)
                assert f.read(bpp) == page.tobytes(), (tag, i)
    body = {"keys": [f"{hs[0]}-k", f"{hs[0]}-v"], "namespace": "kv"}
    assert cl.post("/0/exists", body).json()["exists"] == [True, True]  # SGLang's MHA keys
    ik, iv = cl.post("/0/get_page_indices", body).json()["indices"]
    half = len(want["kv"][0]) // 2  # K then V
    with open(tmp_path / "hc.0.bin", "rb") as f:
        f.seek(ik * half)
        assert f.read(half) == want["kv"][0][:half].tobytes()
        f.seek(iv * half)
        assert f.read(half) == want["kv"][0][half:].tobytes()
    b.close()


def stock_write(cl, path, namespace, key, data, bpp):
    """What SGLang's hf3fs backend does to store one page: reserve on the
    pool's namespace, write the page at index x bytes_per_page, confirm."""
    r = cl.post("/0/reserve_and_allocate_page_indices",
                {"keys": [[key, ""]], "namespace": namespace})
    assert r.status_code == 200, r.text
    (_, idx), = r.json()["indices"]
    with open(path, "r+b") as f:
        f.seek(idx * bpp)
        f.write(data)
    r = cl.post("/0/confirm_write", {"written_keys_to_confirm": [[key, idx]],
                                     "pages_to_release": [], "namespace": namespace})
    assert r.status_code in (200, 204), r.text


@pytest.mark.parametrize("tags", [False, True])
def test_stock_written_pages_are_read(tmp_path, server, tags):
    """KV and Mamba pages written as SGLang's hf3fs backend writes them, on
    files and a server kvpage.sglang opened before, are read back with tags
    off ("tags": false). With tags on (the default) they are misses: a page
    that a client writing no tag put in a file made with its tags is one
    kvpage cannot tell from a stray write (README, "Every page verified")."""
    url = server.url("/ns/switch")
    b, c, g = controller(tmp_path, metadata_url=url, tags=tags)
    gen = torch.Generator().manual_seed(7)
    g.mamba.fill(4, gen)
    g.kv.fill(2 * PS, gen)
    mamba, kv = g.mamba.page_bytes(4), g.kv.get_data_page(2 * PS, flat=False)
    kv_want = g.kv.page_bytes(2 * PS)
    b.close()
    cl = server.client("/ns/switch")
    key = hashes(1)[0]
    stock_write(cl, tmp_path / "hc.0.bin.mamba", "mamba", f"{key}_mamba", mamba.tobytes(),
                g.mamba.get_ksize_per_token())
    kbpp = g.kv.get_ksize_per_token() * PS
    for half, suffix in ((0, "-k"), (1, "-v")):
        stock_write(cl, tmp_path / "hc.0.bin", "kv", f"{key}{suffix}",
                    kv[half].contiguous().view(torch.uint8).numpy().tobytes(), kbpp)
    b2, c2, g2 = controller(tmp_path, metadata_url=url, tags=tags)
    t = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([2]), keys=[key])
    assert b2.batch_get_v2([t]) == {PoolName.MAMBA: [not tags]}
    assert np.array_equal(g2.mamba.page_bytes(2), mamba) is not tags
    assert b2.batch_get_v1([key], kv_idx(1, first=5)) == [not tags]
    assert np.array_equal(g2.kv.page_bytes(5 * PS), kv_want) is not tags
    b2.close()


def test_hit_boundary():
    hb = _sglang_pools.hit_boundary
    assert hb([True, True, False, True], "all_pages", 1) == 2
    assert hb([True, True, False, True], "trailing_pages", 1) == 4
    assert hb([True, True, False, True], "trailing_pages", 2) == 2
    assert hb([False, True, True], "trailing_pages", 5) == 0
    assert hb([], "trailing_pages", 1) == 0


def test_two_ranks_on_a_persistent_server(tmp_path, start_server):
    """TP 2 (not MLA) over one kvpage serve with a data directory: each rank
    its own files and metadata rank for every pool, per-rank counting; a
    backend started again finds its pools' pages."""
    srv = start_server("--data-dir", str(tmp_path / "srv"))
    url = srv.url("/ns/hybrid-tp2")
    groups = [Group(seed=10 + r) for r in (0, 1)]
    ctl = [controller(tmp_path, groups[r], tp_rank=r, tp_size=2, metadata_url=url) for r in (0, 1)]
    for suffix in ("", ".mamba", ".swa", ".indexer"):
        assert os.path.exists(tmp_path / f"hc.1.bin{suffix}"), suffix
    hs = hashes(4)
    g0 = groups[0]
    g0.fill(4, 1, [2, 3])
    want = (g0.mamba.page_bytes(1), [g0.indexer.page_bytes(p * PS) for p in range(4)])
    ctl[0][1].backup(hs, kv_idx(4), {PoolName.MAMBA: [1], PoolName.SWA: [2, 3]})
    assert ctl[0][1].hit_query(hs)[0] == 4 and ctl[1][1].hit_query(hs)[0] == 0
    for b, _, _ in ctl:
        b.close()
    b, c, g = controller(tmp_path, tp_rank=0, tp_size=2, metadata_url=url)
    assert c.hit_query(hs)[0] == 4
    done, hits = c.prefetch(hs, kv_idx(4, first=4), {PoolName.MAMBA: [8], PoolName.SWA: [9, 10]})
    assert done == 4 and hits == {PoolName.MAMBA: 1, PoolName.SWA: 2}
    assert np.array_equal(g.mamba.page_bytes(8), want[0])
    assert all(np.array_equal(g.indexer.page_bytes((4 + p) * PS), want[1][p]) for p in range(4))
    b.close()


def test_every_pool_name(tmp_path):
    """Every PoolName SGLang has besides KV is a pool of its own file,
    namespace and keys, and round-trips a page."""
    b = KvpageHiCacheStorage(config(tmp_path, file_size=1 << 16), {})
    b.register_mem_pool_host(MHAHostPool())
    names = [n for n in PoolName if n is not PoolName.KV]
    pools = {n: IndexerHostPool(slots=8) for n in names}
    gen = torch.Generator().manual_seed(5)
    for n, p in pools.items():
        b.register_mem_host_pool_v2(p, n)
        p.fill(0, gen)
    hs = hashes(1)
    want = {n: p.page_bytes(0) for n, p in pools.items()}
    res = b.batch_set_v2([PoolTransfer(n, host_indices=kv_idx(1), keys=hs) for n in names])
    assert res == {n: [True] for n in names}
    for n, p in pools.items():
        p.zero()
        assert os.path.exists(tmp_path / f"hc.0.bin.{n.value}")
    res = b.batch_get_v2([PoolTransfer(n, host_indices=kv_idx(1, first=1), keys=hs) for n in names])
    assert res == {n: [True] for n in names}
    assert all(np.array_equal(p.page_bytes(PS), want[n]) for n, p in pools.items())
    b.close()


@pytest.fixture
def sglang_importable(monkeypatch):
    """sglang.srt.mem_cache.hicache_storage importable (the stand-ins), and
    kvpage's SGLang modules imported again over it; again without it after."""
    mods = {}
    for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache"):
        mods[name] = types.ModuleType(name)
    mods["sglang.srt.mem_cache.hicache_storage"] = sglang_v2_standins
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    importlib.reload(_sglang_pools)
    importlib.reload(kvpage.sglang)
    yield kvpage.sglang.KvpageHiCacheStorage
    monkeypatch.undo()
    importlib.reload(_sglang_pools)
    importlib.reload(kvpage.sglang)


def test_with_sglang_importable_its_types_are_used(tmp_path, sglang_importable):
    cls = sglang_importable
    assert issubclass(cls, sglang_v2_standins.HiCacheStorage)
    b = cls(config(tmp_path), {})
    g = Group()
    c = HybridController(b, g.kv, g.entries, PS)
    hs = hashes(2)
    g.fill(2, 0, [0, 1])
    c.backup(hs, kv_idx(2), {PoolName.MAMBA: [0], PoolName.SWA: [0, 1]})
    r = b.batch_exists_v2(hs, [PoolTransfer(PoolName.MAMBA, keys=["__placeholder__"],
                                            hit_policy=TRAIL)])
    assert type(r) is sglang_v2_standins.PoolTransferResult
    assert r == sglang_v2_standins.PoolTransferResult(2, {PoolName.KV: 2, PoolName.MAMBA: 2})
    assert [type(k) for k in r.extra_pool_hit_pages] == [PoolName, PoolName]
    b.close()


def test_without_sglang_the_module_still_imports():
    assert _sglang_pools._Result is None and kvpage.sglang._Base is object
    r = _sglang_pools.transfer_result(1, {"kv": 1})
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (1, {"kv": 1})


def test_backup_and_prefetch_threads_at_once(tmp_path):
    """SGLang's backup and prefetch threads call the backend at the same
    time: staged pages of one never land in the other's slots."""
    import threading
    b, c, g = controller(tmp_path)
    m = g.mamba
    gen = torch.Generator().manual_seed(11)
    ka, kb = hashes(4, "a"), hashes(4, "b")
    for s in range(8):
        m.fill(s, gen)
    want_b = [m.page_bytes(4 + i) for i in range(4)]
    assert b.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.arange(4, 8),
                                        keys=kb)]) == {PoolName.MAMBA: [True] * 4}
    errors = []

    def backup():
        for _ in range(40):
            r = b.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.arange(0, 4),
                                             keys=ka)])
            b._pools["mamba"].store.delete(b._pools["mamba"].store_keys(ka))
            if r != {PoolName.MAMBA: [True] * 4}:
                errors.append(r)

    def prefetch():
        for _ in range(40):
            r = b.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.arange(8, 12),
                                             keys=kb)])
            if r != {PoolName.MAMBA: [True] * 4}:
                errors.append(r)
            for i in range(4):
                if not np.array_equal(m.page_bytes(8 + i), want_b[i]):
                    errors.append(f"slot {8 + i}")

    th = [threading.Thread(target=backup), threading.Thread(target=prefetch)]
    [t.start() for t in th]
    [t.join() for t in th]
    assert errors == []
    b.close()


def test_deepseek_v4_logical_anchor_and_paged_pools(tmp_path, server):
    """DeepSeek-V4: the KV pool is a logical anchor (no bytes; a marker page
    per key records which prefixes were backed up), the data is in the paged
    pools (zero copy in page_first, flat pages in layer_first)."""
    url = server.url("/ns/dsv4")
    kv = LogicalHostPool()
    c4 = DeepSeekV4PagedHostPool(layout="page_first")
    c4i = DeepSeekV4PagedHostPool(layers=2, item_bytes=24, layout="layer_first")
    entries = [PoolEntry(PoolName.DEEPSEEK_V4_C4, c4, ALL, PoolName.KV),
               PoolEntry(PoolName.DEEPSEEK_V4_C4_INDEXER, c4i, ALL, PoolName.KV)]
    b = KvpageHiCacheStorage(config(tmp_path, tp_rank=0, tp_size=2, mla=True, metadata_url=url,
                                    anchor_pages=64), {})
    c = HybridController(b, kv, entries, PS)
    assert b.logical and b.bytes_per_page == _sglang_pools.MARKER_BYTES
    assert os.path.getsize(tmp_path / "hc.0.bin") == 64 * _sglang_pools.MARKER_BYTES
    assert {t: (p.mode, p.bytes_per_page) for t, p in b._pools.items()} == \
        {"deepseek_v4_c4": ("ptr", 3 * 40), "deepseek_v4_c4_indexer": ("flat", 2 * 24)}
    hs = hashes(4)
    assert c.hit_query(hs)[0] == 0
    gen = torch.Generator().manual_seed(12)
    for p in range(4):
        c4.fill(p * PS, gen)
        c4i.fill(p * PS, gen)
    want = [(c4.page_bytes(p * PS), c4i.page_bytes(p * PS)) for p in range(4)]
    res, done = c.backup(hs, kv_idx(4), {})
    assert done == 4 and res == {PoolName.DEEPSEEK_V4_C4: [True] * 4,
                                 PoolName.DEEPSEEK_V4_C4_INDEXER: [True] * 4}
    c4.zero()
    c4i.zero()
    # rank 1 of the same (rank-replicated) model reads rank 0's one copy
    b1 = KvpageHiCacheStorage(config(tmp_path, tp_rank=1, tp_size=2, mla=True, metadata_url=url,
                                     anchor_pages=64), {})
    c1 = HybridController(b1, LogicalHostPool(), entries, PS, tp_rank=1, is_mla=True)
    assert c1.hit_query(hs)[0] == 4 and c1.hit_query(hs + hashes(1, "x"))[0] == 4
    done, hits = c1.prefetch(hs, kv_idx(4, first=5), {})
    assert done == 4 and hits == {}
    for p in range(4):
        assert np.array_equal(c4.page_bytes((5 + p) * PS), want[p][0]), p
        assert np.array_equal(c4i.page_bytes((5 + p) * PS), want[p][1]), p
    # a marker is only taken for its own key
    st = b.store
    st.delete([hs[3]])
    st.put([hs[3]], [bytearray(_sglang_pools._marker(hs[0]))])
    assert b.batch_get_v1(hs, kv_idx(4)) == [True, True, True, False]
    assert b.batch_get([hs[1]])[0] is not None and b.batch_get([hs[3]]) == [None]  # v0 too
    b1.close()
    b.close()
