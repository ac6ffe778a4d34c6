"""kvpage.vllm_tier: a secondary tier of vLLM's tiered KV offloading
(OffloadingConnector with TieringOffloadingSpec) over kvpage.Store.

  "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", ...,
     "secondary_tiers": [{"type": "KvpageTier", "module_path": "kvpage.vllm",
                          "path": "/mnt/3fs/vllm/qwen3-8b.pages",
                          "file_size": "1T",
                          "metadata": "http://10.0.0.5:18000/ns/qwen3-8b"}]}

vLLM's factory imports module_path and builds the class named by type
(vLLM releases from PR #51007 on); before that, kvpage.vllm.register()
registers the type "KvpageTier" with SecondaryTierFactory.register_tier.
The factory calls KvpageTier(offloading_spec=, primary_kv_view=,
tier_type=, **the tier config's other keys). Those keys:

  path          the page file (required). Its size is the tier's capacity:
                when it is full, storing evicts the least recently used
                blocks (kvpage's metadata does it, as for every store).
  file_size     bytes or "64G": the file's size, needed to create it (an
                existing file keeps its size when omitted).
  metadata      where the index lives. None: PATH.meta beside the file
                (embedded: persistent, one process at a time); a directory
                or "file:DIR" (the same, elsewhere); "http://HOST:PORT[/ns/N]"
                (a kvpage serve: shared by every instance that reaches it);
                "redis://HOST:PORT[/DB]" (servers over one Redis). Instances
                share blocks when they open the same metadata and the same
                page file (a shared file system across nodes).
  deployment    the namespace (None: the URL's /ns/NAME, else "default").
  pool          "vllm-tier"; rank 0 (one page file per rank).
  identity      what keeps models apart in one namespace; None: derived
                from the offloading spec (model, dtype, block geometry) and
                the row size, as vLLM's fs tier names its directory.
  backend       "auto" (USRBIO on a 3FS mount, else io_uring/pread),
                "usrbio", "uring", "psync".
  threads       jobs run at once (2); io_threads: page-I/O batches of one
                job at once (4); entries: pages per batch (16).
  durable       True: pages are synced before their keys are confirmed.
  integrity     True: every block is checked on every load against the
                integrity tag its store wrote with it (its bytes and its
                key, in PATH.tags: kvpage.Store's tags): a block whose bytes
                do not match is a failed load, never data. A tier made
                before tags (its file held blocks when its tags were made)
                or on a block device (no tags) keeps the second store of
                checksums it had: each block's XXH3-64 (else CRC-32) and key
                digest in PATH.sums (64-byte pages, pool POOL.sums), which
                its old blocks need. False: no checks.
  async_lookup  None: on for http:// and redis:// metadata (lookups answer
                RETRY until a background thread has the answer), off for
                embedded metadata (an in-memory look-up).
  enable_kv_events, locality: as vLLM's fs tier (take_events reports each
                block stored and each evicted block this tier knows of).
  mkdir (True), timeout_ms, mmap_reads, name (vLLM's tier name, unused).

Keys: the OffloadKey's bytes (block hash + 4-byte group index) in hex after
the identity: "IDENTITY:HEX". Rows: primary_kv_view's rows (its first
stride is the block size), moved by zero-copy batched I/O on worker threads.

Parents and tokens (kvpage serve's KV events): none are sent. A store job
(JobMetadata @ vllm 2ac00577, keys + block_ids + req_context) need not be a
chain: its keys skip the blocks already stored and may mix KV-cache groups;
and its ReqContext (vllm/v1/kv_offload/base.py @ 14d6506e: req_id,
kv_transfer_params) carries no token ids.

Every method vLLM calls on its scheduler thread returns at once; I/O and
remote lookups run on this tier's threads. Without vLLM installed the
module imports and the class works on its own (tests, benchmarks), with
local types of vLLM's shapes.
"""
import collections
import ctypes
import dataclasses
import enum
import errno
import hashlib
import importlib
import json
import os
import queue
import stat
import struct
import threading
import time
import warnings
import zlib

from kvpage.errors import KvpageError
from kvpage.store import ALREADY, STORED, Store, _location

TIER_TYPE = "KvpageTier"
_TIER_BASE = "vllm.v1.kv_offload.tiering.base"
_TIER_FACTORY = "vllm.v1.kv_offload.tiering.factory"
_OFFLOAD_BASE = "vllm.v1.kv_offload.base"


