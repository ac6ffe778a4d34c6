"""kvpage.Store: put and get pages by key on one rank's file (kvpage/store.h)."""
import ctypes
import errno
import os
from array import array
from itertools import accumulate

from kvpage import _lib
from kvpage._buffers import addresses, fast_words
from kvpage._handle import Handle
from kvpage._size import size_arg
from kvpage.errors import KvpageValueError, from_c
from kvpage.pagefile import _BACKENDS, _FLAGS, info_of, mmap_reads_default

# The most buffers of one key's page in put / get (KVP_PAGEFILE_MAX_SEGS)
MAX_SEGMENTS = 1024
STORED = 1   # put: written and confirmed by this call
ALREADY = 0  # put: the key was there already; not rewritten


def _key_bytes(op, k, i):
    if isinstance(k, str):
        return k.encode()
    if isinstance(k, (bytes, bytearray, memoryview)):
        return bytes(k)
    raise TypeError(f"{op}: key {i} is a {type(k).__name__}, not str or bytes")


def _keys(op, keys):
    """struct kvp_str[] of the keys (pointer and length words, filled in one
    go, all pointing into one bytes object of the keys end to end)."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{op}: keys must be a list of keys, not one {type(keys).__name__}")
    if type(keys) is not list and type(keys) is not tuple:
        keys = list(keys)
    n = len(keys)
    if not n:
        return ctypes.cast((ctypes.c_uint64 * 2)(), ctypes.POINTER(_lib.Str)), 0, None
    # The common case, ASCII str keys, without a bytes object per key: one
    # join, one encode, the lengths by map (every per-key step in C; a step
    # per key in Python costs a microsecond or more once a batch's copies
    # have emptied the core's caches: see kvpage._buffers.fast_words).
    try:
        joined = "".join(keys)
    except TypeError:  # not all str
        joined = None
    if joined is not None and joined.isascii():
        blob = joined.encode("ascii")
        lens = list(map(len, keys))
    else:
        try:
            kb = [k.encode() for k in keys]
        except AttributeError:  # not all str
            kb = [k.encode() if type(k) is str else _key_bytes(op, k, i)
                  for i, k in enumerate(keys)]
        blob = b"".join(kb)
        lens = list(map(len, kb))
    base = _addr_of_bytes(blob)
    starts = list(accumulate(lens, initial=base))
    words = [0] * (2 * n)
    words[0::2], words[1::2] = starts[:n], lens
    flat = array("Q", words)
    return ctypes.cast(flat.buffer_info()[0], ctypes.POINTER(_lib.Str)), n, (blob, flat)


def _addr_of_bytes(b):
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0


def _one_per_key(op, buffers, n):
    if len(buffers) != n:
        raise KvpageValueError(op, -errno.EINVAL,
                               f"{n} keys but {len(buffers)} buffers: one buffer per key",
                               "arg", -1, len(buffers), n)


def _confirm_opts(op, n, parents, token_ids):
    """struct kvp_confirm_opts of put's parents and token_ids (each None, or
    one entry per key, None where not known): (opts, keepalive)."""
    o = _lib.ConfirmOpts(ctypes.sizeof(_lib.ConfirmOpts))
    keep = []
    for name, v in (("parents", parents), ("token_ids", token_ids)):
        if v is not None and len(v) != n:
            raise KvpageValueError(op, -errno.EINVAL, f"{n} keys but {len(v)} {name}", "arg",
                                   -1, len(v), n)
    if parents is not None:
        parr, _, kb = _keys(op, ["" if p is None else p for p in parents])  # "": not known
        o.parents = ctypes.cast(parr, ctypes.c_void_p)
        keep.append((parr, kb))
    if token_ids is not None:
        counts = array("I", [0 if t is None else len(t) for t in token_ids])
        try:
            flat = array("I", [x for t in token_ids if t is not None for x in t])
        except (OverflowError, TypeError) as e:
            raise KvpageValueError(op, -errno.EINVAL,
                                   f"token_ids: a token id is an integer from 0 to 2**32-1 ({e})",
                                   "arg", -1, 0, 0) from None
        if not flat:
            flat.append(0)
        base = flat.buffer_info()[0]
        ptrs = array("Q", [base + 4 * s for s in accumulate(counts[:-1], initial=0)]) \
            if n else array("Q", [0])
        o.token_ids = ptrs.buffer_info()[0]
        o.ntokens = counts.buffer_info()[0] if n else 0
        keep.append((counts, flat, ptrs))
    return o, keep


def _bufv_array(words, counts):
    """struct kvp_store_bufv[] over words (array("Q") of every segment's
    address and length, the keys' one after the other): (pointer, keepalive)."""
    if len(words) < 2 * sum(counts):
        raise ValueError("kvpage: fewer segment words than the counts say")
    if not words:
        words = array("Q", [0, 0])
    base = words.buffer_info()[0]
    n = len(counts)
    v = [0] * (2 * n)
    v[0::2] = [base + 16 * s for s in accumulate(counts[:-1], initial=0)]
    v[1::2] = counts
    vw = array("Q", v)
    return ctypes.c_void_p(vw.buffer_info()[0]), (words, vw)


def _location(meta):
    """A meta argument as the library takes it: a str (a path-like as its
    path). The library decides what it is (kvp__store_location): a URL,
    mem: or file:DIR as it is, any other path a directory, HOST:PORT that
    is no directory refused ("did you mean http://HOST:PORT?")."""
    if meta is not None and not isinstance(meta, str):
        meta = os.fspath(meta)
    return meta


def _c_str(v):
    return None if v is None else os.fsencode(v)


def claim(path, meta=None, *, rank=0, deployment=None, pool=None):
    """Claims the page file at path for one metadata owner (meta as Store's,
    None: PATH.meta; deployment None: the URL's /ns/NAME, else "default";
    pool None: "kv"), without opening a store: records it in PATH.owner
    when the file has no owner yet, and raises KvpageError (errno EEXIST,
    rule "owner") when it has another (kvp_store_claim in kvpage/store.h)."""
    err = _lib.Error()
    rc = _lib.store_claim(_c_str(os.fspath(path)), _c_str(_location(meta)), _c_str(deployment),
                          _c_str(pool), int(rank), ctypes.byref(err))
    if rc:
        raise from_c("claim", rc, err)


class Store(Handle):
    """One rank of one namespace: the rank's storage file and where its
    metadata lives (meta: a data directory, default PATH.meta; "mem:";
    "http://HOST:PORT[/ns/NAME]" for a kvpage serve; a bare "HOST:PORT" that
    is no directory is refused: did you mean http://HOST:PORT?). Thread-safe.
    mmap_reads: as kvpage.PageFile's (None: KVPAGE_MMAP_READS). direct:
    O_DIRECT page I/O (KVP_PAGEFILE_DIRECT), past the page cache.

    The file has one owner (meta, deployment, pool, rank), recorded in
    PATH.owner by its first store: a Store under another owner raises
    KvpageError (EEXIST, rule "owner"). A missing file is created when
    file_size is given, in an existing directory unless mkdir=True. A
    refused open changes nothing.

    readonly=True: for get and exists alone, writing nothing (no file,
    directory, owner record, log or snapshot; the file must exist; embedded
    metadata is recovered in memory under a shared lock, so a get's LRU
    touch is not kept); put, delete and clear raise (EROFS).

    tags=True (the default): every page put carries an integrity tag bound
    to its bytes and its key, and every get checks it: a page whose bytes
    changed since its put (another writer, a torn write, a bit flip), or
    that holds another key's page, is a miss (-ENOENT, its buffer zeroed,
    never the bytes), counted in stats()["rejected"], logged once, and its
    key dropped so that the next lookup is an honest miss; the other keys
    of the call are unaffected. tags=False: no tags, no checks (README,
    "Every page verified")."""

    _noun = "store"

    def __init__(self, path, file_size=0, bytes_per_page=None, entries=8, *, rank=0, meta=None,
                 deployment=None, pool=None, per_rank=False, durable=True, threads=4,
                 timeout_ms=0, connect_timeout_ms=0, retries=None, token=None, mmap_reads=None,
                 mkdir=False, backend="auto", direct=False, readonly=False, tags=True):
        if not bytes_per_page:
            raise KvpageValueError("Store", -errno.EINVAL, "bytes_per_page is required", "arg")
        o = _lib.StoreOpts()
        _lib.store_opts_init(ctypes.byref(o))
        mo = _lib.MetaOpts()
        _lib.meta_opts_init(ctypes.byref(mo))
        self._strings = []

        def s(v):
            if v is None:
                return None
            b = os.fsencode(v) if isinstance(v, os.PathLike) else (v.encode() if isinstance(v, str) else bytes(v))
            self._strings.append(b)
            return b

        o.path = s(os.fspath(path))
        o.file_size = size_arg("Store", "file_size", file_size)
        o.bytes_per_page = size_arg("Store", "bytes_per_page", bytes_per_page)
        o.entries = int(entries)
        o.rank = int(rank)
        o.deployment, o.pool = s(deployment), s(pool)
        o.meta = s(_location(meta))
        o.per_rank, o.durable, o.threads = int(bool(per_rank)), int(bool(durable)), int(threads)
        o.mkdir = int(bool(mkdir))
        o.readonly = int(bool(readonly))
        o.no_tags = int(not tags)
        if timeout_ms:
            mo.timeout_ms = int(timeout_ms)
        if connect_timeout_ms:
            mo.connect_timeout_ms = int(connect_timeout_ms)
        if retries is not None:
            mo.retries = int(retries)
        tok = token if token is not None else os.environ.get("KVPAGE_TOKEN")
        mo.token = s(tok)
        o.meta_opts = ctypes.pointer(mo)
        self._mo = mo
        if backend not in _BACKENDS:
            raise KvpageValueError("Store", -errno.EINVAL,
                                   f"backend {backend!r} is not one of {sorted(_BACKENDS)}", "arg")
        mmap = mmap_reads_default(mmap_reads)  # kvpage.PageFile's; None: KVPAGE_MMAP_READS
        if mmap or direct or backend != "auto":
            po = _lib.PagefileOpts()
            _lib.pagefile_opts_init(ctypes.byref(po))
            if mmap:
                po.flags |= _FLAGS["mmap_reads"]
            if direct:
                po.flags |= _FLAGS["direct"]
            po.backend = _BACKENDS[backend]
            o.pagefile = ctypes.pointer(po)
            self._po = po
        h = ctypes.c_void_p()
        err = _lib.Error()
        rc = _lib.store_open(ctypes.byref(o), ctypes.byref(h), ctypes.byref(err))
        if rc:
            raise from_c("Store", rc, err)
        super().__init__(h, _lib.store_close)
        self.rank = _lib.store_rank(h)
        self.num_pages = _lib.store_num_pages(h)
        self.bytes_per_page = _lib.store_bytes_per_page(h)
        self.location = _lib.store_location(h).decode()
        self.mmap_reads = bool(_lib.pagefile_flags(_lib.store_pagefile(h)) & _FLAGS["mmap_reads"])
        # what moves the pages: "psync", "uring" or "usrbio" (kvpage.PageFile.backend)
        pf = _lib.store_pagefile(h)
        self.backend = _lib.pagefile_backend_name(_lib.pagefile_backend(pf, 1)).decode()

    def _bufs(self, op, buffers, n, writable):
        """(the C array of the buffers, what keeps it alive, vectored): one
        struct kvp_store_buf per key, or, when a key has a list or tuple of
        buffers, one struct kvp_store_bufv per key (_bufv)."""
        _one_per_key(op, buffers, n)
        if not n:
            return ctypes.cast((ctypes.c_uint64 * 2)(), ctypes.POINTER(_lib.StoreBuf)), None, False
        flat, keep = fast_words("Q", buffers)
        if flat is not None:
            return (ctypes.cast(flat.buffer_info()[0], ctypes.POINTER(_lib.StoreBuf)),
                    (keep, flat), False)
        if any(type(b) is list or type(b) is tuple for b in buffers):
            return self._bufv(op, buffers, writable)
        addrs, sizes, keep = addresses(buffers, writable, op)
        words = [0] * (2 * n)
        words[0::2], words[1::2] = addrs, sizes
        flat = array("Q", words)
        return ctypes.cast(flat.buffer_info()[0], ctypes.POINTER(_lib.StoreBuf)), (keep, flat), False

    def _bufv(self, op, buffers, writable):
        """Keys whose page is several buffers (a list or tuple: back to back in
        the page, the first first; a single buffer is a list of one)."""
        segs = [b if type(b) is list or type(b) is tuple else (b,) for b in buffers]
        counts = list(map(len, segs))
        flat = [b for bs in segs for b in bs]
        words, keep = fast_words("Q", flat) if flat else (array("Q"), None)
        if words is None:
            words, keep = array("Q"), []
            for i, bs in enumerate(segs):
                addrs, sizes, k = addresses(bs, writable, f"{op} key {i}")
                w = [0] * (2 * len(bs))
                w[0::2], w[1::2] = addrs, sizes
                words.extend(w)
                keep.append(k)
        barr, vkeep = _bufv_array(words, counts)
        return barr, (keep, vkeep), True

    def _transfer(self, op, keys, barr, vec, n, write):
        """The C call of put (write) or get: (return, results, err)."""
        res = (ctypes.c_int64 * max(n, 1))()
        err = _lib.Error()
        fn = (_lib.store_putv if vec else _lib.store_put) if write else \
            (_lib.store_getv if vec else _lib.store_get)
        rc = self._call(op, fn, keys, barr, n, res, ctypes.byref(err))
        return rc, res, err

    def put(self, keys, buffers, parents=None, token_ids=None):
        """Stores buffers[i] under keys[i]. A key's buffer may be a list or
        tuple of buffers: its page is those bytes back to back, moved without
        joining them first (kvp_store_putv). Returns a result per key:
        kvpage.STORED (1), kvpage.ALREADY (0: the key was there, not
        rewritten) or a negative errno (-ENOSPC: no page could be had; the
        write's error). Bad arguments raise KvpageValueError and change
        nothing; a failure of the whole call (the metadata) raises KvpageError.

        parents[i] (the key of the page before keys[i] in its sequence) and
        token_ids[i] (its page's tokens), None where not known, are told with
        each key stored (kvp_store_putv_ex): kvpage serve's KV events carry
        them as parent_block_hash and token_ids."""
        karr, n, kb = _keys("Store.put", keys)
        if parents is None and token_ids is None:
            barr, keep, vec = self._bufs("Store.put", buffers, n, False)
            rc, res, err = self._transfer("Store.put", karr, barr, vec, n, True)
            del keep, kb
            return self._put_results(rc, res, err, n)
        _one_per_key("Store.put", buffers, n)
        if not n:
            return []
        opts, okeep = _confirm_opts("Store.put", n, parents, token_ids)
        barr, keep, _ = self._bufv("Store.put", buffers, False)
        res = (ctypes.c_int64 * max(n, 1))()
        err = _lib.Error()
        rc = self._call("Store.put", _lib.store_putv_ex, karr, barr, n, ctypes.byref(opts), res,
                        ctypes.byref(err))
        del keep, kb, okeep
        return self._put_results(rc, res, err, n)

    @staticmethod
    def _put_results(rc, res, err, n):
        if rc == -errno.EINVAL or (rc < 0 and err.index < 0):
            raise from_c("Store.put", rc, err)
        return list(res[:n])

    def get(self, keys, buffers):
        """Loads the pages of keys[i] into buffers[i] (a list or tuple of
        buffers: the page's bytes in order, back to back, as put took them).
        Returns (lead, results): lead is the number of leading keys read in
        full, results[i] the bytes read (a key's buffers' sum), -ENOENT (the
        key is not there: its buffers are untouched; or its page failed its
        integrity tag: its buffers are zeroed) or the read's negative
        errno."""
        karr, n, kb = _keys("Store.get", keys)
        barr, keep, vec = self._bufs("Store.get", buffers, n, True)
        lead, res, err = self._transfer("Store.get", karr, barr, vec, n, False)
        del keep, kb
        return self._get_results(lead, res, err, n)

    @staticmethod
    def _get_results(lead, res, err, n):
        if lead < 0:
            raise from_c("Store.get", lead, err)
        return lead, list(res[:n])

    def _segments(self, write, keys, words, counts):
        """put (write) or get of pages given as raw host memory: words, an
        array("Q") of (address, length) per segment, counts[i] segments for
        keys[i] (kvpage.sglang's hybrid pools, whose pointers come from the
        host pool). The memory must stay valid for the call."""
        op = "Store.put" if write else "Store.get"
        karr, n, kb = _keys(op, keys)
        if len(counts) != n:
            raise KvpageValueError(op, -errno.EINVAL, f"{n} keys but {len(counts)} pages",
                                   "arg", -1, len(counts), n)
        if not n:
            return [] if write else (0, [])
        barr, keep = _bufv_array(words, counts)
        rc, res, err = self._transfer(op, karr, barr, True, n, write)
        del keep, kb
        return self._put_results(rc, res, err, n) if write else \
            self._get_results(rc, res, err, n)

    def exists(self, keys):
        """Returns (lead, flags): flags[i] is True where keys[i] is there; lead
        the number of leading keys that are."""
        karr, n, kb = _keys("Store.exists", keys)
        out = (ctypes.c_uint8 * max(n, 1))()
        err = _lib.Error()
        lead = self._call("Store.exists", _lib.store_exists, karr, n, out, ctypes.byref(err))
        if lead < 0:
            raise from_c("Store.exists", lead, err)
        return lead, [bool(v) for v in out[:n]]

    def delete(self, keys):
        """Forgets keys on this rank (unknown keys are ignored)."""
        karr, n, kb = _keys("Store.delete", keys)
        err = _lib.Error()
        rc = self._call("Store.delete", _lib.store_delete, karr, n, ctypes.byref(err))
        if rc:
            raise from_c("Store.delete", rc, err)

    def clear(self):
        """Forgets every key of this rank; all its pages become free."""
        err = _lib.Error()
        rc = self._call("Store.clear", _lib.store_clear, ctypes.byref(err))
        if rc:
            raise from_c("Store.clear", rc, err)

    def stats(self):
        """The rank's pages (num_pages, free, reserved, held, keys, hits,
        misses, allocations, evictions) and this handle's calls (puts, gets,
        stored, already, put_failed, read, missing, get_failed,
        bytes_written, bytes_read, rejected: the keys whose page failed its
        integrity tag, each also counted in missing), as a dict."""
        st = _lib.StoreStats()
        st.stats_size = ctypes.sizeof(st)
        err = _lib.Error()
        rc = self._call("Store.stats", _lib.store_stats, ctypes.byref(st), ctypes.byref(err))
        if rc:
            raise from_c("Store.stats", rc, err)
        return {f: getattr(st, f) for f in _lib.STATS_FIELDS}

    def info(self):
        """The page file's figures (kvpage.PageFile.info): its geometry and
        backends, and its integrity tags ("tags": "on", "off" or "legacy";
        "tags_verified", "tags_rejected", "tags_unverified", "tags_note")."""
        return self._call("Store.info", lambda h: info_of(_lib.store_pagefile(h)))

    def __repr__(self):
        state = "closed" if self._h is None else f"{self.num_pages} pages of {self.bytes_per_page} bytes"
        return f"<kvpage.Store rank {self.rank} at {self.location}: {state}>"
