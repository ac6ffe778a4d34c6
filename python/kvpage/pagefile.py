"""kvpage.PageFile: batched page I/O on one storage file (kvpage/pagefile.h)."""
import ctypes
from array import array
import errno
import operator
import os

from kvpage import _lib
from kvpage._buffers import addresses, fast_words
from kvpage._handle import Handle
from kvpage._size import size_arg
from kvpage.errors import KvpageValueError, from_c


def _backend_values():
    """The library's page-I/O backends, name -> KVP_PAGEFILE_BACKEND_* value:
    kvp_pagefile_backend_name of 0 (auto), 1, ... up to the first "?" (the
    values are consecutive, kvpage/pagefile.h), so a backend the library
    gains is here without a copy."""
    names = {}
    while True:
        name = _lib.pagefile_backend_name(len(names)).decode()
        if name == "?":
            return names
        names[name] = len(names)


def _flag_values():
    """The library's KVP_PAGEFILE_* flags, name -> bit (kvp_pagefile_flag_name)."""
    flag_name = _lib._fn("kvp_pagefile_flag_name", ctypes.c_char_p, ctypes.c_uint32)
    return {flag_name(1 << b).decode(): 1 << b for b in range(32) if flag_name(1 << b)}


_BACKENDS = _backend_values()
_FLAGS = _flag_values()
_RULE_IO, _RULE_INTEGRITY = 11, 18  # enum kvp_rule: the per-operation failures
_TAGS = ("off", "on", "legacy")  # kvp_pagefile_info.tags
_TRUE = ("1", "true", "yes", "on")


def flag(v, default):
    """A yes/no setting: default when v is None; a string is yes when it is
    1, true, yes or on (any case); anything else by its truth."""
    if v is None:
        return default
    if isinstance(v, str):
        return v.strip().lower() in _TRUE
    return bool(v)


def mmap_reads_default(value):
    """value, or when None the environment's KVPAGE_MMAP_READS (off when unset)."""
    return flag(os.environ.get("KVPAGE_MMAP_READS") if value is None else value, False)


_I64 = (-(1 << 63), (1 << 63) - 1)
_OP_P = ctypes.POINTER(_lib.PagefileOp)
_ZERO = array("q", [0])
_ERR_WORDS = (ctypes.sizeof(_lib.Error) + 7) // 8


def _ops(op, offsets, buffers, writable):
    """A ctypes array of struct kvp_pagefile_op for a batch, and what keeps its
    buffers alive. (The structs are three 64-bit words each, filled in one
    go from lists: per-field ctypes assignments cost more than the I/O of a
    small page.)"""
    try:
        n = len(offsets)
    except TypeError:
        raise TypeError(f"{op}: offsets must be a sequence of ints") from None
    if len(buffers) != n:
        raise KvpageValueError(op, -errno.EINVAL,
                               f"{n} offsets but {len(buffers)} buffers: one buffer per offset",
                               "arg", -1, len(buffers), n)
    if not n:
        return ctypes.cast((ctypes.c_int64 * 3)(), ctypes.POINTER(_lib.PagefileOp)), 0, None
    addrs, sizes, keep = addresses(buffers, writable, op)
    offs = offsets if type(offsets) is list else list(offsets)
    if not all(type(o) is int for o in offs):
        offs = [_offset(op, i, o) for i, o in enumerate(offs)]
    if min(offs) < _I64[0] or max(offs) > _I64[1]:
        i = next(i for i, o in enumerate(offs) if not _I64[0] <= o <= _I64[1])
        raise KvpageValueError(op, -errno.EINVAL, f"offset {i} ({offs[i]}) is out of range",
                               "offset", i)
    words = [0] * (3 * n)
    words[0::3], words[1::3], words[2::3] = offs, addrs, sizes
    flat = array("q", words)
    return ctypes.cast(flat.buffer_info()[0], _OP_P), n, (keep, flat)


