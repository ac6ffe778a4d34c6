"""Finding libkvpage.so and declaring its functions for ctypes.

The library is found, in this order, at
  1. $KVPAGE_LIB (a path to libkvpage.so or libkvpage.so.0),
  2. the package's own copy (kvpage/libkvpage.so: `pip install ./python`
     builds it from the tree and puts it there),
  3. an installed copy (the dynamic loader's search path: `make install`
     puts it in PREFIX/lib; /usr/local/lib needs `ldconfig` once),
  4. the build tree of a source checkout (../../build/libkvpage.so beside
     this package's source).
When none loads, ImportError names every path tried and why each failed.

Every call goes through ctypes.CDLL, which releases the GIL for the length
of the C call: page I/O and requests to a metadata server never block the
other Python threads.
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("KVPAGE_LIB")
    if env:
        yield env, "$KVPAGE_LIB"
    yield os.path.join(_HERE, "libkvpage.so"), "the package's own copy"
    yield "libkvpage.so.0", "the dynamic loader's search path"
    root = os.path.dirname(os.path.dirname(_HERE))
    for d in ("build", "build-release"):
        yield os.path.join(root, d, "libkvpage.so"), "the build tree"


def _load():
    tried = []
    for path, where in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"  {path} ({where}): {e}")
    raise ImportError("kvpage: cannot load libkvpage.so; tried:\n" + "\n".join(tried) +
                      "\nReinstall the package (pip install ./python builds the library into "
                      "it), set KVPAGE_LIB to the library's path, install it (make install; "
                      "then ldconfig), or build it (make build).")


lib, path = _load()

c_int, c_int32, c_uint32, c_int64, c_uint64 = (ctypes.c_int, ctypes.c_int32, ctypes.c_uint32,
                                              ctypes.c_int64, ctypes.c_uint64)
c_size_t, c_void_p, c_char_p = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
P = ctypes.POINTER


class Error(ctypes.Structure):
    _fields_ = [("code", c_int), ("rule", c_int), ("index", c_int64), ("value", c_int64),
                ("limit", c_int64), ("msg", ctypes.c_char * 256)]


class PagefileOpts(ctypes.Structure):
    _fields_ = [("opts_size", c_size_t), ("size", c_uint64), ("bytes_per_page", c_uint64),
                ("entries", c_uint32), ("flags", c_uint32), ("backend", c_int32),
                ("threads", c_uint32), ("queues", c_uint32), ("mode", c_uint32),
                ("chunk_bytes", c_uint64)]


class PagefileOp(ctypes.Structure):
    _fields_ = [("offset", c_int64), ("buf", c_void_p), ("size", c_uint64)]


class MetaOpts(ctypes.Structure):
    _fields_ = [("opts_size", c_size_t), ("lease_ms", c_uint64), ("read_grace_ms", c_uint64),
                ("clock", c_void_p), ("clock_arg", c_void_p), ("data_dir", c_char_p),
                ("fsync", c_int), ("snapshot_bytes", c_uint64), ("readonly", c_int),
                ("log", c_void_p), ("log_arg", c_void_p), ("snapshot_mode", c_int),
                ("connect_timeout_ms", c_uint32), ("timeout_ms", c_uint32),
                ("retries", c_uint32), ("token", c_char_p)]


class MetaInfo(ctypes.Structure):
    """struct kvp_meta_info (kvpage/meta.h): what a metadata backend is and
    what its state promises. info_size first, as the C struct grows."""
    _fields_ = [("info_size", c_size_t), ("name", c_char_p), ("scheme", c_char_p),
                ("description", c_char_p), ("remote", c_int), ("holder", c_char_p),
                ("values_section", c_char_p), ("durability", c_int),
                ("durability_text", ctypes.c_char * 160), ("durability_meaning", c_char_p),
                ("durability_loss", c_char_p), ("durability_wanted", c_char_p),
                ("durability_source", c_char_p)]


class StoreOpts(ctypes.Structure):
    _fields_ = [("opts_size", c_size_t), ("path", c_char_p), ("file_size", c_uint64),
                ("bytes_per_page", c_uint64), ("entries", c_uint32),
                ("pagefile", P(PagefileOpts)), ("rank", c_uint32), ("deployment", c_char_p),
                ("pool", c_char_p), ("meta", c_char_p), ("meta_opts", P(MetaOpts)),
                ("meta_handle", c_void_p), ("per_rank", c_int), ("durable", c_int),
                ("threads", c_uint32), ("mkdir", c_int), ("readonly", c_int),
                ("no_tags", c_int)]


class PagefileInfo(ctypes.Structure):
    _fields_ = [("info_size", c_size_t), ("path", c_char_p), ("size", c_uint64),
                ("file_size", c_uint64), ("bytes_per_page", c_uint64), ("chunk_bytes", c_uint64),
                ("entries", c_uint32), ("flags", c_uint32), ("mode", c_uint32),
                ("backend_requested", c_int32), ("backend", c_int32 * 2), ("threads", c_uint32),
                ("queues", c_uint32), ("registered_buffers", c_uint32),
                ("direct_mem_align", c_uint32), ("direct_offset_align", c_uint32),
                ("backend_note", c_char_p), ("tags", c_int32), ("tags_path", c_char_p),
                ("tags_verified", c_uint64), ("tags_rejected", c_uint64),
                ("tags_unverified", c_uint64), ("tags_note", c_char_p),
                ("tags_slot_size", c_uint64), ("alloc_zero_copy", c_int32)]


class Str(ctypes.Structure):
    _fields_ = [("ptr", c_void_p), ("len", c_size_t)]


class ConfirmOpts(ctypes.Structure):
    """struct kvp_confirm_opts: the arrays as addresses."""
    _fields_ = [("opts_size", c_size_t), ("parents", c_void_p), ("token_ids", c_void_p),
                ("ntokens", c_void_p)]


class StoreBuf(ctypes.Structure):
    _fields_ = [("base", c_void_p), ("len", c_uint64)]


STATS_FIELDS = ("num_pages", "free", "reserved", "held", "keys", "hits", "misses",
                "allocations", "evictions", "puts", "gets", "stored", "already", "put_failed",
                "read", "missing", "get_failed", "bytes_written", "bytes_read", "rejected")


class StoreStats(ctypes.Structure):
    _fields_ = [("stats_size", c_size_t)] + [(f, c_uint64) for f in STATS_FIELDS]


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


E = P(Error)
strerror = _fn("kvp_strerror", c_char_p, c_int)

pagefile_opts_init = _fn("kvp_pagefile_opts_init", None, P(PagefileOpts))
pagefile_open = _fn("kvp_pagefile_open", c_int, c_char_p, P(PagefileOpts), P(c_void_p), E)
# The ops, results and error are addresses (c_void_p): PageFile builds them in arrays of words.
pagefile_read = _fn("kvp_pagefile_read", c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_void_p)
pagefile_write = _fn("kvp_pagefile_write", c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_void_p)
# keys: an array of char * (NULL: key unknown), or NULL.
pagefile_read_keyed = _fn("kvp_pagefile_read_keyed", c_int, c_void_p, c_void_p, c_void_p, c_size_t,
                          c_void_p, c_void_p)
pagefile_write_keyed = _fn("kvp_pagefile_write_keyed", c_int, c_void_p, c_void_p, c_void_p,
                           c_size_t, c_void_p, c_void_p)
pagefile_info = _fn("kvp_pagefile_info", c_int, c_void_p, P(PagefileInfo))
pagefile_flush = _fn("kvp_pagefile_flush", c_int, c_void_p, E)
pagefile_close = _fn("kvp_pagefile_close", None, c_void_p)
pagefile_path = _fn("kvp_pagefile_path", c_char_p, c_void_p)
pagefile_size = _fn("kvp_pagefile_size", c_uint64, c_void_p)
pagefile_file_size = _fn("kvp_pagefile_file_size", c_uint64, c_void_p)
pagefile_bytes_per_page = _fn("kvp_pagefile_bytes_per_page", c_uint64, c_void_p)
pagefile_entries = _fn("kvp_pagefile_entries", c_uint32, c_void_p)
pagefile_flags = _fn("kvp_pagefile_flags", c_uint32, c_void_p)
store_pagefile = _fn("kvp_store_pagefile", c_void_p, c_void_p)
pagefile_backend = _fn("kvp_pagefile_backend", c_int, c_void_p, c_int)
pagefile_backend_name = _fn("kvp_pagefile_backend_name", c_char_p, c_int)
pagefile_backend_description = _fn("kvp_pagefile_backend_description", c_char_p, c_int)
pagefile_backend_note = _fn("kvp_pagefile_backend_note", c_char_p, c_void_p)
pagefile_threads = _fn("kvp_pagefile_threads", c_uint32, c_void_p)
pagefile_queues = _fn("kvp_pagefile_queues", c_uint32, c_void_p)
pagefile_mem_align = _fn("kvp_pagefile_direct_mem_align", c_uint32, c_void_p)
pagefile_alloc = _fn("kvp_pagefile_alloc", c_void_p, c_void_p, c_uint64, E)
pagefile_free = _fn("kvp_pagefile_free", None, c_void_p, c_void_p)
# The regions: an array of struct kvp_pagefile_buf {void *base; uint64_t len;} as two words each.
pagefile_register_buffers = _fn("kvp_pagefile_register_buffers", c_int, c_void_p, c_void_p,
                                c_size_t, E)
pagefile_unregister_buffers = _fn("kvp_pagefile_unregister_buffers", c_int, c_void_p)
pagefile_offset_align = _fn("kvp_pagefile_direct_offset_align", c_uint32, c_void_p)

meta_opts_init = _fn("kvp_meta_opts_init", None, P(MetaOpts))
meta_open_at = _fn("kvp_meta_open_at", c_int, c_char_p, P(MetaOpts), P(c_void_p), E)
meta_close = _fn("kvp_meta_close", None, c_void_p)
meta_info = _fn("kvp_meta_info", c_int, c_void_p, P(MetaInfo))
meta_backend_info = _fn("kvp_meta_backend_info", c_int, c_size_t, P(MetaInfo))
meta_location_info = _fn("kvp_meta_location_info", c_int, c_char_p, c_int, P(MetaInfo), E)
store_opts_init = _fn("kvp_store_opts_init", None, P(StoreOpts))
store_open = _fn("kvp_store_open", c_int, P(StoreOpts), P(c_void_p), E)
store_close = _fn("kvp_store_close", None, c_void_p)
store_put = _fn("kvp_store_put", c_int, c_void_p, P(Str), P(StoreBuf), c_size_t, P(c_int64), E)
store_get = _fn("kvp_store_get", c_int64, c_void_p, P(Str), P(StoreBuf), c_size_t, P(c_int64), E)
# bufv: struct kvp_store_bufv {const struct kvp_store_buf *bufs; size_t n;}[] as two words each
store_putv = _fn("kvp_store_putv", c_int, c_void_p, P(Str), c_void_p, c_size_t, P(c_int64), E)
store_putv_ex = _fn("kvp_store_putv_ex", c_int, c_void_p, P(Str), c_void_p, c_size_t,
                    P(ConfirmOpts), P(c_int64), E)
store_getv = _fn("kvp_store_getv", c_int64, c_void_p, P(Str), c_void_p, c_size_t, P(c_int64), E)
store_exists = _fn("kvp_store_exists", c_int64, c_void_p, P(Str), c_size_t,
                   P(ctypes.c_uint8), E)
store_delete = _fn("kvp_store_delete", c_int, c_void_p, P(Str), c_size_t, E)
store_clear = _fn("kvp_store_clear", c_int, c_void_p, E)
store_stats = _fn("kvp_store_stats", c_int, c_void_p, P(StoreStats), E)
store_rank = _fn("kvp_store_rank", c_uint32, c_void_p)
store_num_pages = _fn("kvp_store_num_pages", c_uint64, c_void_p)
store_bytes_per_page = _fn("kvp_store_bytes_per_page", c_uint64, c_void_p)
store_location = _fn("kvp_store_location", c_char_p, c_void_p)
store_claim = _fn("kvp_store_claim", c_int, c_char_p, c_char_p, c_char_p, c_char_p, c_uint32, E)

page_keys = _fn("kvp_page_keys", c_int, P(c_uint32), c_size_t, c_size_t, c_char_p, c_char_p,
                c_size_t, c_void_p, c_size_t, P(c_size_t), E)
PAGE_KEY_LEN = 64


def check_layouts():
    """The C library's idea of each options struct's size, against ctypes'
    (a mismatch means these declarations are out of date)."""
    out = {}
    for cls, init in ((PagefileOpts, pagefile_opts_init), (MetaOpts, meta_opts_init),
                      (StoreOpts, store_opts_init)):
        buf = (ctypes.c_char * 4096)()
        init(ctypes.cast(buf, P(cls)))
        out[cls.__name__] = (c_size_t.from_buffer(buf).value, ctypes.sizeof(cls))
    # An info struct: the library fills what it knows of and says how much.
    buf = (ctypes.c_char * 4096)()
    c_size_t.from_buffer(buf).value = len(buf)
    meta_backend_info(0, ctypes.cast(buf, P(MetaInfo)))
    out["MetaInfo"] = (c_size_t.from_buffer(buf).value, ctypes.sizeof(MetaInfo))
    return out
