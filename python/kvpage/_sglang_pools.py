"""kvpage.sglang's hybrid pools: SGLang's HiCache storage v2 (the pools
besides KV: mamba, swa, indexer, the draft and DeepSeek-V4 pools), one
kvpage.Store per pool, named as SGLang's own hf3fs backend names them
(storage/hf3fs/storage_hf3fs.py, PR #23241): the pool's file is
f"{rank file}.{pool}", its metadata namespace (kvpage's pool) is the pool's
name, its keys are f"{key}_{pool}".

How a pool's pages move (PoolIO.mode), from what its host pool offers:
  split   K and V halves in a page-first layout (an MHA pool: SWA, an MHA
          draft): zero copy, as kvpage.sglang's KV, keys f"{key}_{pool}-k"
          and "-v", each get_ksize_per_token() * page_size bytes;
  ptr     one pointer per page from get_page_buffer_meta (an indexer, an MLA
          draft, a conv-only Mamba slot): zero copy;
  vec     several pointers per page (a Mamba slot: temporal state, then each
          conv state): zero copy, the page file moves the pointers back to
          back into one page (kvp_store_putv / getv), in the order of
          get_data_page(flat=True), which is what SGLang's hf3fs backend stores;
  staged  as vec, for a page of more pointers than a page may take
          (kvpage.store.MAX_SEGMENTS): one copy through a staging page;
  flat    anything else (layer_first): get_data_page(flat=True) out,
          get_dummy_flat_data_page + set_from_flat_data_page in.
A page holds the pool's flat page (get_dummy_flat_data_page's bytes; an MHA
pool's K or V half): get_ksize_per_token() * page_size bytes, as SGLang's
hf3fs backend sizes it, for a Mamba slot, an indexer or an MLA-style pool.

Works with SGLang's types when SGLang is importable and with any objects of
the same attributes (name, keys, host_indices, hit_policy,
indices_from_pool) when it is not."""
import ctypes
import logging
import threading

from array import array

from kvpage.store import MAX_SEGMENTS, Store

try:  # SGLang's own types when it is installed
    from sglang.srt.mem_cache.hicache_storage import PoolName as _PoolName
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult as _Result
except Exception:  # SGLang is not installed: the module still imports
    _PoolName = _Result = None

logger = logging.getLogger("kvpage.sglang")

KV = "kv"
MAMBA = "mamba"
TRAILING_PAGES = "trailing_pages"
# The radix cache's MAMBA key on prefetch: never a page's key
PLACEHOLDER = "__placeholder__"
ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct")


class PoolTransferResult:
    """SGLang's PoolTransferResult when SGLang is not installed: kv_hit_pages
    (the usable prefix, the minimum over the pools) and extra_pool_hit_pages
    ({pool name: pages found})."""

    def __init__(self, kv_hit_pages, extra_pool_hit_pages):
        self.kv_hit_pages = kv_hit_pages
        self.extra_pool_hit_pages = extra_pool_hit_pages

    def __eq__(self, other):
        return (self.kv_hit_pages, self.extra_pool_hit_pages) == \
            (getattr(other, "kv_hit_pages", None), getattr(other, "extra_pool_hit_pages", None))

    def __repr__(self):
        return f"PoolTransferResult({self.kv_hit_pages}, {self.extra_pool_hit_pages})"


def transfer_result(kv_hit_pages, hits):
    return (_Result or PoolTransferResult)(kv_hit_pages, hits)


def kv_name():
    """The KV pool's name as SGLang's answers carry it."""
    return _PoolName.KV if _PoolName is not None else KV


def pool_tag(name):
    """A pool name (PoolName, or its string value) as a string: "mamba"."""
    return str(getattr(name, "value", name))