def _vllm(module, name):
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # vLLM, or this name of it, is not there
        return None


# --- vLLM's types where importable, else local ones of the same shape -------

class _LookupResult(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


@dataclasses.dataclass
class _JobResult:
    job_id: int
    success: bool
    successful_keys: object = None
    transfer_time: object = None


@dataclasses.dataclass
class _OffloadingEvent:
    keys: list
    medium: object
    removed: bool
    locality: object = None


@dataclasses.dataclass
class _RequestOffloadingContext:
    policy: object = None


_Base = _vllm(_TIER_BASE, "SecondaryTierManager") or object
LookupResult = _vllm(_OFFLOAD_BASE, "LookupResult") or _LookupResult
JobResult = _vllm(_TIER_BASE, "JobResult") or _JobResult
OffloadingEvent = _vllm(_OFFLOAD_BASE, "OffloadingEvent") or _OffloadingEvent
RequestOffloadingContext = (_vllm(_OFFLOAD_BASE, "RequestOffloadingContext")
                            or _vllm(_TIER_BASE, "RequestOffloadingContext")
                            or _RequestOffloadingContext)
_Medium = _vllm(_OFFLOAD_BASE, "Medium")
MEDIUM = getattr(_Medium, "STORAGE", None) or _vllm("vllm.distributed.kv_events", "MEDIUM_FS") \
    or "STORAGE"


def _make(cls, **kw):
    """cls(**kw) with only the fields cls has (JobResult grew successful_keys,
    transfer_time, transfer_size after August 2026; OffloadingEvent locality)."""
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in kw.items() if k in names}
    return cls(**kw)


def _rows_of(job):
    """The primary rows of a job: JobMetadata.block_ids (August 2026) or
    TransferJob.chunk_ids (later main)."""
    ids = getattr(job, "block_ids", None)
    if ids is None:
        ids = getattr(job, "chunk_ids", None)
    if ids is None:
        raise TypeError(f"{type(job).__name__} has neither block_ids nor chunk_ids")
    return [int(b) for b in ids]


# --- checksums ---------------------------------------------------------------

def _load_xxh3():
    for name in ("libxxhash.so.0", "libxxhash.so"):
        try:
            lib = ctypes.CDLL(name)  # ctypes releases the GIL around each call
            fn = lib.XXH3_64bits
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_uint64, (ctypes.c_void_p, ctypes.c_size_t)
        return fn
    return None


_XXH3 = _load_xxh3()
ALGO_XXH3, ALGO_CRC32 = 1, 2
_REC = struct.Struct("<4sIQQ32s8x")  # magic, algorithm, length, checksum, key digest: 64 bytes
_MAGIC = b"KVPT"
REC_SIZE = _REC.size


def _checksum(algo, mv):
    """The checksum of a writable byte memoryview, or None if algo is unknown here."""
    if algo == ALGO_XXH3 and _XXH3 is not None:
        c = ctypes.c_char.from_buffer(mv)
        return _XXH3(ctypes.addressof(c), len(mv))
    if algo == ALGO_CRC32:
        return zlib.crc32(mv)
    return None


def _record(key, mv):
    algo = ALGO_XXH3 if _XXH3 is not None else ALGO_CRC32
    return _REC.pack(_MAGIC, algo, len(mv), _checksum(algo, mv),
                     hashlib.sha256(key.encode()).digest())


def _verify(key, rec, mv):
    """True when rec is the record of key and mv holds the bytes it was made of."""
    magic, algo, length, csum, digest = _REC.unpack(rec)
    return (magic == _MAGIC and length == len(mv)
            and digest == hashlib.sha256(key.encode()).digest()
            and _checksum(algo, mv) == csum)


# --- stores shared by the managers of one process ---------------------------

_STORES = {}
_STORES_LOCK = threading.Lock()


def _open_shared(key, make):
    """One Store per (file, metadata, namespace, rank) in a process: embedded
    metadata belongs to one process, so two managers of one process over one
    location share its store. Returns the store; release with _close_shared."""
    with _STORES_LOCK:
        ent = _STORES.get(key)
        if ent is None:
            ent = _STORES[key] = [make(), 0]
        ent[1] += 1
        return ent[0]


