"""Stand-ins of SGLang's HiCache storage v2 (hybrid models), written from
SGLang's code, which is not installed here (sgl-project/sglang):

- python/sglang/srt/mem_cache/hicache_storage.py @ 001067fffe33427bee0ed2f007fb7551a1d76b44:
  PoolName, PoolHitPolicy, PoolTransfer, HiCacheStorageExtraInfo,
  PoolTransferResult, count_pool_hits, STORAGE_BATCH_SIZE;
- python/sglang/srt/mem_cache/pool_host/mamba.py @ 02f0c2a0f8e4540dd6484b74f3d5b4ea4509f206:
  MambaHostPool (MambaPoolHost: page size 1, one slot = temporal state plus
  every conv state, each buffer (slots, layers, 1, *shape); get_data_page is
  a concatenated copy; get_page_buffer_meta: temporal, then conv pointers);
- python/sglang/srt/mem_cache/pool_host/mha.py @ 0047d999bb3a3ad311df5a4b6356bfb5586e0d66:
  MHAHostPool (MHATokenToKVPoolHost, page_first: kv_buffer (2, size,
  layers, heads, dim); get_page_buffer_meta: a K and a V pointer per page);
- python/sglang/srt/mem_cache/pool_host/dsa.py @ 03ba7b5b7dd249244bd5af01b236fd6449c66e8d:
  IndexerHostPool (DSAIndexerPoolHost: uint8 (pages, layers, 1, stride) in
  page_first, (layers, pages, stride) in layer_first; one pointer per page);
- python/sglang/srt/mem_cache/memory_pool_host.py @ 00343773d3293d382f0b39101f36b656d30ad2f0:
  LogicalHostPool (DeepSeek-V4's KV anchor: page indices, no bytes,
  get_ksize_per_token() 0) and DeepSeekV4PagedHostPool (uint8 rows of
  item_bytes per layer, (pages, layers, item_bytes) in page_first, a list of
  (pages, item_bytes) per layer in layer_first; page_size = slot_page_size);
- python/sglang/srt/managers/cache_controller.py @ 001067fffe33427bee0ed2f007fb7551a1d76b44
  and python/sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py
  @ 00343773d3293d382f0b39101f36b656d30ad2f0: HybridController, the calls
  the hybrid controller makes of the backend (attach, backup, hit query,
  prefetch), without threads, GPUs or the all-reduce over ranks.
- python/sglang/srt/mem_cache/storage/hf3fs/storage_hf3fs.py
  @ 01f5f368b4eaf5312316f75046ba3b1ea3c12fd4 (its naming, for the tests of
  switching between it and kvpage)."""
import ctypes
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

import numpy as np
import torch

STORAGE_BATCH_SIZE = 128


class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"
    DEEPSEEK_V4_C4 = "deepseek_v4_c4"
    DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
    DEEPSEEK_V4_C128 = "deepseek_v4_c128"
    DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
    DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
    DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"

    def __str__(self):
        return self.value


class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict = field(default_factory=dict)


class HiCacheStorage(ABC):
    """The base class SGLang's dynamic backend requires: v0 abstract, v1 and
    v2 NotImplementedError, register_mem_host_pool_v2 keeps registered_pools."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None):
        pass

    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        pass

    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None):
        pass

    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        pass

    @abstractmethod
    def exists(self, key):
        pass


def count_pool_hits(results):
    return {name: (rs.index(False) if False in rs else len(rs)) for name, rs in results.items()}


def _isz(dtype):
    """dtype.itemsize (Debian's torch has no torch.dtype.itemsize)."""
    return torch.empty((), dtype=dtype).element_size()


def _fill(t, gen):
    t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=gen,
                                            dtype=torch.uint8))


