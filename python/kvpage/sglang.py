"""kvpage.sglang: an SGLang HiCache L3 storage backend over kvpage.Store,
loaded by SGLang's dynamic backend without changing SGLang:

  --hicache-storage-backend dynamic
  --hicache-storage-backend-extra-config '{"backend_name": "kvpage",
      "module_path": "kvpage.sglang", "class_name": "KvpageHiCacheStorage",
      "interface_v1": 1, "file_path_prefix": "/data/kvpage",
      "file_size": 1099511627776, "metadata_url": "http://HOST:18000"}'

When SGLang is installed the class subclasses its HiCacheStorage (the dynamic
backend requires that); without SGLang it falls back to object, so that this
module imports (and is tested) without SGLang.

Its own keys in extra_config:
  file_path_prefix  the storage file of rank R is f"{prefix}.{R}.bin" (required)
  file_size         bytes per rank file (default 1 TiB, sparse): a number or a
                    size string as the rest of kvpage takes them ("1T", "64G")
  entries           most pages per page-I/O batch (default 8)
  metadata_url      http://HOST:PORT[/ns/NAME]: a kvpage serve that every rank
                    of every instance shares. Absent: embedded metadata in a
                    data directory beside the rank's file (metadata_dir,
                    default FILE.meta), owned by this process.
  metadata_dir      see above
  durable           fdatasync pages before confirming them (default true)
  threads           batches of one call run at once (default 4)
  mmap_reads        copy reads of cached pages out of a mapping of the file
                    (kvpage.PageFile's mmap_reads; default: the environment's
                    KVPAGE_MMAP_READS, else off)
  mkdir             create the prefix's missing directories (default true, as
                    SGLang's hf3fs backend does)
  tags              integrity tags (default true): a page whose bytes changed
                    since it was set (another writer, a torn write, a bit
                    flip) is a miss, never the bytes (kvpage.Store's tags)
  anchor_pages      marker pages of a KV pool without bytes (DeepSeek-V4's
                    logical anchor: one 4 KiB page per key; default 1048576)
  parents           tell each page's parent with its confirmation (default
                    true): the key before it in the batch, and for the first
                    extra_info.prefix_keys[-1] when SGLang passes prefix keys
                    ("hicache_storage_pass_prefix_keys": true; SGLang's
                    hybrid_cache_controller.py @ 00343773 passes
                    HiCacheStorageExtraInfo(prefix_keys) per 128-page
                    batch of one prefix, and appends to the list after the
                    call: it is read during the call). kvpage serve's
                    KV events (--kv-events) then carry parent_block_hash, and
                    a batch's pages make one chained BlockStored (sent as
                    the chain's "prefix_key": the server's fast path still
                    reads it).

Ranks. Each TP rank is one process with one kvpage.Store: its own file and
its own metadata rank (tp_rank; with pipeline parallelism
pp_rank * tp_size + tp_rank, since stages hold different layers). Every rank
opens the same metadata_url. Keys count per rank (Store per_rank=True), as
SGLang's hf3fs backend counts them: the controller combines the ranks' hit
counts itself (the minimum over the TP group), so a rank must not wait for
the other ranks' pages. Without metadata_url each rank has its own metadata
directory, which works for MHA with any number of ranks on one machine (no
sharing between machines or instances).

MLA: every rank holds the whole latent, so all ranks use rank 0's file and
metadata rank 0; only rank 0 writes (batch_set_v1 of another rank returns
True per page without writing), all ranks read. Ranks other than 0 need rank
0's metadata, so MLA with more than one rank requires metadata_url (and rank
0's file reachable from every rank: one machine, or a shared file system).

Page geometry (register_mem_pool_host), as SGLang's hf3fs backend computes it:
layouts page_first and page_first_direct: zero copy, bytes_per_page =
get_ksize_per_token() * page_size (MHA: K only; the page's K and V are two
keys "{key}-k" and "{key}-v"; MLA: the whole latent, one key); layout
layer_first: bytes_per_page = get_size_per_token() * page_size, pages go
through flat host pages. The v0 interface (get/set with flat tensors) stores
the same keys: a flat MHA page of a zero-copy layout is K then V, stored as
"{key}-k" and "{key}-v", so v0 and v1 see each other's pages.

Hybrid models (SGLang's storage v2, which its hybrid cache controller calls
for every pool whatever interface_v1 says): register_mem_host_pool_v2,
batch_exists_v2 (the minimum over the pools; a pool's page i is key i's, so
the radix cache's "__placeholder__" keys only say how many trailing pages),
batch_get_v2, batch_set_v2. Each pool besides KV is one more store named as
SGLang's hf3fs backend names it: file f"{rank file}.{pool}", metadata
namespace (kvpage pool) the pool's name, keys f"{key}_{pool}". How its pages
move, and MLA's ranks for it: kvpage/_sglang_pools.py. extra_info is
accepted everywhere; its prefix_keys serve only the first page's parent
(parents, above; the pages' hashes chain the whole prefix already), read
during the call (SGLang appends to the list after it); nothing keeps a
reference to them.

What differs from SGLang's hf3fs backend: batch_set_v1 returns one result
per page for MHA (SGLang's returns 2N); a page read lands in its own buffer
(SGLang's shifts pages after a miss); nothing installs signal handlers. The
v2 pools: an MHA pool's K and V are two keys (SGLang's writes a K+V page
into a page of K's size); with MLA, each rank keeps its own Mamba state
(SGLang's puts every rank's into rank 0's file under one key); a malformed
transfer logs and returns False for its keys.
"""
import errno
import logging