def key_array(op, keys, n):
    """A C array of n char * for the keyed calls (None entries: key unknown),
    and what keeps it alive; (None, None) for keys None."""
    if keys is None:
        return None, None
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{op}: keys must be a list of keys (or None), not one "
                        f"{type(keys).__name__}")
    keys = list(keys)
    if len(keys) != n:
        raise KvpageValueError(op, -errno.EINVAL,
                               f"{n} operations but {len(keys)} keys: one key (or None) per "
                               "operation", "arg", -1, len(keys), n)
    enc = []
    for i, k in enumerate(keys):
        if k is None:
            enc.append(None)
            continue
        b = k.encode() if isinstance(k, str) else bytes(k)
        if not b or b"\0" in b:
            raise KvpageValueError(op, -errno.EINVAL, f"key {i} is empty or holds a NUL byte",
                                   "key", i)
        enc.append(b)
    arr = (ctypes.c_char_p * max(n, 1))(*enc)
    return ctypes.addressof(arr), (arr, enc)


def zero_rejected(words, res):
    """Zeroes the buffers of the operations whose read was rejected by the
    page's integrity tag (-EBADMSG): their bytes are never handed out.
    words: the batch's struct words (offset, address, size per operation)."""
    for i, r in enumerate(res):
        if r == -errno.EBADMSG and words[3 * i + 2]:
            ctypes.memset(words[3 * i + 1], 0, words[3 * i + 2])


def _offset(op, i, off):
    if type(off) is int:
        return off
    try:
        return operator.index(off)  # ints and numpy's integers; not 1.5, not "7"
    except TypeError:
        raise KvpageValueError(op, -errno.EINVAL, f"offset {i} ({off!r}) is not an integer",
                               "offset", i) from None


def info_of(pf):
    """kvp_pagefile_info of the page file handle pf, as a dict (PageFile.info)."""
    inf = _lib.PagefileInfo()
    inf.info_size = ctypes.sizeof(inf)
    rc = _lib.pagefile_info(pf, ctypes.byref(inf))
    if rc:
        raise from_c("PageFile.info", rc, None)
    d = {}
    for name, _ in _lib.PagefileInfo._fields_[1:]:
        v = getattr(inf, name)
        d[name] = v.decode(errors="replace") if isinstance(v, bytes) else \
            "" if v is None and name.endswith(("path", "note")) else v
    d["backend"] = list(inf.backend)
    d["tags"] = _TAGS[inf.tags] if 0 <= inf.tags < len(_TAGS) else str(inf.tags)
    return d