def hit_boundary(flags, policy, trailing):
    """The pages of the KV prefix this pool allows (SGLang's hit policies):
    ALL_PAGES, the leading run of flags; TRAILING_PAGES, the longest prefix
    p <= len(flags) whose last min(trailing, p) pages are all there."""
    if pool_tag(policy) != TRAILING_PAGES:
        return flags.index(False) if False in flags else len(flags)
    run = 0
    runs = []
    for f in flags:  # runs[i]: pages there ending at page i
        run = run + 1 if f else 0
        runs.append(run)
    trailing = max(1, trailing)
    for p in range(len(flags), 0, -1):
        if runs[p - 1] >= min(trailing, p):
            return p
    return 0


# DeepSeek-V4's KV pool is a logical anchor: page indices, no bytes (its
# data is in the v2 pools). Its store keeps one marker page per key, the
# key itself, so that "which prefixes were backed up" is an answer of the
# store like any other, and a marker is only ever taken for its own key.
MARKER_BYTES = 4096


def _marker(key):
    b = key.encode()
    return bytearray(b + bytes(MARKER_BYTES - len(b)))


def put_markers(store, keys):
    """Stores each key's marker page: True per key stored or there."""
    return [r >= 0 for r in store.put(list(keys), [_marker(k) for k in keys])]


def get_markers(store, keys):
    """True per key whose marker page is there and names it."""
    bufs = [bytearray(MARKER_BYTES) for _ in keys]
    _, res = store.get(list(keys), bufs)
    return [r == MARKER_BYTES and b == _marker(k) for k, r, b in zip(keys, res, bufs)]


def _host_list(host_indices):
    return host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)


def _pointer_page(ptr, size):
    """The host memory [ptr, ptr + size) as a writable uint8 array."""
    import numpy as np
    return np.frombuffer((ctypes.c_char * size).from_address(ptr), np.uint8)