from kvpage import _sglang_pools as _pools
from kvpage._size import size_arg
from kvpage.errors import KvpageError, KvpageValueError
from kvpage.pagefile import flag as _flag
from kvpage.store import Store

try:  # SGLang's dynamic backend requires a subclass of its HiCacheStorage
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # SGLang is not installed: the module still imports
    _Base = object

logger = logging.getLogger(__name__)

ZERO_COPY_LAYOUTS = _pools.ZERO_COPY_LAYOUTS


def _size_key(cfg, key, default):
    """extra_config[key] as bytes: a number or a size string as the rest of
    kvpage takes them ("1T", "64G", "2MiB"); a bad one is refused naming the
    key."""
    v = cfg.get(key, default)
    if isinstance(v, str):
        return size_arg("kvpage.sglang", f"extra_config \"{key}\"", v.strip())
    return _count_key(cfg, key, default)


def _count_key(cfg, key, default):
    """extra_config[key] as a whole number (an int or its digits); a bad one
    is refused naming the key, not a bare int() error."""
    v = cfg.get(key, default)
    try:
        if isinstance(v, bool) or isinstance(v, float) and not v.is_integer():
            raise ValueError(v)
        n = int(v.strip()) if isinstance(v, str) else int(v)
    except (TypeError, ValueError):
        n = -1
    if n < 0:
        raise KvpageValueError("kvpage.sglang", -errno.EINVAL,
                               f"extra_config \"{key}\" is {v!r}: it takes a whole number "
                               f"(0 or more)", "arg")
    return n


