"""kvpage.sglang.KvpageHiCacheStorage against stand-ins of SGLang's host
memory pools and storage config, written from SGLang's published interface
(HiCacheStorage, HostKVCache.get_data_page / get_dummy_flat_data_page /
set_from_flat_data_page): SGLang itself is not installed here."""
import hashlib
import importlib
import os
import types

import numpy as np
import pytest
import torch

from kvpage.errors import KvpageError
from kvpage.sglang import KvpageHiCacheStorage

PS = 4           # tokens per page
LAYERS, HEADS, DIM = 3, 2, 8
DT = torch.float16


class MHAPageFirstPool:
    """kv_buffer (2, size, layers, heads, dim): a page's K and V are contiguous."""
    layout = "page_first"

    def __init__(self, size=64):
        self.page_size = PS
        self.kv_buffer = torch.zeros(2, size, LAYERS, HEADS, DIM, dtype=DT)
        self.calls = {"get_data_page": 0, "dummy": 0, "set_flat": 0}

    def get_ksize_per_token(self):
        return LAYERS * HEADS * DIM * self.kv_buffer.element_size()

    def get_size_per_token(self):
        return 2 * self.get_ksize_per_token()

    def get_data_page(self, index, flat=True):
        self.calls["get_data_page"] += 1
        page = self.kv_buffer[:, index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        self.calls["dummy"] += 1
        return torch.zeros(2 * PS * LAYERS * HEADS * DIM, dtype=DT)

    def set_from_flat_data_page(self, index, data_page):
        self.calls["set_flat"] += 1
        self.kv_buffer[:, index:index + self.page_size] = data_page.reshape(2, PS, LAYERS, HEADS, DIM)

    def page(self, index):
        return self.kv_buffer[:, index:index + self.page_size]


class MLAPageFirstPool(MHAPageFirstPool):
    """kv_buffer (size, layers, 1, dim): the whole latent of a page."""

    def __init__(self, size=64):
        self.page_size = PS
        self.kv_buffer = torch.zeros(size, LAYERS, 1, DIM, dtype=DT)
        self.calls = {"get_data_page": 0, "dummy": 0, "set_flat": 0}

    def get_ksize_per_token(self):
        return LAYERS * DIM * self.kv_buffer.element_size()

    def get_size_per_token(self):
        return self.get_ksize_per_token()

    def get_data_page(self, index, flat=True):
        self.calls["get_data_page"] += 1
        page = self.kv_buffer[index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        self.calls["dummy"] += 1
        return torch.zeros(PS * LAYERS * DIM, dtype=DT)

    def set_from_flat_data_page(self, index, data_page):
        self.calls["set_flat"] += 1
        self.kv_buffer[index:index + self.page_size] = data_page.reshape(PS, LAYERS, 1, DIM)

    def page(self, index):
        return self.kv_buffer[index:index + self.page_size]


class MHALayerFirstPool(MHAPageFirstPool):
    """kv_buffer (2, layers, size, heads, dim): pages are not contiguous."""
    layout = "layer_first"

    def __init__(self, size=64):
        super().__init__(size)
        self.kv_buffer = torch.zeros(2, LAYERS, size, HEADS, DIM, dtype=DT)

    def get_data_page(self, index, flat=True):
        self.calls["get_data_page"] += 1
        page = self.kv_buffer[:, :, index:index + self.page_size]
        return page.flatten() if flat else page

    def set_from_flat_data_page(self, index, data_page):
        self.calls["set_flat"] += 1
        self.kv_buffer[:, :, index:index + self.page_size] = data_page.reshape(2, LAYERS, PS, HEADS, DIM)

    def page(self, index):
        return self.kv_buffer[:, :, index:index + self.page_size]


def storage_config(tp_rank=0, tp_size=1, mla=False, **extra):
    return types.SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, is_mla_model=mla,
                                 is_page_first_layout=True, model_name="m", extra_config=extra)


def keys(n, salt="a"):
    return [hashlib.sha256(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def indices(pages, first=0):
    """host_indices of pages first..first+pages-1 (token indices)."""
    return torch.arange(first * PS, (first + pages) * PS, dtype=torch.int64)


def fill(pool, pages, first=0, seed=1):
    g = torch.Generator().manual_seed(seed)
    for p in range(first, first + pages):
        v = pool.page(p * PS)
        v.copy_(torch.randn(v.shape, generator=g, dtype=torch.float32).to(DT))


def raw(t):
    return t.contiguous().numpy().view(np.uint8).copy()


def backend(tmp_path, pool, name="hc", **kw):
    cfg = storage_config(**{k: kw.pop(k) for k in ("tp_rank", "tp_size", "mla") if k in kw},
                         file_path_prefix=str(tmp_path / name), file_size=kw.pop("file_size", 1 << 20),
                         **kw)
    b = KvpageHiCacheStorage(cfg, {})
    b.register_mem_pool_host(pool)
    return b


def set_then_get(b, pool, n, first):
    """n random pages at pages 0..n-1 set, the pool cleared, then got back at
    pages first..first+n-1, byte for byte."""
    ks = keys(n)
    fill(pool, n)
    want = [raw(pool.page(p * PS)) for p in range(n)]
    assert b.batch_set_v1(ks, indices(n)) == [True] * n
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(ks, indices(n, first=first)) == [True] * n
    for p in range(n):
        assert np.array_equal(raw(pool.page((first + p) * PS)), want[p]), p


def written(tmp_path, pool, n, **kw):
    """A backend over pool with n random pages at pages 0..n-1; their bytes."""
    b = backend(tmp_path, pool, **kw)
    fill(pool, n)
    return b, keys(n), [raw(pool.page(p * PS)) for p in range(n)]


def test_mha_page_first_zero_copy_round_trip(tmp_path):
    pool = MHAPageFirstPool()
    b = backend(tmp_path, pool)
    assert b.zero_copy and b.split_kv
    assert b.bytes_per_page == pool.get_ksize_per_token() * PS  # K only
    ks = keys(5)
    fill(pool, 5)
    want = [raw(pool.page(p * PS)) for p in range(5)]
    res = b.batch_set_v1(ks, indices(5))
    assert res == [True] * 5  # one result per page, not 2N
    # K and V are the keys "{key}-k" / "{key}-v"
    k_only = torch.zeros(PS, LAYERS, HEADS, DIM, dtype=DT)
    lead, _ = b.store.get([ks[3] + "-v"], [k_only])
    assert lead == 1 and torch.equal(k_only, pool.page(3 * PS)[1])
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(ks, indices(5, first=7)) == [True] * 5
    for p in range(5):
        assert np.array_equal(raw(pool.page((7 + p) * PS)), want[p]), p
    assert pool.calls["dummy"] == 0 and pool.calls["set_flat"] == 0  # zero copy
    assert b.batch_exists(ks) == 5
    b.close()


def test_mla_round_trip(tmp_path):
    pool = MLAPageFirstPool()
    b = backend(tmp_path, pool, mla=True)
    assert b.zero_copy and not b.split_kv and b.path.endswith("hc.0.bin")
    assert b.bytes_per_page == LAYERS * DIM * 2 * PS
    set_then_get(b, pool, 4, first=10)
    assert pool.calls["dummy"] == 0
    b.close()


def test_layer_first_flat_round_trip(tmp_path):
    pool = MHALayerFirstPool()
    b = backend(tmp_path, pool)
    assert not b.zero_copy and b.bytes_per_page == pool.get_size_per_token() * PS  # K+V
    ks = keys(3)
    fill(pool, 3)
    want = [raw(pool.page(p * PS)) for p in range(3)]
    assert b.batch_set_v1(ks, indices(3)) == [True, True, True]
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(ks, indices(3, first=5)) == [True, True, True]
    for p in range(3):
        assert np.array_equal(raw(pool.page((5 + p) * PS)), want[p])
    assert pool.calls["dummy"] == 3 and pool.calls["set_flat"] == 3
    b.close()


def test_flat_missing_key_in_middle_stops_there(tmp_path):
    pool = MHALayerFirstPool()
    b, ks, want = written(tmp_path, pool, 4)
    assert b.batch_set_v1(ks[:2] + ks[3:], torch.cat([indices(2), indices(1, first=3)])) == [True] * 3
    pool.kv_buffer.fill_(7.0)
    sentinel = raw(pool.page(0))
    assert b.batch_get_v1(ks, indices(4, first=8)) == [True, True, False, False]
    assert np.array_equal(raw(pool.page(8 * PS)), want[0])
    assert np.array_equal(raw(pool.page(9 * PS)), want[1])
    assert np.array_equal(raw(pool.page(10 * PS)), sentinel)  # the miss: untouched
    assert np.array_equal(raw(pool.page(11 * PS)), sentinel)  # after it: untouched
    assert b.batch_exists(ks) == 2
    b.close()


def test_zero_copy_missing_key_in_middle(tmp_path):
    pool = MHAPageFirstPool()
    b, ks, want = written(tmp_path, pool, 4)
    assert b.batch_set_v1(ks, indices(4)) == [True] * 4
    b.store.delete([ks[2] + "-v"])  # page 2 has K but not V
    pool.kv_buffer.fill_(3.0)
    sentinel_v = raw(pool.page(0)[1])
    res = b.batch_get_v1(ks, indices(4, first=8))
    assert res[:3] == [True, True, False]
    # the missing V was not touched; pages read land in their own slots
    assert np.array_equal(raw(pool.page(10 * PS)[1]), sentinel_v)
    assert np.array_equal(raw(pool.page(8 * PS)), want[0])
    assert res[3] and np.array_equal(raw(pool.page(11 * PS)), want[3])
    assert b.batch_exists(ks) == 2  # pairs: page 2's K alone does not count
    b.close()


def test_batch_exists_leading_run(tmp_path):
    pool = MLAPageFirstPool()
    b = backend(tmp_path, pool, mla=True)
    ks = keys(6)
    fill(pool, 6)
    assert b.batch_set_v1([ks[0], ks[1], ks[2], ks[4]], torch.cat([indices(3), indices(1, first=4)])) \
        == [True] * 4
    assert b.batch_exists(ks) == 3
    assert b.batch_exists(ks[3:]) == 0
    assert b.batch_exists([]) == 0
    assert b.exists(ks[4]) and not b.exists(ks[5])
    b.close()


def test_tp2_on_one_server(tmp_path, server):
    url = server.url("/ns/tp2")
    pools = [MHAPageFirstPool(), MHAPageFirstPool()]
    bs = [backend(tmp_path, pools[r], tp_rank=r, tp_size=2, metadata_url=url) for r in (0, 1)]
    assert [b.store.rank for b in bs] == [0, 1]
    assert os.path.exists(tmp_path / "hc.0.bin") and os.path.exists(tmp_path / "hc.1.bin")
    ks = keys(3)
    for r, (b, pool) in enumerate(zip(bs, pools)):
        fill(pool, 3, seed=10 + r)  # each rank's half of the heads differs
    want = [[raw(p.page(i * PS)) for i in range(3)] for p in pools]
    # rank 0 alone: per-rank counting, rank 1 does not see rank 0's pages
    assert bs[0].batch_set_v1(ks, indices(3)) == [True] * 3
    assert bs[0].batch_exists(ks) == 3 and bs[1].batch_exists(ks) == 0
    assert bs[1].batch_set_v1(ks, indices(3)) == [True] * 3
    assert bs[1].batch_exists(ks) == 3
    for r, (b, pool) in enumerate(zip(bs, pools)):
        pool.kv_buffer.zero_()
        assert b.batch_get_v1(ks, indices(3, first=4)) == [True] * 3
        for i in range(3):
            assert np.array_equal(raw(pool.page((4 + i) * PS)), want[r][i]), (r, i)
    assert not np.array_equal(want[0][0], want[1][0])
    for b in bs:
        b.close()


def test_mla_rank1_reads_rank0_and_never_writes(tmp_path, server):
    url = server.url("/ns/mla")
    p0, p1 = MLAPageFirstPool(), MLAPageFirstPool()
    b0 = backend(tmp_path, p0, tp_rank=0, tp_size=2, mla=True, metadata_url=url)
    b1 = backend(tmp_path, p1, tp_rank=1, tp_size=2, mla=True, metadata_url=url)
    assert b1.path == b0.path and b1.store.rank == 0 and not b1.writer
    assert not os.path.exists(tmp_path / "hc.1.bin")
    ks = keys(3)
    fill(p1, 3, seed=5)
    assert b1.batch_set_v1(ks, indices(3)) == [True] * 3  # skipped, as SGLang does
    assert b0.batch_exists(ks) == 0 and b1.store.stats()["stored"] == 0
    fill(p0, 3, seed=6)
    want = [raw(p0.page(i * PS)) for i in range(3)]
    assert b0.batch_set_v1(ks, indices(3)) == [True] * 3
    assert b1.batch_exists(ks) == 3
    assert b1.batch_get_v1(ks, indices(3, first=6)) == [True] * 3
    for i in range(3):
        assert np.array_equal(raw(p1.page((6 + i) * PS)), want[i])
    b1.clear()  # a reader does not clear the one copy
    assert b0.batch_exists(ks) == 3
    b0.close()
    b1.close()


def test_mla_multi_rank_needs_metadata_url(tmp_path):
    cfg = storage_config(tp_rank=1, tp_size=2, mla=True, file_path_prefix=str(tmp_path / "x"))
    with pytest.raises(ValueError, match="metadata_url"):
        KvpageHiCacheStorage(cfg, {})


def test_missing_prefix_is_refused():
    with pytest.raises(ValueError, match="file_path_prefix"):
        KvpageHiCacheStorage(storage_config(), {})


def test_clear(tmp_path):
    pool = MHAPageFirstPool()
    b = backend(tmp_path, pool)
    ks = keys(3)
    fill(pool, 3)
    assert b.batch_set_v1(ks, indices(3)) == [True] * 3
    assert b.batch_exists(ks) == 3
    b.clear()
    assert b.batch_exists(ks) == 0
    assert b.batch_get_v1(ks, indices(3, first=4)) == [False] * 3
    assert b.get_stats()["keys"] == 0
    b.close()


def test_close_twice(tmp_path):
    pool = MLAPageFirstPool()
    b = backend(tmp_path, pool, mla=True)
    assert b.get_stats()["num_pages"] == (1 << 20) // b.bytes_per_page
    b.close()
    b.close()
    assert b.get_stats() is None
    with pytest.raises(KvpageError, match="closed"):
        b.batch_exists(keys(1))
    with pytest.raises(KvpageError, match="closed"):
        b.register_mem_pool_host(pool)


def test_v0_interface(tmp_path):
    pool = MHAPageFirstPool()
    b = backend(tmp_path, pool)
    ks = keys(3)
    fill(pool, 3)
    flats = [pool.get_data_page(i * PS, flat=True) for i in range(3)]
    assert b.batch_set(ks[:2], flats[:2]) is True
    assert b.set(ks[2], flats[2]) is True
    got = b.batch_get(ks + keys(1, salt="miss"))
    assert got[3] is None
    for i in range(3):
        assert np.array_equal(raw(got[i]), raw(flats[i]))
    assert b.get(keys(1, salt="miss")[0]) is None
    t = torch.empty_like(flats[1])
    assert b.get(ks[1], t) is t and torch.equal(t, flats[1])
    # v0 pages are the v1 pages: K then V as "{key}-k", "{key}-v"
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(ks, indices(3, first=4)) == [True] * 3
    assert np.array_equal(raw(pool.page(5 * PS).flatten()), raw(flats[1]))
    b.close()


def test_dynamic_backend_construction(tmp_path):
    """What SGLang's dynamic backend does: import module_path, take
    class_name, cls(storage_config, {}), then register_mem_pool_host."""
    extra = {"backend_name": "kvpage", "module_path": "kvpage.sglang",
             "class_name": "KvpageHiCacheStorage", "interface_v1": 1,
             "file_path_prefix": str(tmp_path / "dyn"), "file_size": 1 << 20, "entries": 8,
             "durable": False}
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    b = cls(storage_config(**extra), {})
    assert b.store is None and not b.durable
    with pytest.raises(KvpageError, match="register_mem_pool_host"):
        b.batch_exists(keys(1))
    pool = MHAPageFirstPool()
    b.register_mem_pool_host(pool)
    assert b.path == str(tmp_path / "dyn.0.bin") and os.path.exists(b.path)
    fill(pool, 2)
    assert b.batch_set_v1(keys(2), indices(2)) == [True, True]
    assert b.batch_exists(keys(2)) == 2
    b.close()


def test_mmap_reads_key(tmp_path, monkeypatch):
    monkeypatch.delenv("KVPAGE_MMAP_READS", raising=False)
    pool = MHAPageFirstPool()
    b = backend(tmp_path, pool, mmap_reads="true")
    assert b.store.mmap_reads
    set_then_get(b, pool, 3, first=9)
    b.close()
    b = backend(tmp_path, pool, name="hc2")
    assert not b.store.mmap_reads
    b.close()


def test_prefix_directories_made_and_files_owned(tmp_path, server):
    """As SGLang's hf3fs backend, the prefix's missing directories are made
    (mkdir: false refuses them); a rank's file belongs to its metadata: a
    backend with another metadata_url on the same prefix is refused."""
    pool = MHAPageFirstPool()
    with pytest.raises(KvpageError) as e:
        backend(tmp_path, pool, name="no/dir/hc", mkdir=False)
    assert str(tmp_path / "no" / "dir") in str(e.value)
    assert not (tmp_path / "no").exists()
    b = backend(tmp_path, pool, name="new/dir/hc", metadata_url=server.url("/ns/a"))
    assert (tmp_path / "new" / "dir" / "hc.0.bin").exists()
    b.close()
    with pytest.raises(KvpageError) as e:
        backend(tmp_path, pool, name="new/dir/hc", metadata_url=server.url("/ns/b"))
    assert e.value.rule == "owner" and server.url("/ns/a") in str(e.value)
    backend(tmp_path, pool, name="new/dir/hc", metadata_url=server.url("/ns/a")).close()


def test_file_size_takes_size_strings(tmp_path):
    """"file_size": "1M" as every other kvpage size takes it, not only bytes."""
    pool = MHAPageFirstPool()
    b = backend(tmp_path, pool, file_size="1M", entries="8")
    assert b.file_size == 1 << 20 and b.entries == 8
    assert os.path.getsize(b.path) == 1 << 20
    ks = keys(2)
    fill(pool, 2)
    assert b.batch_set_v1(ks, indices(2)) == [True] * 2
    assert b.batch_exists(ks) == 2
    b.close()


@pytest.mark.parametrize("key,value", [("file_size", "1X"), ("file_size", "-1"),
                                       ("file_size", [1]), ("entries", "eight"),
                                       ("entries", -1), ("threads", "4M"),
                                       ("anchor_pages", 1.5)])
def test_bad_numeric_key_named(tmp_path, key, value):
    """A bad numeric key is refused at construction, naming the key and its
    value (not int()'s bare "invalid literal"), and nothing is created."""
    cfg = storage_config(file_path_prefix=str(tmp_path / "hc"), **{key: value})
    with pytest.raises(ValueError) as e:
        KvpageHiCacheStorage(cfg, {})
    assert f'extra_config "{key}"' in str(e.value) and repr(value) in str(e.value)
    assert os.listdir(tmp_path) == []