class PoolIO:
    """One hybrid pool of one rank: its host pool, its kvpage.Store (opened
    here) and the way its pages move (the module docstring's modes)."""

    def __init__(self, owner, name, host_pool):
        self.name, self.tag, self.pool = name, pool_tag(name), host_pool
        self.page_size = int(getattr(host_pool, "page_size", 1) or 1)
        layout = getattr(host_pool, "layout", "layer_first")
        ksize = int(host_pool.get_ksize_per_token())
        size = int(host_pool.get_size_per_token()) if hasattr(host_pool, "get_size_per_token") \
            else ksize
        zero_copy = layout in ZERO_COPY_LAYOUTS
        self.split = zero_copy and size == 2 * ksize
        # a page is the pool's flat page (what get_data_page(flat=True) gives);
        # SGLang's hf3fs sizes it get_ksize_per_token() * page_size, the same
        # for Mamba, indexer and MLA-style pools (not for DeepSeek-V4's paged
        # pools, whose "per token" is a layer's row of a page)
        self.bytes_per_page = ksize * self.page_size if self.split else \
            _nbytes(host_pool.get_dummy_flat_data_page())
        if self.bytes_per_page <= 0:
            raise ValueError(f"kvpage.sglang: pool {self.tag!r} gives {self.bytes_per_page} bytes "
                             f"per page (layout {layout!r}, page_size {self.page_size})")
        self.mode, self.segments = self._mode(zero_copy)
        # MLA: KV and the pools that follow it are one copy (rank 0's); Mamba
        # state and MHA pools differ per TP rank, so every rank keeps its own
        self.sharded = self.tag == MAMBA or self.split
        if owner.is_mla and self.sharded:
            rank, self.writer = owner.stage + owner.tp_rank, True
        else:
            rank, self.writer = owner.rank, owner.writer
        self.path = f"{owner.prefix}.{rank}.bin.{self.tag}"
        self._local = threading.local()  # staged: each thread's staging pages
        meta = owner.metadata_url
        if meta is None and owner.metadata_dir:
            meta = f"{owner.metadata_dir}.{self.tag}"
        self.store = Store(self.path, owner.file_size, self.bytes_per_page, owner.entries,
                           rank=rank, meta=meta, pool=self.tag, per_rank=True,
                           durable=owner.durable, threads=owner.threads,
                           mmap_reads=owner.mmap_reads, mkdir=owner.mkdir,
                           tags=owner.tags)
        logger.info("[Rank %d] kvpage HiCache pool %s: %s, %d pages of %d bytes, layout %s, %s",
                    owner.tp_rank, self.tag, self.path, self.store.num_pages,
                    self.bytes_per_page, layout, self.mode)

    def _mode(self, zero_copy):
        """("split" | "ptr" | "vec" | "staged" | "flat", pointers per page)."""
        if self.split:
            return "split", 2
        if not zero_copy or not hasattr(self.pool, "get_page_buffer_meta"):
            return "flat", 0
        try:
            _, sizes = self.pool.get_page_buffer_meta(self._meta_indices([0]))
        except (ValueError, NotImplementedError, AssertionError, TypeError) as e:  # or None
            logger.info("kvpage.sglang: pool %s has no page pointers (%s): flat pages", self.tag, e)
            return "flat", 0
        if not sizes or sum(sizes) != self.bytes_per_page:
            logger.info("kvpage.sglang: pool %s's page pointers cover %d of %d bytes: flat pages",
                        self.tag, sum(sizes or ()), self.bytes_per_page)
            return "flat", 0
        k = len(sizes)
        return ("ptr" if k == 1 else "vec" if k <= MAX_SEGMENTS else "staged"), k

    def _meta_indices(self, starts):
        """host indices for get_page_buffer_meta: page_size per page, each
        page's first the page's start (SGLang reads those)."""
        import torch
        return torch.tensor(starts, dtype=torch.int64).repeat_interleave(self.page_size)

    # -- keys and host pages
    def store_keys(self, keys):
        ks = [f"{k}_{self.tag}" for k in keys]
        if self.split:
            return [f"{k}{s}" for k in ks for s in ("-k", "-v")]
        return ks

    def _per_page(self, flags):
        if self.split:
            return [flags[2 * i] and flags[2 * i + 1] for i in range(len(flags) // 2)]
        return flags

    def starts(self, keys, host_indices):
        """Each key's page's first host index: the transfer's host indices cut
        in len(keys) equal parts (page_size each; a KV-derived pool may get
        the KV pool's)."""
        n = len(keys)
        idx = _host_list(host_indices) if host_indices is not None else []
        if n == 0 or len(idx) < n or len(idx) % n:
            raise ValueError(f"kvpage.sglang: pool {self.tag!r}: {n} keys but {len(idx)} host "
                             f"indices (page_size {self.page_size})")
        stride = len(idx) // n
        return [int(i) for i in idx[::stride]]

    def _views(self, starts):
        """Zero copy: the host pool's own memory, one buffer per store key."""
        if self.split:
            return [b for s in starts for b in _kv_halves(self.pool.get_data_page(s, flat=False))]
        ptrs, sizes = self.pool.get_page_buffer_meta(self._meta_indices(starts))
        return [_pointer_page(p, n) for p, n in zip(ptrs, sizes)]

    def _segment_words(self, starts):
        """vec: array("Q") of every page's (pointer, size) pairs, the pages'
        one after the other, and the count per page (kvpage.Store._segments)."""
        ptrs, sizes = self.pool.get_page_buffer_meta(self._meta_indices(starts))
        words = [0] * (2 * len(ptrs))
        words[0::2], words[1::2] = ptrs, sizes
        return array("Q", words), [self.segments] * len(starts)

    def _segments(self, starts):
        """staged: [(pointer, size) of each segment] per page."""
        ptrs, sizes = self.pool.get_page_buffer_meta(self._meta_indices(starts))
        k = self.segments
        return [list(zip(ptrs[i * k:(i + 1) * k], sizes[i * k:(i + 1) * k]))
                for i in range(len(starts))]

    def _staging(self, n):
        """n staging pages, the calling thread's own (SGLang's backup and
        prefetch threads call at once), kept between calls: fresh memory
        each call costs its page faults, more than the copy itself."""
        import numpy as np
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            buf = self._local.buf = np.empty((n, self.bytes_per_page), np.uint8)
        return buf[:n]

    # -- the pool's operations (per page: True / False)
    def exists(self, keys):
        if not keys:
            return []
        _, flags = self.store.exists(self.store_keys(keys))
        return self._per_page(flags)

    def put(self, keys, host_indices):
        """Writes the pages of keys from the host pool; True per page stored
        or there already. A placeholder key is never written (False)."""
        keys = list(keys or [])
        if not keys:
            return []
        starts = self.starts(keys, host_indices)
        if not self.writer:
            return [True] * len(keys)  # MLA: rank 0 writes the one copy
        real = [i for i, k in enumerate(keys) if k != PLACEHOLDER]
        out = [False] * len(keys)
        if not real:
            return out
        sk, ss = [keys[i] for i in real], [starts[i] for i in real]
        if self.mode == "vec":
            res = self.store._segments(True, self.store_keys(sk), *self._segment_words(ss))
        else:
            res = self.store.put(self.store_keys(sk), self._out_bufs(ss))
        for i, ok in zip(real, self._per_page([r >= 0 for r in res])):
            out[i] = ok
        return out

    def _out_bufs(self, starts):
        if self.mode in ("split", "ptr"):
            return self._views(starts)
        if self.mode == "flat":
            return [self.pool.get_data_page(s, flat=True).reshape(-1) for s in starts]
        stage = self._staging(len(starts))
        for row, segs in zip(stage, self._segments(starts)):
            at = row.ctypes.data
            for p, n in segs:
                ctypes.memmove(at, p, n)
                at += n
        return list(stage)

    def get(self, keys, host_indices):
        """Reads the pages of keys into the host pool; True per page read in
        full. A page not read leaves its host memory as it was (zero copy: a
        failed read may have written part of it); a placeholder key is a miss."""
        keys = list(keys or [])
        if not keys:
            return []
        starts = self.starts(keys, host_indices)
        real = [i for i, k in enumerate(keys) if k != PLACEHOLDER]
        out = [False] * len(keys)
        if not real:
            return out
        sk, ss = [keys[i] for i in real], [starts[i] for i in real]
        if self.mode in ("split", "ptr"):
            bufs = self._views(ss)
            _, res = self.store.get(self.store_keys(sk), bufs)
            ok = self._per_page([r == _nbytes(b) for r, b in zip(res, bufs)])
        elif self.mode == "vec":
            _, res = self.store._segments(False, self.store_keys(sk), *self._segment_words(ss))
            ok = [r == self.bytes_per_page for r in res]
        else:
            ok = self._get_copied(sk, ss)
        for i, good in zip(real, ok):
            out[i] = good
        return out

    def _get_copied(self, keys, starts):
        if self.mode == "flat":
            pages = [self.pool.get_dummy_flat_data_page() for _ in keys]
            _, res = self.store.get(self.store_keys(keys), [p.reshape(-1) for p in pages])
            ok = [r == _nbytes(p) for r, p in zip(res, pages)]
            for s, p, good in zip(starts, pages, ok):
                if good:
                    self.pool.set_from_flat_data_page(s, p)
            return ok
        stage = self._staging(len(keys))
        _, res = self.store.get(self.store_keys(keys), list(stage))
        ok = [r == self.bytes_per_page for r in res]
        for row, segs, good in zip(stage, self._segments(starts), ok):
            if good:
                at = row.ctypes.data
                for p, n in segs:
                    ctypes.memmove(p, at, n)
                    at += n
        return ok

    def clear(self):
        if self.writer:
            self.store.clear()

    def close(self):
        st, self.store = self.store, None
        if st is not None:
            st.close()


def _kv_halves(page):
    return [page[0], page[1]]


def _nbytes(t):
    return t.numel() * t.element_size() if hasattr(t, "element_size") else t.nbytes