def _close_shared(key):
    with _STORES_LOCK:
        ent = _STORES.get(key)
        if ent is None:
            return
        ent[1] -= 1
        if ent[1] == 0:
            del _STORES[key]
            ent[0].close()


def _bytes(n, size=1):
    """n buffers of size bytes (what a read that is a touch reads into)."""
    return [bytearray(size) for _ in range(n)]


def _drain(dq):
    """Everything in a deque other threads append to, oldest first."""
    out = []
    while True:
        try:
            out.append(dq.popleft())
        except IndexError:
            return out


def _is_remote(metadata):
    return isinstance(metadata, str) and metadata.startswith(("http://", "https://", "redis"))


def _open_data(direct, *args, **kw):
    """The blocks' store. direct None: O_DIRECT where the file system takes
    it, else through the page cache (vLLM's fs tier's probe and fallback)."""
    if direct is not None:
        return Store(*args, direct=bool(direct), **kw)
    try:
        return Store(*args, direct=True, **kw)
    except KvpageError as e:
        if e.errno != errno.EINVAL:
            raise
        return Store(*args, direct=False, **kw)  # a refused open changed nothing


def _preallocate(path, size):
    """Reserves the page file's blocks on its file system (posix_fallocate),
    so that the capacity is the tier's, and writes into it never wait for the
    file system's block allocation (buffered writes into a sparse ext4 file
    ran at 0.3 GB/s here, into an allocated one at 2.6: bench/python/README.md).
    Where the file system cannot, nothing changes; a file system that is too
    small for it says so (a warning) and the tier runs as without."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_blocks * 512 >= size:
            return
        fd = os.open(path, os.O_WRONLY)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            warnings.warn(f"KvpageTier: cannot reserve {size} bytes for {path}: {e}")


def _canonical(metadata):
    """A metadata location as one string per place: a directory and file:DIR
    of the same directory are one location (None stays None: PATH.meta)."""
    loc = _location(metadata)
    if loc is None or "://" in loc or loc.startswith("mem:"):
        return loc
    return "file:" + os.path.realpath(loc[5:] if loc.startswith("file:") else loc)


def _sums_location(path, metadata):
    """Where the checksums' index lives: beside the blocks' one (embedded
    metadata is one process's, so the checksums have their own directory)."""
    if metadata is None:
        return None  # PATH.sums.meta, the sums file's default
    if _is_remote(metadata) or metadata == "mem:":
        return metadata
    return metadata.rstrip("/") + ".sums"  # file:DIR


def _spec_identity(spec, row_bytes):
    """The fields that make a block's bytes mean something (as vLLM's fs
    tier's FileMapper hashes them into its directory name), from either shape
    of the offloading spec, and the row size."""
    def get(obj, *names):
        for n in names:
            obj = getattr(obj, n, None)
            if obj is None:
                return None
        return obj

    cfg = get(spec, "config")
    vc = get(spec, "vllm_config")
    fields = {
        "model": get(cfg, "model", "name") or get(vc, "model_config", "model"),
        "dtype": str(get(cfg, "model", "dtype") or get(vc, "model_config", "dtype")),
        "tokens_per_hash": get(cfg, "cache", "tokens_per_hash") or get(spec, "hash_block_size"),
        "block_size_factor": get(spec, "block_size_factor") or get(spec, "blocks_per_chunk"),
        "row_bytes": row_bytes,
    }
    canon = json.dumps(fields, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


class KvpageTier(_Base):
    """vLLM's SecondaryTierManager over kvpage.Store (see the module's
    docstring for the configuration)."""

    medium = MEDIUM

    def __init__(self, offloading_spec, primary_kv_view, tier_type=TIER_TYPE, *, path=None,
                 file_size=0, metadata=None, deployment=None, pool="vllm-tier", rank=0,
                 identity=None, backend="auto", threads=4, io_threads=4, entries=16,
                 durable=None, integrity=True, async_lookup=None, enable_kv_events=False,
                 locality=None, mkdir=True, timeout_ms=0, mmap_reads=None, direct=None,
                 preallocate=True, name=None):
        if not path:
            raise ValueError("KvpageTier: 'path' (the page file) is required in the tier's config")
        if int(threads) < 1:
            raise ValueError(f"KvpageTier: threads must be at least 1, not {threads!r}")
        view = memoryview(primary_kv_view)
        if view.readonly or not view.c_contiguous or view.ndim < 2:
            raise ValueError("KvpageTier: primary_kv_view must be a writable C-contiguous "
                             "memoryview of rows, (rows, row bytes) as vLLM's primary tier's")
        if _Base is not object:
            super().__init__(offloading_spec, primary_kv_view, tier_type)
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self.locality = locality
        self.block_size = view.strides[0]
        self._flat = view.cast("B")
        self.num_rows = self._flat.nbytes // self.block_size
        self.identity = identity or _spec_identity(offloading_spec, self.block_size)
        self.integrity = bool(integrity)
        self.async_lookup = _is_remote(metadata) if async_lookup is None else bool(async_lookup)
        self.events_on = bool(enable_kv_events)
        ev = getattr(getattr(offloading_spec, "kv_events_config", None),
                     "enable_kv_cache_events", None)
        if ev is False:  # vLLM's KV events are off: as the fs tier, emit none
            self.events_on = False
        self._open_stores(os.fspath(path), file_size, metadata, deployment, pool, rank, backend,
                          io_threads, entries, durable, mkdir, timeout_ms, mmap_reads, direct,
                          preallocate)
        self._init_state()
        self._workers = [threading.Thread(target=self._work, name=f"kvpage_tier_io{i}",
                                          daemon=True) for i in range(int(threads))]
        for t in self._workers:
            t.start()
        self._looker = None
        if self.async_lookup:
            self._looker = threading.Thread(target=self._lookup_worker,
                                            name="kvpage_tier_lookup", daemon=True)
            self._looker.start()

    # -- construction ---------------------------------------------------------

    def _open_stores(self, path, file_size, metadata, deployment, pool, rank, backend,
                     io_threads, entries, durable, mkdir, timeout_ms, mmap_reads, direct,
                     preallocate):
        if durable is None:  # with checksums a block not on disk after a crash is a failed load
            durable = not self.integrity
        common = dict(rank=int(rank), deployment=deployment, durable=bool(durable),
                      threads=int(io_threads), timeout_ms=timeout_ms, mkdir=mkdir)
        meta = _canonical(metadata)
        self._data_key = (os.path.realpath(path), meta, deployment, pool, int(rank))
        if direct is None and self.block_size % 4096:
            direct = False  # O_DIRECT takes rows of whole 4 KiB blocks only
        self._data = _open_shared(self._data_key, lambda: _open_data(
            direct, path, file_size, self.block_size, int(entries), meta=meta, pool=pool,
            backend=backend, mmap_reads=mmap_reads, tags=self.integrity, **common))
        self._sums = self._sums_key = None
        try:
            if preallocate:
                _preallocate(path, self._data.num_pages * self.block_size)
            # The blocks' tags check every load of a tier made with them;
            # checksums only for blocks written before (or without) tags.
            if self.integrity and (self._data.info()["tags"] != "on"
                                   or os.path.exists(path + ".sums")):
                spath, smeta = path + ".sums", _sums_location(path, meta)
                self._sums_key = (os.path.realpath(spath), smeta, deployment, pool, int(rank))
                n = self._data.num_pages
                self._sums = _open_shared(self._sums_key, lambda: Store(
                    spath, n * REC_SIZE, REC_SIZE, 64, meta=smeta, pool=pool + ".sums",
                    **common))
        except BaseException:
            _close_shared(self._data_key)
            raise

    def _init_state(self):
        self._jobs = queue.SimpleQueue()      # (kind, job_id, offload keys, rows, t0) or None
        self._finished = collections.deque()  # JobResult, appended by the workers
        self._events = collections.deque()
        self._cv = threading.Condition()
        self._inflight = 0
        self._closed = False
        self._known = collections.OrderedDict()  # offload keys of this tier, oldest first
        self._known_lock = threading.Lock()
        self._evictions = None
        self._verdicts = {}   # offload key -> True / False / None (asked, not answered)
        self._asked_by = {}   # req id -> offload keys it looked up
        self._unresolved = 0  # verdicts None
        self._lookups = queue.SimpleQueue()
        self._answers = queue.SimpleQueue()
        self._counts = collections.Counter()
        self._counts_lock = threading.Lock()

    @staticmethod
    def get_tier_type():
        """The type of vLLM's first tier API (before tier_type was passed)."""
        return TIER_TYPE

    def key(self, okey):
        """The kvpage key of an OffloadKey (bytes)."""
        return f"{self.identity}:{bytes(okey).hex()}"

    def _rows(self, ids):
        bs, n = self.block_size, self.num_rows
        for b in ids:
            if not 0 <= b < n:
                raise ValueError(f"KvpageTier: row {b} is outside primary_kv_view's {n} rows")
        return [self._flat[b * bs:(b + 1) * bs] for b in ids]

    # -- lookups --------------------------------------------------------------

    def lookup(self, key, req_context=None):
        """HIT / MISS; with async lookups RETRY until the answer is in."""
        if self._closed:
            return LookupResult.MISS
        okey = bytes(key)
        if not self.async_lookup:
            try:
                return LookupResult.HIT if self._exists([okey])[0] else LookupResult.MISS
            except Exception:  # the metadata failed: a miss, never an exception in the scheduler
                return LookupResult.MISS
        self._take_answers()
        req = getattr(req_context, "req_id", None)
        if req is not None:
            self._asked_by.setdefault(req, set()).add(okey)
        if okey not in self._verdicts:
            self._verdicts[okey] = None
            self._unresolved += 1
            self._lookups.put(okey)
        v = self._verdicts[okey]
        if v is None:
            return LookupResult.RETRY
        return LookupResult.HIT if v else LookupResult.MISS

    def _exists(self, okeys):
        keys = [self.key(k) for k in okeys]
        _, have = self._data.exists(keys)
        if self._sums is not None:
            _, sums = self._sums.exists(keys)
            have = [a and b for a, b in zip(have, sums)]
        return have

    def _lookup_worker(self):
        while True:
            batch = [self._lookups.get()]
            while True:
                try:
                    batch.append(self._lookups.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            batch = [k for k in batch if k is not None]
            if batch:
                try:
                    have = self._exists(batch)
                except Exception:  # the metadata failed: a miss, as vLLM's tiers answer
                    have = [False] * len(batch)
                self._answers.put(list(zip(batch, have)))
            if stop:
                return

    def _take_answers(self):
        while True:
            try:
                answers = self._answers.get_nowait()
            except queue.Empty:
                return
            for okey, have in answers:
                if okey in self._verdicts:
                    self._unresolved -= self._verdicts[okey] is None
                    self._verdicts[okey] = bool(have)

    def on_request_finished(self, req_context):
        """Forgets the lookups of a request (vLLM's tiers keep verdicts while
        a request that asked lives)."""
        mine = self._asked_by.pop(getattr(req_context, "req_id", None), ())
        if not mine:
            return
        still = set().union(*self._asked_by.values()) if self._asked_by else set()
        for okey in mine:
            if okey not in still and self._verdicts.get(okey) is not None:
                del self._verdicts[okey]

    request_finished = on_request_finished  # vLLM's first tier API

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def get_request_offloading_context(self, req_context):  # vLLM's first tier API
        return RequestOffloadingContext()

    def on_schedule_end(self, context=None):
        self._take_answers()

    def has_pending_work(self):
        """True while jobs or lookups are under way or results wait."""
        with self._cv:
            if self._inflight > 0 or self._finished:
                return True
        return self._unresolved > 0 or not self._answers.empty()

    # -- jobs -----------------------------------------------------------------

    def submit_store(self, job_metadata):
        """Queues a store of the job's rows under its keys; returns at once."""
        self._submit("store", job_metadata)

    def submit_load(self, job_metadata):
        """Queues a load of the job's keys into its rows; returns at once."""
        self._submit("load", job_metadata)

    def _submit(self, kind, job):
        okeys = [bytes(k) for k in job.keys]
        ids = _rows_of(job)
        if len(ids) != len(okeys):
            raise ValueError(f"KvpageTier: job {job.job_id} has {len(okeys)} keys "
                             f"but {len(ids)} rows")
        with self._cv:
            if self._closed:  # reported, never raised into the scheduler
                self._finished.append(_make(JobResult, job_id=job.job_id, success=False))
                return
            rows = self._rows(ids)
            self._inflight += 1
        self._jobs.put((kind, job.job_id, okeys, rows, time.monotonic()))

    def _work(self):
        while True:
            item = self._jobs.get()
            if item is None:
                return
            kind, job_id, okeys, rows, t0 = item
            ok_keys = None
            try:
                if kind == "touch":
                    self._touch(okeys)
                    ok = None
                elif kind == "store":
                    ok = self._store(okeys, rows)
                else:
                    ok, ok_keys = self._load(okeys, rows)
            except Exception:  # the metadata or the file failed: the job failed
                ok = False
            del rows, item
            with self._cv:
                if kind != "touch":
                    self._finished.append(_make(
                        JobResult, job_id=job_id, success=ok, successful_keys=ok_keys,
                        transfer_time=time.monotonic() - t0))
                self._inflight -= 1
                self._cv.notify_all()

    def _store(self, okeys, rows):
        keys = [self.key(k) for k in okeys]
        res = self._data.put(keys, rows)
        stored = [i for i, r in enumerate(res) if r == STORED]
        if self._sums is not None:
            stored += self._repair(keys, rows, [i for i, r in enumerate(res) if r == ALREADY])
            if stored and not self._put_sums([keys[i] for i in stored],
                                             [rows[i] for i in stored]):
                return False
        self._count("store", len(stored), len(stored) * self.block_size)
        self._remember([okeys[i] for i in range(len(okeys)) if res[i] in (STORED, ALREADY)])
        if self.async_lookup:
            self._answers.put([(okeys[i], True) for i in stored])
        if self.events_on and stored:
            self._event([okeys[i] for i in stored], False)
        if self.events_on:
            self._note_evictions()
        return all(r in (STORED, ALREADY) for r in res)

    def _repair(self, keys, rows, already):
        """Blocks held without their checksum (the checksums' own LRU let it
        go) are written again, so that they can be loaded."""
        if not already:
            return []
        _, have = self._sums.get([keys[i] for i in already], _bytes(len(already)))
        lost = [i for i, h in zip(already, have) if h < 0]  # (the get keeps both LRUs in step)
        if not lost:
            return []
        self._data.delete([keys[i] for i in lost])
        res = self._data.put([keys[i] for i in lost], [rows[i] for i in lost])
        return [i for i, r in zip(lost, res) if r == STORED]

    def _put_sums(self, keys, rows):
        recs = [_record(k, r) for k, r in zip(keys, rows)]
        self._sums.delete(keys)  # a block written again has new bytes: never keep its old sum
        res = self._sums.put(keys, recs)
        bad = [k for k, r in zip(keys, res) if r != STORED]
        if bad:  # a block without its checksum is never loaded: forget it
            self._data.delete(bad)
        return not bad

    def _load(self, okeys, rows):
        keys = [self.key(k) for k in okeys]
        _, res = self._data.get(keys, rows)
        good = [r == self.block_size for r in res]
        if self._sums is not None:
            recs = _bytes(len(keys), REC_SIZE)
            _, sres = self._sums.get(keys, recs)
            good = [g and s == REC_SIZE and _verify(k, bytes(rec), row)
                    for g, s, k, rec, row in zip(good, sres, keys, recs, rows)]
        bad = [k for k, g, r in zip(keys, good, res) if not g and r != -errno.ENOENT]
        if bad:  # unreadable or not its bytes: never loaded again
            self._data.delete(bad)
        n_ok = sum(good)
        self._count("load", n_ok, n_ok * self.block_size)
        self._remember([k for k, g in zip(okeys, good) if g])
        if n_ok == len(okeys):
            return True, None
        failed = [k for k, g in zip(okeys, good) if not g]
        self._forget(failed)
        if self.async_lookup:  # as vLLM's mark_miss: no promotion of these again
            self._answers.put([(k, False) for k in failed])
        return False, tuple(k for k, g in zip(okeys, good) if g) or None

    def get_finished_jobs(self):
        """Every job finished since the last call, each reported once."""
        self._take_answers()
        return _drain(self._finished)

    get_finished = get_finished_jobs  # vLLM's first tier API

    def drain_jobs(self):
        """Blocks until every submitted job has finished (its result then
        waits in get_finished_jobs)."""
        with self._cv:
            self._cv.wait_for(lambda: self._inflight == 0)

    # -- recency, events, figures ---------------------------------------------

    def touch(self, keys, req_context=None):
        """Marks blocks recently used: a lookup of each on a worker (kvpage's
        lookups move a block to the LRU's young end); returns at once."""
        okeys = [bytes(k) for k in keys]
        with self._cv:
            if not okeys or self._closed:
                return
            self._inflight += 1
        self._remember(okeys, only_known=True)
        self._jobs.put(("touch", None, okeys, None, 0.0))

    def _touch(self, okeys):
        keys = [self.key(k) for k in okeys]
        for store in (self._data, self._sums):  # a 1-byte read: its lookup is what counts
            if store is not None:
                store.get(keys, _bytes(len(keys)))

    def _remember(self, okeys, only_known=False):
        with self._known_lock:
            for k in okeys:
                if only_known and k not in self._known:
                    continue
                self._known[k] = None
                self._known.move_to_end(k)
            while len(self._known) > 2 * self._data.num_pages:
                self._known.popitem(last=False)

    def _forget(self, okeys):
        with self._known_lock:
            for k in okeys:
                self._known.pop(k, None)

    def _note_evictions(self):
        """Finds which of this tier's blocks the metadata evicted: when the
        rank's eviction count moved, the oldest of the blocks this tier knows
        are checked (kvpage evicts least recently used first)."""
        ev = self._data.stats()["evictions"]
        moved = 0 if self._evictions is None else ev - self._evictions
        self._evictions = ev
        if moved <= 0:
            return
        with self._known_lock:
            window = list(self._known)[:4 * moved + 64]
        if not window:
            return
        _, have = self._data.exists([self.key(k) for k in window])
        gone = [k for k, h in zip(window, have) if not h]
        self._forget(gone)
        if gone and self.events_on:
            self._event(gone, True)

    def _event(self, okeys, removed):
        self._events.append(_make(OffloadingEvent, keys=list(okeys), medium=self.medium,
                                  removed=removed, locality=self.locality))

    def take_events(self):
        """The blocks stored and evicted since the last call, as vLLM's
        OffloadingEvents (removed False / True)."""
        return _drain(self._events)

    def _count(self, what, blocks, nbytes):
        with self._counts_lock:
            self._counts[what + "_blocks"] += blocks
            self._counts[what + "_bytes"] += nbytes

    def get_stats(self):
        """The blocks and bytes stored and loaded since the last call, as
        vLLM's OffloadingConnectorStats when it is there, else a dict."""
        with self._counts_lock:
            counts, self._counts = dict(self._counts), collections.Counter()
        cls = _vllm("vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics",
                    "OffloadingConnectorStats")
        if cls is None or not hasattr(cls, "increase_counter"):
            return counts
        st = cls()
        for name, v in counts.items():
            st.increase_counter(f"vllm:kv_offload_kvpage_{name}", v)
        return st

    def stats(self):
        """The page file's figures (kvpage.Store.stats) with the tier's."""
        return self._data.stats()

    # -- the end --------------------------------------------------------------

    def shutdown(self):
        """Finishes the queued jobs, stops the threads, closes the stores and
        drops every reference to primary_kv_view. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
        self.drain_jobs()
        for _ in self._workers:
            self._jobs.put(None)
        for t in self._workers:
            t.join()
        if self._looker is not None:
            self._lookups.put(None)
            self._looker.join()
        self._flat.release()
        self._flat = None
        self._primary_kv_view = None
        if self._sums_key is not None:
            _close_shared(self._sums_key)
        _close_shared(self._data_key)
        self._data = self._sums = None


def register(tier_type=TIER_TYPE):
    """Registers the tier with vLLM's SecondaryTierFactory, for releases
    before module paths in the tier config (PR #51007): after it,
    {"type": "KvpageTier", ...} needs no module_path. Idempotent."""
    factory = _vllm(_TIER_FACTORY, "SecondaryTierFactory")
    if factory is None:
        raise ImportError("kvpage.vllm.register: vLLM's tiered offloading "
                          f"({_TIER_FACTORY}.SecondaryTierFactory) could not be imported")
    try:
        factory.register_tier(tier_type, __name__, "KvpageTier")
    except ValueError:
        if tier_type not in getattr(factory, "_registry", {}):
            raise


__all__ = ["KvpageTier", "register", "KvpageError"]