class PageFile(Handle):
    """One storage file of pages of at most bytes_per_page bytes, moved in
    batches of at most entries operations (offset, buffer). Thread-safe: any
    number of threads may call read, write and flush on one PageFile.

    mmap_reads=True (None: the environment's KVPAGE_MMAP_READS) copies
    buffered reads of cached pages out of a mapping of the file with stores
    that bypass the CPU caches: faster into cold host memory, but an I/O error
    on a page evicted meanwhile, or a truncation by another program, then
    kills the process with SIGBUS (KVP_PAGEFILE_MMAP_READS in
    kvpage/pagefile.h).

    create=True creates a missing file; its directory must exist unless
    mkdir=True (a missing one is refused, naming it).

    backend: "auto" (on a 3FS mount with 3FS's USRBIO library found,
    "usrbio"; else "psync" or "uring" per direction, as bench/io found
    faster), or one of "psync", "uring", "usrbio" (kvpage/pagefile.h).

    tags=True (the default): every write records an integrity tag of the
    page (its bytes, and its key when write() is given keys) in the sidecar
    PATH.tags, and every read is checked against it: a page whose bytes
    changed since (another writer, a torn write, a bit flip), or written
    with another key than read() is given, reads as failed, -EBADMSG in its
    result, its buffer zeroed; the other pages of the batch are unaffected
    (README, "Every page verified"). tags=False: no sidecar, no checks."""

    def __init__(self, path, size, bytes_per_page, entries=8, *, create=True, direct=False,
                 aligned=False, exact_size=False, readonly=False, backend="auto", threads=0,
                 queues=0, mode=0o644, mmap_reads=None, mkdir=False, tags=True):
        if backend not in _BACKENDS:
            raise KvpageValueError("PageFile", -errno.EINVAL,
                                   f"backend {backend!r} is not one of {sorted(_BACKENDS)}", "arg")
        o = _lib.PagefileOpts()
        _lib.pagefile_opts_init(ctypes.byref(o))
        o.size = size_arg("PageFile", "size", size)
        o.bytes_per_page = size_arg("PageFile", "bytes_per_page", bytes_per_page)
        o.entries = int(entries)
        for name, on in (("create", create), ("direct", direct), ("aligned", aligned),
                         ("exact_size", exact_size), ("readonly", readonly),
                         ("mmap_reads", mmap_reads_default(mmap_reads)), ("mkdir", mkdir),
                         ("no_tags", not tags)):
            if on:
                o.flags |= _FLAGS[name]
        o.backend, o.threads, o.queues, o.mode = _BACKENDS[backend], threads, queues, mode
        h = ctypes.c_void_p()
        err = _lib.Error()
        rc = _lib.pagefile_open(str(path).encode(), ctypes.byref(o), ctypes.byref(h),
                                ctypes.byref(err))
        if rc:
            raise from_c("PageFile", rc, err)
        self._allocs = []  # (address, nbytes) of alloc(): registered, freed by close
        super().__init__(h, self._close_handle)

    def _close_handle(self, h):
        for addr, _ in self._allocs:
            _lib.pagefile_free(h, addr)
        self._allocs = []
        _lib.pagefile_close(h)

    def alloc(self, nbytes):
        """A writable memoryview of nbytes of zeroed host memory for pages,
        aligned for O_DIRECT. With the USRBIO backend it is memory the 3FS
        daemon reads and writes directly: reads into it and writes from it
        move without a copy (it is registered with the page file). With the
        other backends it is ordinary aligned memory; 2 MiB or more is 2 MiB
        aligned and asks for huge pages (the README's performance note on
        the first touch of host memory). It is released by close(): use it
        no longer than the page file."""
        n = size_arg("PageFile.alloc", "nbytes", nbytes)
        err = _lib.Error()
        addr = self._call("PageFile.alloc", _lib.pagefile_alloc, n, ctypes.byref(err))
        if not addr:
            raise from_c("PageFile.alloc", err.code or -errno.ENOMEM, err)
        self._allocs.append((addr, n))
        regs = array("Q", [w for a, m in self._allocs for w in (a, m)])
        rc = self._call("PageFile.alloc", _lib.pagefile_register_buffers, regs.buffer_info()[0],
                        len(self._allocs), ctypes.byref(err))
        if rc:
            self._allocs.pop()
            self._call("PageFile.alloc", _lib.pagefile_free, addr)
            raise from_c("PageFile.alloc", rc, err)
        return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")

    def _batch(self, op, fn, offsets, buffers, writable, keys=None, keyed=None):
        flat, keep = fast_words("q", buffers, offsets)
        if flat is not None:
            n = len(keep)
            arr = flat.buffer_info()[0]
        else:
            arr, n, keep = _ops(op, offsets, buffers, writable)
            flat = keep[1] if keep else _ZERO
        karr, kkeep = key_array(op, keys, n)
        # The results and the struct kvp_error in one array of words: one
        # object made, none to convert (see fast_words for why it counts).
        out = _ZERO * (n + _ERR_WORDS)
        res = out.buffer_info()[0]
        if karr is None:
            rc = self._call(op, fn, arr, n, res, res + 8 * n)
        else:
            rc = self._call(op, keyed, arr, karr, n, res, res + 8 * n)
        del kkeep
        if rc:
            err = _lib.Error.from_buffer(out, 8 * n)
            # per operation: an I/O error, or a page its tag rejected
            if rc == -errno.EINVAL or err.rule not in (_RULE_IO, _RULE_INTEGRITY):
                raise from_c(op, rc, err)
        results = out[:n].tolist()
        if rc == -errno.EBADMSG and writable:
            zero_rejected(flat, results)
        return results

    def read(self, offsets, buffers, keys=None):
        """Reads len(buffers[i]) bytes at offsets[i] into buffers[i]. Returns
        the bytes read per operation (a negative errno for one that failed:
        -EBADMSG for a page its integrity tag rejected, whose buffer is
        zeroed). keys (optional, one str/bytes or None per operation): the
        key each page was written with; a page written with another is
        rejected. A batch breaking a rule raises KvpageValueError and does
        nothing."""
        return self._batch("PageFile.read", _lib.pagefile_read, offsets, buffers, True, keys,
                           _lib.pagefile_read_keyed)

    def write(self, offsets, buffers, keys=None):
        """Writes buffers[i] at offsets[i]. Returns the bytes written per
        operation (a negative errno for one that failed). keys (optional, one
        str/bytes or None per operation): the key each page's tag is bound
        to (read() with another key rejects it)."""
        return self._batch("PageFile.write", _lib.pagefile_write, offsets, buffers, False, keys,
                           _lib.pagefile_write_keyed)

    def info(self):
        """Everything kvp_pagefile_info says, as a dict: the geometry, the
        backends, and the integrity tags: "tags" ("off", "on", or "legacy":
        pages written before tags are served unverified), "tags_path" (the
        sidecar), "tags_verified", "tags_rejected", "tags_unverified" (reads
        so far) and "tags_note" (the first rejection's message, "" before
        one)."""
        return self._call("PageFile.info", info_of)

    @property
    def tags(self):
        """"on", "off" or "legacy" (info()["tags"])."""
        return self.info()["tags"]

    def flush(self):
        """fsync: every completed write becomes durable."""
        err = _lib.Error()
        rc = self._call("PageFile.flush", _lib.pagefile_flush, ctypes.byref(err))
        if rc:
            raise from_c("PageFile.flush", rc, err)

    def _get(self, fn, *args):
        return self._call("PageFile", fn, *args)

    @property
    def path(self):
        return self._get(_lib.pagefile_path).decode()

    @property
    def size(self):
        return self._get(_lib.pagefile_size)

    @property
    def file_size(self):
        return self._get(_lib.pagefile_file_size)

    @property
    def bytes_per_page(self):
        return self._get(_lib.pagefile_bytes_per_page)

    @property
    def entries(self):
        return self._get(_lib.pagefile_entries)

    @property
    def flags(self):
        return self._get(_lib.pagefile_flags)

    def backend(self, write=False):
        """"psync", "uring" or "usrbio": what serves reads (write=False) or writes."""
        return _lib.pagefile_backend_name(self._get(_lib.pagefile_backend, int(bool(write)))).decode()

    @property
    def backend_note(self):
        return self._get(_lib.pagefile_backend_note).decode()

    @property
    def mmap_reads(self):
        return bool(self.flags & _FLAGS["mmap_reads"])

    @property
    def threads(self):
        return self._get(_lib.pagefile_threads)

    @property
    def queues(self):
        return self._get(_lib.pagefile_queues)

    @property
    def direct_mem_align(self):
        return self._get(_lib.pagefile_mem_align)

    @property
    def direct_offset_align(self):
        return self._get(_lib.pagefile_offset_align)

    def __repr__(self):
        if self._h is None:
            return "<kvpage.PageFile closed>"
        return (f"<kvpage.PageFile {self.path!r} size={self.size} "
                f"bytes_per_page={self.bytes_per_page} entries={self.entries}>")