class KvpageHiCacheStorage(_Base):
    """SGLang HiCacheStorage over kvpage.Store: cls(storage_config, kwargs),
    then register_mem_pool_host(pool) opens the store."""

    def __init__(self, storage_config=None, kwargs=None):
        try:  # SGLang's base class keeps nothing we must give it
            super().__init__()
        except TypeError:
            pass
        cfg = dict(getattr(storage_config, "extra_config", None) or {})
        if kwargs:
            cfg.update({k: v for k, v in dict(kwargs).items() if k not in cfg})
        self.storage_config = storage_config
        self.config = cfg
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(storage_config, "tp_size", 1) or 1)
        pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        pp_size = int(getattr(storage_config, "pp_size", 1) or 1)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.prefix = cfg.get("file_path_prefix") or cfg.get("storage_path_prefix")
        if not self.prefix:
            raise ValueError("kvpage.sglang: extra_config needs \"file_path_prefix\": each rank's "
                             "storage file is f\"{file_path_prefix}.{rank}.bin\"")
        self.file_size = _size_key(cfg, "file_size", 1 << 40)
        self.entries = _count_key(cfg, "entries", 8)
        self.threads = _count_key(cfg, "threads", 4)
        self.anchor_pages = _count_key(cfg, "anchor_pages", 1 << 20)
        self.mmap_reads = _flag(cfg.get("mmap_reads"), None)
        self.durable = _flag(cfg.get("durable"), True)
        self.metadata_url = cfg.get("metadata_url") or cfg.get("metadata_server_url") or None
        self.metadata_dir = cfg.get("metadata_dir") or None
        # SGLang's own hf3fs backend creates the prefix's missing directories
        self.mkdir = _flag(cfg.get("mkdir"), True)
        self.tags = _flag(cfg.get("tags"), True)
        self.parents = _flag(cfg.get("parents"), True)
        if self.metadata_url is not None and "://" not in str(self.metadata_url):
            raise ValueError(f"kvpage.sglang: metadata_url {self.metadata_url!r} is not "
                             "http://HOST:PORT[/ns/NAME]")
        if self.is_mla and self.tp_size > 1 and self.metadata_url is None:
            raise ValueError(
                f"kvpage.sglang: MLA with tp_size {self.tp_size} needs \"metadata_url\" (a kvpage "
                "serve): ranks other than 0 read rank 0's pages and must see rank 0's metadata, "
                "and embedded metadata belongs to one process")
        stage = pp_rank * self.tp_size if pp_size > 1 else 0  # stages hold other layers
        self.stage = stage
        if self.is_mla:  # one copy of the latent: the stage's first rank's file and rank
            self.rank, self.writer = stage, self.tp_rank == 0
        else:
            self.rank, self.writer = stage + self.tp_rank, True
        self.path = f"{self.prefix}.{self.rank}.bin"
        self.mem_pool_host = None
        self.store = None
        self.zero_copy = False
        self.split_kv = False
        self.bytes_per_page = 0
        self.page_size = 0
        self.logical = False  # a KV pool without bytes: marker pages (_sglang_pools.MARKER_BYTES)
        self._closed = False
        self._pools = {}  # the v2 pools besides KV: pool tag -> _sglang_pools.PoolIO
        self.registered_pools = {}  # as SGLang's base class keeps them: name -> host pool

    # -- setup
    def register_mem_pool_host(self, mem_pool_host):
        """Computes bytes_per_page from the host pool (as SGLang's hf3fs
        backend does) and opens the rank's store."""
        if self._closed:
            raise KvpageError("KvpageHiCacheStorage", -errno.EBADF, "the backend is closed", "arg")
        if self.store is not None:
            raise ValueError("kvpage.sglang: register_mem_pool_host was called already")
        self.mem_pool_host = mem_pool_host
        self.page_size = int(mem_pool_host.page_size)
        layout = getattr(mem_pool_host, "layout", "layer_first")
        self.zero_copy = layout in ZERO_COPY_LAYOUTS
        self.split_kv = self.zero_copy and not self.is_mla
        if self.zero_copy or not hasattr(mem_pool_host, "get_size_per_token"):
            bpp = int(mem_pool_host.get_ksize_per_token()) * self.page_size
        else:
            bpp = int(mem_pool_host.get_size_per_token()) * self.page_size
        if bpp < 0:
            raise ValueError(f"kvpage.sglang: the host pool gives {bpp} bytes per page "
                             f"(layout {layout!r}, page_size {self.page_size})")
        file_size = self.file_size
        self.logical = bpp == 0
        if self.logical:  # DeepSeek-V4's logical KV anchor: page indices, no bytes
            self.zero_copy = self.split_kv = False
            bpp = _pools.MARKER_BYTES
            file_size = self.anchor_pages * bpp
        self.bytes_per_page = bpp
        meta = self.metadata_url if self.metadata_url is not None else self.metadata_dir
        self.store = Store(self.path, file_size, bpp, self.entries, rank=self.rank, meta=meta,
                           per_rank=True, durable=self.durable, threads=self.threads,
                           mmap_reads=self.mmap_reads, mkdir=self.mkdir, tags=self.tags)
        logger.info("[Rank %d] kvpage HiCache storage: %s, %d pages of %d bytes, layout %s, "
                    "%s, metadata %s", self.tp_rank, self.path, self.store.num_pages, bpp, layout,
                    "MLA" if self.is_mla else "MHA", self.store.location)

    def _store(self, op):
        if self.store is None:
            if self._closed:
                raise KvpageError(op, -errno.EBADF, "the backend is closed", "arg")
            raise KvpageError(op, -errno.EBADF, "register_mem_pool_host was not called", "arg")
        return self.store

    def _keys(self, keys):
        if self.split_kv:
            return [f"{k}{s}" for k in keys for s in ("-k", "-v")]
        return list(keys)

    def _parents(self, keys, extra_info):
        """Each stored key's parent (None: not known), as put takes them:
        the pages of one batch are consecutive pages of one prefix; the
        first's parent is the last of the prefix keys SGLang passed."""
        if not self.parents:
            return None
        prefix = getattr(extra_info, "prefix_keys", None)
        first = prefix[-1] if prefix else None
        parents = [first] + list(keys[:-1])
        if self.split_kv:  # "{key}-k" after "{parent}-k", "{key}-v" after "{parent}-v"
            return [None if p is None else f"{p}{s}" for p in parents for s in ("-k", "-v")]
        return parents

    def _page_starts(self, keys, host_indices):
        n = len(host_indices) // self.page_size
        if n != len(keys):
            raise ValueError(f"kvpage.sglang: {len(keys)} keys but {len(host_indices)} host "
                             f"indices ({n} pages of {self.page_size})")
        return [int(host_indices[i * self.page_size]) for i in range(n)]

    def _parts(self, page):
        """The buffers one zero-copy host page view is stored as."""
        if self.split_kv:
            return [page[0], page[1]]
        return [page]

    def _flat_parts(self, flat):
        """The buffers a flat page is stored as (MHA zero-copy layouts: K, V)."""
        flat = flat.reshape(-1)
        if self.split_kv:
            h = flat.numel() // 2
            return [flat[:h], flat[h:]]
        return [flat]

    @staticmethod
    def _nbytes(t):
        return t.numel() * t.element_size()

    # -- the v1 interface: pages straight into and out of the host pool
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Reads the pages of keys into the host pool at host_indices. One
        bool per page (MHA zero copy: True when both K and V were read)."""
        st = self._store("batch_get_v1")
        if not keys:
            return []
        starts = self._page_starts(keys, host_indices)
        if self.logical:
            return _pools.get_markers(st, keys)
        pool = self.mem_pool_host
        if self.zero_copy:
            bufs = [b for s in starts for b in self._parts(pool.get_data_page(s, flat=False))]
            _, res = st.get(self._keys(keys), bufs)
            ok = [r == self._nbytes(b) for r, b in zip(res, bufs)]
            if self.split_kv:
                return [ok[2 * i] and ok[2 * i + 1] for i in range(len(keys))]
            return ok
        flats = [pool.get_dummy_flat_data_page() for _ in keys]
        _, res = st.get(list(keys), [f.reshape(-1) for f in flats])
        out = [False] * len(keys)
        for i, (s, f, r) in enumerate(zip(starts, flats, res)):
            if r != self._nbytes(f):
                logger.debug("[Rank %d] kvpage get %s failed: %d", self.tp_rank, keys[i], r)
                break  # the controller uses the leading run only
            pool.set_from_flat_data_page(s, f)
            out[i] = True
        return out

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Writes the host pool's pages at host_indices under keys. One bool
        per page: True when stored or there already (MHA: both K and V)."""
        st = self._store("batch_set_v1")
        if not keys:
            return []
        starts = self._page_starts(keys, host_indices)
        if not self.writer:
            return [True] * len(keys)  # MLA: rank 0 writes the one copy
        if self.logical:
            return _pools.put_markers(st, keys)
        pool = self.mem_pool_host
        parents = self._parents(keys, extra_info)
        if self.zero_copy:
            bufs = [b for s in starts for b in self._parts(pool.get_data_page(s, flat=False))]
            res = st.put(self._keys(keys), bufs, parents=parents)
        else:
            bufs = [pool.get_data_page(s, flat=True).reshape(-1) for s in starts]
            res = st.put(list(keys), bufs, parents=parents)
        ok = [r >= 0 for r in res]
        if self.split_kv:
            return [ok[2 * i] and ok[2 * i + 1] for i in range(len(keys))]
        return ok

    def batch_exists(self, keys, extra_info=None):
        """The number of leading keys whose pages are there (on this rank)."""
        st = self._store("batch_exists")
        if not keys:
            return 0
        lead, _ = st.exists(self._keys(keys))
        return lead // 2 if self.split_kv else lead

    def exists(self, key):
        return self.batch_exists([key]) == 1

    # -- the v2 interface: every pool of a hybrid model (kvpage/_sglang_pools.py)
    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Opens the store of one host pool (SGLang's hybrid controller calls
        it for every pool, KV included: KV is register_mem_pool_host's)."""
        if self._closed:
            raise KvpageError("register_mem_host_pool_v2", -errno.EBADF, "the backend is closed",
                              "arg")
        tag = _pools.pool_tag(host_pool_name)
        if tag == _pools.KV:
            if self.store is None:
                self.register_mem_pool_host(host_pool)
            elif host_pool is not self.mem_pool_host:
                raise ValueError("kvpage.sglang: the KV pool is registered already, "
                                 "with another host pool")
            return
        have = self._pools.get(tag)
        if have is not None:
            if have.pool is not host_pool:
                raise ValueError(f"kvpage.sglang: pool {tag!r} is registered already, "
                                 "with another host pool")
            return
        self._pools[tag] = _pools.PoolIO(self, host_pool_name, host_pool)
        self.registered_pools[host_pool_name] = host_pool

    def _pool(self, op, name):
        if self._closed:
            raise KvpageError(op, -errno.EBADF, "the backend is closed", "arg")
        return self._pools.get(_pools.pool_tag(name))

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix of keys over KV and every pool of
        pool_transfers (SGLang's hit policies: a pool's page i is key i's;
        ALL_PAGES needs every page of the KV prefix, TRAILING_PAGES the last
        len(transfer.keys) pages of the prefix): a PoolTransferResult whose
        kv_hit_pages is the minimum over the pools."""
        kv = self.batch_exists(keys, extra_info)
        hits = {_pools.kv_name(): kv} if kv else {}
        final = kv
        for t in pool_transfers or []:
            if final == 0:
                break
            pool = self._pool("batch_exists_v2", t.name)
            if pool is None:  # a pool never registered holds nothing
                logger.error("[Rank %d] kvpage: batch_exists_v2 of pool %s, which was not "
                             "registered (register_mem_host_pool_v2)", self.tp_rank, t.name)
                final = 0
                break
            trailing = len(t.keys) if getattr(t, "keys", None) else 1
            boundary = _pools.hit_boundary(pool.exists(list(keys[:kv])),
                                           getattr(t, "hit_policy", None), trailing)
            if boundary:
                hits[t.name] = boundary
            final = min(final, boundary)
        return _pools.transfer_result(final, hits)

    def batch_get_v2(self, transfers, extra_info=None):
        """Reads each transfer's pages (its keys, at its host_indices) into
        its pool: {pool name: [True per page read]}."""
        return self._v2("batch_get_v2", transfers, extra_info, self.batch_get_v1, "get")

    def batch_set_v2(self, transfers, extra_info=None):
        """Writes each transfer's pages from its pool: {pool name: [True per
        page stored or there already]}."""
        return self._v2("batch_set_v2", transfers, extra_info, self.batch_set_v1, "put")

    def _v2(self, op, transfers, extra_info, kv_call, method):
        out = {}
        for t in transfers or []:
            keys = list(t.keys or [])
            kv = _pools.pool_tag(t.name) == _pools.KV
            pool = None if kv else self._pool(op, t.name)
            if not kv and pool is None:
                logger.error("[Rank %d] kvpage: %s of pool %s, which was not registered "
                             "(register_mem_host_pool_v2)", self.tp_rank, op, t.name)
                out[t.name] = [False] * len(keys)
                continue
            try:
                if kv:
                    out[t.name] = kv_call(keys, t.host_indices, extra_info) if keys else []
                else:
                    out[t.name] = getattr(pool, method)(keys, t.host_indices)
            except (ValueError, NotImplementedError) as e:  # its shape, its pool: nothing moved
                logger.error("[Rank %d] kvpage: %s: %s", self.tp_rank, op, e)
                out[t.name] = [False] * len(keys)
        return out

    # -- the v0 interface: flat tensors in and out
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Reads each key's page into target_locations[i] (a flat host page;
        None: a new one). Returns the tensors, None for a page not read."""
        st = self._store("batch_get")
        if not keys:
            return []
        pool = self.mem_pool_host
        targets = list(target_locations) if target_locations is not None else \
            [pool.get_dummy_flat_data_page() for _ in keys]
        if len(targets) != len(keys):
            raise ValueError(f"kvpage.sglang: {len(keys)} keys but {len(targets)} targets")
        if self.logical:
            return [t if ok else None for t, ok in zip(targets, _pools.get_markers(st, keys))]
        bufs = [b for t in targets for b in self._flat_parts(t)]
        _, res = st.get(self._keys(keys), bufs)
        ok = [r == self._nbytes(b) for r, b in zip(res, bufs)]
        per = 2 if self.split_kv else 1
        return [t if all(ok[per * i:per * i + per]) else None for i, t in enumerate(targets)]

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Stores values[i] (flat pages) under keys[i]. True when all are
        stored or there already."""
        st = self._store("batch_set")
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            raise ValueError(f"kvpage.sglang: {len(keys)} keys but "
                             f"{0 if values is None else len(values)} values")
        if not self.writer:
            return True
        if self.logical:
            return all(_pools.put_markers(st, keys))
        bufs = [b for v in values for b in self._flat_parts(v.contiguous())]
        return all(r >= 0 for r in st.put(self._keys(keys), bufs))

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def delete(self, key):
        if self.writer:
            self._store("delete").delete(self._keys([key]))

    # -- the rest
    def clear(self):
        """Forgets every key of this rank (MLA: only rank 0 clears the one copy)."""
        st = self._store("clear")
        if self.writer:
            st.clear()
        for pool in list(self._pools.values()):  # a pool may be registered meanwhile
            pool.clear()

    def get_stats(self):
        """The store's figures (kvpage.Store.stats) as a dict, with the rank and
        geometry; None before register_mem_pool_host or after close."""
        if self.store is None:
            return None
        s = self.store.stats()
        s.update(rank=self.rank, tp_rank=self.tp_rank, bytes_per_page=self.bytes_per_page,
                 location=self.store.location)
        if self._pools:
            s["pools"] = {tag: dict(p.store.stats(), bytes_per_page=p.bytes_per_page, mode=p.mode)
                          for tag, p in list(self._pools.items())}
        return s

    def close(self):
        """Closes the store; a second close does nothing."""
        self._closed = True
        st, self.store = self.store, None
        if st is not None:
            st.close()
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

    def __repr__(self):
        return (f"<KvpageHiCacheStorage rank {self.rank} (tp {self.tp_rank}/{self.tp_size}"
                f"{', MLA' if self.is_mla else ''}) {self.path}>")