class MHAHostPool:
    """MHATokenToKVPoolHost, page_first: a KV pool, an SWA pool, an MHA draft."""

    def __init__(self, slots=64, page_size=4, layers=3, heads=2, dim=8, dtype=torch.float16):
        self.page_size, self.layout, self.dtype = page_size, "page_first", dtype
        self.layer_num, self.head_num, self.head_dim, self.size = layers, heads, dim, slots
        self.kv_buffer = torch.zeros(2, slots, layers, heads, dim, dtype=dtype)

    def get_size_per_token(self):
        return self.head_dim * self.head_num * self.layer_num * _isz(self.dtype) * 2

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[:, index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(2, self.layer_num, self.page_size, self.head_num, self.head_dim,
                           dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[:, index:index + self.page_size] = data_page.reshape(
            2, self.page_size, self.layer_num, self.head_num, self.head_dim)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        item = self.layer_num * self.head_num * self.head_dim * _isz(self.dtype)
        v_off = self.size * item
        base = self.kv_buffer.data_ptr()
        ptrs = []
        idx = indices.tolist()
        for i in range(0, len(idx), self.page_size):
            ptrs += [base + idx[i] * item, base + idx[i] * item + v_off]
        return ptrs, [item * self.page_size] * len(ptrs)

    def page_bytes(self, index):
        """The bytes of the page at index, K then V (what the tests compare)."""
        return self.get_data_page(index, flat=True).view(torch.uint8).numpy().copy()

    def fill(self, index, gen):
        _fill(self.kv_buffer[:, index:index + self.page_size], gen)

    def zero(self):
        self.kv_buffer.zero_()


class MLAHostPool(MHAHostPool):
    """MLA host pool, page_first: kv_buffer (size, layers, 1, dim), the latent."""

    def __init__(self, slots=64, page_size=4, layers=3, dim=16, dtype=torch.float16):
        self.page_size, self.layout, self.dtype = page_size, "page_first", dtype
        self.layer_num, self.head_dim, self.size = layers, dim, slots
        self.kv_buffer = torch.zeros(slots, layers, 1, dim, dtype=dtype)

    def get_size_per_token(self):
        return self.head_dim * self.layer_num * _isz(self.dtype)

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.page_size * self.layer_num * self.head_dim, dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[index:index + self.page_size] = data_page.reshape(
            self.page_size, self.layer_num, 1, self.head_dim)

    def get_page_buffer_meta(self, indices):
        item = self.layer_num * self.head_dim * _isz(self.dtype)
        idx = indices.tolist()
        ptrs = [self.kv_buffer.data_ptr() + idx[i] * item for i in range(0, len(idx), self.page_size)]
        return ptrs, [item * self.page_size] * len(ptrs)

    def fill(self, index, gen):
        _fill(self.kv_buffer[index:index + self.page_size], gen)


class MambaHostPool:
    """MambaPoolHost: page size 1; a slot is the temporal state of every
    layer, then each conv state of every layer."""

    def __init__(self, slots=16, layers=2, temporal=(2, 4, 4), convs=((3, 8), (3, 4)),
                 temporal_dtype=torch.float32, conv_dtype=torch.float16):
        self.page_size, self.layout, self.size = 1, "page_first", slots
        self.num_mamba_layers = layers
        self.temporal_state_shape, self.conv_state_shapes = tuple(temporal), [tuple(c) for c in convs]
        self.temporal_dtype, self.conv_dtype = temporal_dtype, conv_dtype
        self.dtype = conv_dtype
        self.temporal_state_elem_size = int(np.prod(temporal))
        self.conv_state_elem_sizes = [int(np.prod(c)) for c in convs]
        self.temporal_buffer = torch.zeros((slots, layers, 1) + tuple(temporal), dtype=temporal_dtype)
        self.conv_buffer = [torch.zeros((slots, layers, 1) + tuple(c), dtype=conv_dtype) for c in convs]
        self.size_per_token = self.get_size_per_token()

    def get_size_per_token(self):
        conv = sum(n * _isz(self.conv_dtype) for n in self.conv_state_elem_sizes)
        return (conv + self.temporal_state_elem_size * _isz(self.temporal_dtype)) \
            * self.num_mamba_layers

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def _iter_page_tensors(self, index):
        yield self.temporal_buffer[index]
        for c in self.conv_buffer:
            yield c[index]

    def get_data_page(self, index, flat=True):
        return torch.cat([t.contiguous().view(torch.uint8).reshape(-1)
                          for t in self._iter_page_tensors(index)])

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.page_size * self.size_per_token, dtype=torch.uint8)

    def set_from_flat_data_page(self, index, data_page):
        flat = data_page.contiguous().view(torch.uint8).reshape(-1)
        at = 0
        for t in self._iter_page_tensors(index):
            n = t.numel() * t.element_size()
            t.copy_(flat[at:at + n].view(t.dtype).reshape(t.shape))
            at += n

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        idx = indices.tolist()
        L = self.num_mamba_layers
        t_size = L * _isz(self.temporal_dtype) * self.temporal_state_elem_size
        c_sizes = [L * _isz(self.conv_dtype) * n for n in self.conv_state_elem_sizes]
        ptrs, sizes = [], []
        for i in range(0, len(idx), self.page_size):
            if self.temporal_state_elem_size > 0:
                ptrs.append(self.temporal_buffer.data_ptr() + idx[i] * t_size)
                sizes.append(t_size)
            for buf, cs in zip(self.conv_buffer, c_sizes):
                ptrs.append(buf.data_ptr() + idx[i] * cs)
                sizes.append(cs)
        return ptrs, sizes

    def page_bytes(self, index):
        return self.get_data_page(index).numpy().copy()

    def fill(self, index, gen):
        for t in self._iter_page_tensors(index):
            _fill(t, gen)

    def zero(self):
        self.temporal_buffer.zero_()
        for c in self.conv_buffer:
            c.zero_()


class IndexerHostPool:
    """DSAIndexerPoolHost: uint8 index keys and scales, pages of the KV
    pool's page size (its indices are the KV pool's)."""

    def __init__(self, slots=64, page_size=4, layers=3, bytes_per_token_per_layer=12,
                 layout="page_first"):
        self.page_size, self.layout, self.layer_num = page_size, layout, layers
        self.stride = page_size * bytes_per_token_per_layer
        self.bptl = bytes_per_token_per_layer
        pages = (slots + page_size + 1) // page_size
        shape = (pages, layers, 1, self.stride) if layout != "layer_first" else (layers, pages, self.stride)
        self.buffer = torch.zeros(shape, dtype=torch.uint8)

    def get_size_per_token(self):
        return self.bptl * self.layer_num

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def get_data_page(self, index, flat=True):
        p = int(index) // self.page_size
        page = self.buffer[:, p:p + 1] if self.layout == "layer_first" else self.buffer[p:p + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.layer_num * self.stride, dtype=torch.uint8)

    def set_from_flat_data_page(self, index, data_page):
        p = int(index) // self.page_size
        if self.layout == "layer_first":
            self.buffer[:, p:p + 1] = data_page.reshape(self.layer_num, 1, self.stride)
        else:
            self.buffer[p:p + 1] = data_page.reshape(1, self.layer_num, 1, self.stride)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        if self.layout not in ("page_first", "page_first_direct"):
            raise ValueError(f"Unsupported layout: {self.layout}")
        idx = indices.tolist()
        stride = self.layer_num * self.stride
        ptrs = [self.buffer.data_ptr() + (int(idx[i]) // self.page_size) * stride
                for i in range(0, len(idx), self.page_size)]
        return ptrs, [stride] * len(ptrs)

    def page_bytes(self, index):
        return self.get_data_page(index).numpy().copy()

    def fill(self, index, gen):
        _fill(self.get_data_page(index, flat=False), gen)

    def zero(self):
        self.buffer.zero_()


class LogicalHostPool:
    """DeepSeek-V4's KV anchor: page-aligned slots, no tensor."""

    def __init__(self, size=64, page_size=4, layout="layer_first"):
        self.size, self.page_size, self.layout = size, page_size, layout
        self.size_per_token = 0
        self.kv_buffer = None

    def get_data_page(self, index, flat=True):
        return torch.empty(0, dtype=torch.uint8)

    def get_dummy_flat_data_page(self):
        return torch.empty(0, dtype=torch.uint8)

    def set_from_flat_data_page(self, index, data_page):
        pass

    def get_page_buffer_meta(self, indices):
        return None

    def get_ksize_per_token(self):
        return 0

    def fill(self, index, gen):
        pass

    def zero(self):
        pass

    def page_bytes(self, index):
        return np.zeros(0, np.uint8)


class DeepSeekV4PagedHostPool:
    """A DeepSeek-V4 paged KV / indexer sub-pool: a page is a row of
    item_bytes in every layer."""

    def __init__(self, layers=3, item_bytes=40, num_host_pages=20, slot_page_size=4,
                 layout="page_first"):
        self.layer_num, self.item_bytes, self.slot_page_size = layers, item_bytes, slot_page_size
        self.page_size, self.layout, self.dtype = slot_page_size, layout, torch.uint8
        self.size = num_host_pages * slot_page_size
        if layout == "layer_first":
            self.kv_buffer = [torch.zeros(num_host_pages, item_bytes, dtype=torch.uint8)
                              for _ in range(layers)]
        else:
            self.kv_buffer = torch.zeros(num_host_pages, layers, item_bytes, dtype=torch.uint8)

    def get_size_per_token(self):
        return self.item_bytes

    def get_ksize_per_token(self):
        return self.item_bytes

    def get_data_page(self, index, flat=True):
        index = int(index) // self.slot_page_size
        if self.layout == "layer_first":
            page = torch.stack([self.kv_buffer[i][index] for i in range(self.layer_num)])
        else:
            page = self.kv_buffer[index]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.layer_num, self.item_bytes, dtype=torch.uint8).flatten()

    def set_from_flat_data_page(self, index, data_page):
        index = int(index) // self.slot_page_size
        data = data_page.view(torch.uint8).reshape(self.layer_num, self.item_bytes)
        if self.layout == "layer_first":
            for i in range(self.layer_num):
                self.kv_buffer[i][index].copy_(data[i])
        else:
            self.kv_buffer[index].copy_(data)

    def get_page_buffer_meta(self, indices):
        rows = (indices.reshape(-1, self.slot_page_size)[:, 0] // self.slot_page_size).tolist()
        if self.layout == "layer_first":
            ptrs = [self.kv_buffer[i].data_ptr() + int(r) * self.item_bytes
                    for r in rows for i in range(self.layer_num)]
            return ptrs, [self.item_bytes] * len(ptrs)
        ptrs = [self.kv_buffer[int(r)].data_ptr() for r in rows]
        return ptrs, [self.layer_num * self.item_bytes] * len(ptrs)

    def page_bytes(self, index):
        return self.get_data_page(index).numpy().copy()

    def fill(self, index, gen):
        index = int(index) // self.slot_page_size
        if self.layout == "layer_first":
            for b in self.kv_buffer:
                _fill(b[index], gen)
        else:
            _fill(self.kv_buffer[index], gen)

    def zero(self):
        for b in (self.kv_buffer if self.layout == "layer_first" else [self.kv_buffer]):
            b.zero_()


@dataclass
class PoolEntry:
    name: PoolName
    host_pool: Any
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    indices_from_pool: Optional[PoolName] = None
    window: int = 1  # TRAILING_PAGES pools: how many trailing pages (Mamba 1, SWA its window)


class HybridController:
    """The hybrid cache controller's calls of the storage backend, in its
    order (hybrid_cache_controller.py, cache_controller.py): attach (KV
    through register_mem_pool_host, then register_mem_host_pool_v2 for every
    entry), backup (batch_set_v2 of the sidecars that should be backed up,
    then KV in STORAGE_BATCH_SIZE batches through batch_set_v1 with
    HiCacheStorageExtraInfo(prefix_keys), prefix_keys grown after each
    call), the hit query (one batch_exists_v2 with the pool transfers, the
    trailing pools' keys placeholders) and the prefetch (KV batch by batch
    with batch_get_v1, KV-derived pools with batch_get_v2 on the KV host
    indices, then, only when KV loaded fully, the other pools with their
    trailing keys rewritten to the last hit hashes). One rank; the
    all-reduce over ranks is the caller's (min over the returned figures)."""

    def __init__(self, backend, kv_pool, entries, page_size, tp_rank=0, is_mla=False):
        self.backend, self.kv_pool, self.entries = backend, kv_pool, list(entries)
        self.page_size = page_size
        self.backup_skip = is_mla and tp_rank != 0
        backend.register_mem_pool_host(kv_pool)
        backend.register_mem_host_pool_v2(kv_pool, PoolName.KV)
        for e in self.entries:
            backend.register_mem_host_pool_v2(e.host_pool, e.name)

    def should_backup(self, transfer):
        return not self.backup_skip or transfer.name == PoolName.MAMBA

    def _sidecars(self, hashes, kv_host, slots):
        """The pool transfers of a node: KV-derived pools ride on KV's host
        indices and hashes; the others hold the trailing window, in the
        pages slots[name] of their pool."""
        out = []
        for e in self.entries:
            if e.indices_from_pool == PoolName.KV:
                out.append(PoolTransfer(e.name, host_indices=kv_host, keys=list(hashes),
                                        hit_policy=e.hit_policy, indices_from_pool=PoolName.KV))
            else:
                n = min(e.window, len(hashes))
                ps = e.host_pool.page_size
                idx = torch.cat([torch.arange(s * ps, (s + 1) * ps) for s in slots[e.name][-n:]])
                out.append(PoolTransfer(e.name, host_indices=idx, keys=list(hashes[-n:]),
                                        hit_policy=e.hit_policy))
        return out

    def backup(self, hashes, kv_host, slots, prefix_keys=None):
        """One write_storage: returns (sidecar results, KV pages written)."""
        transfers = [t for t in self._sidecars(hashes, kv_host, slots) if self.should_backup(t)]
        results = self.backend.batch_set_v2(transfers) if transfers else {}
        done = 0
        if not self.backup_skip:
            for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
                batch = hashes[i:i + STORAGE_BATCH_SIZE]
                host = kv_host[i * self.page_size:(i + len(batch)) * self.page_size]
                extra = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
                if not all(self.backend.batch_set_v1(batch, host, extra)):
                    break
                if prefix_keys:
                    prefix_keys += batch  # the controller's own list grows after the call
                done += len(batch)
        return results, done

    def hit_query(self, hashes, prefix_keys=None):
        """_storage_hit_query with pool transfers: the KV pages usable."""
        transfers = []
        for e in self.entries:  # the radix cache's keys: placeholders, a window's worth
            n = e.window if e.indices_from_pool is None else 1
            transfers.append(PoolTransfer(e.name, keys=["__placeholder__"] * n,
                                          hit_policy=e.hit_policy,
                                          indices_from_pool=e.indices_from_pool))
        extra = HiCacheStorageExtraInfo(prefix_keys=prefix_keys.copy() if prefix_keys else None)
        res = self.backend.batch_exists_v2(hashes, transfers, extra)
        return res.kv_hit_pages, res

    def prefetch(self, hashes, kv_host, slots, prefix_keys=None):
        """_page_transfer then _page_transfer_sidecar: (KV pages loaded,
        {pool: pages loaded} of the other pools)."""
        derived = [e for e in self.entries if e.indices_from_pool == PoolName.KV]
        completed, ok = 0, True
        for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
            if not ok:
                break
            batch = hashes[i:i + STORAGE_BATCH_SIZE]
            host = kv_host[i * self.page_size:(i + len(batch)) * self.page_size]
            extra = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            res = self.backend.batch_get_v1(batch, host, extra)
            kv_hits = res.index(False) if False in res else len(res)
            hits = [kv_hits]
            if derived:
                side = self.backend.batch_get_v2(
                    [PoolTransfer(e.name, host_indices=host, keys=batch) for e in derived])
                hits += list(count_pool_hits(side).values())
            got = min(hits)
            ok = got == len(batch)
            if prefix_keys:
                prefix_keys += batch
            completed += got
        pool_hits = {}
        if completed == len(hashes):
            others = [t for t in self._sidecars(hashes, kv_host, slots)
                      if t.indices_from_pool != PoolName.KV]
            for t in others:  # _sync_trailing_keys
                if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                    n = len(t.keys) if t.keys else 1
                    t.keys = hashes[max(0, completed - n):completed]
            pool_hits = count_pool_hits(self.backend.batch_get_v2(others))
        return completed, pool_hits


def raw_page(ptr, size):
    """size bytes at ptr (a pointer get_page_buffer_meta gave)."""
    return np.frombuffer((ctypes.c_char * size).from_address(ptr), np.uint8).copy()
