"""kvpage.page_keys: the chained SHA-256 key of each full page of token ids
(kvpage/keys.h): with an empty salt exactly SGLang's HiCache keys."""
import ctypes

from kvpage import _lib
from kvpage.errors import from_c


def page_keys(tokens, page_size, parent=None, salt=b""):
    """One 64-character hex key per full page of page_size tokens (a partial
    last page has none). parent continues a chain; a non-empty salt (model,
    revision, KV dtype, layout, TP size) is hashed into the first page's key.
    tokens: a sequence of ints in 0 .. 2^32-1 (or a numpy/torch integer array)."""
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    n = len(tokens)
    try:
        arr = (ctypes.c_uint32 * max(n, 1))(*tokens)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"page_keys: token ids must be integers in 0 .. 2^32-1 ({e})") from None
    for i, t in enumerate(tokens):
        if not 0 <= t <= 0xFFFFFFFF:
            raise ValueError(f"page_keys: token {i} is {t}, " +
                             ("below 0" if t < 0 else "above 2^32-1"))
    if isinstance(salt, str):
        salt = salt.encode()
    if isinstance(parent, bytes):
        parent = parent.decode()
    max_keys = n // page_size if page_size > 0 else 0
    out = (ctypes.c_char * (_lib.PAGE_KEY_LEN + 1) * max(max_keys, 1))()
    nkeys = ctypes.c_size_t()
    err = _lib.Error()
    rc = _lib.page_keys(arr, n, page_size, parent.encode() if parent else None, bytes(salt),
                        len(salt), out, max_keys, ctypes.byref(nkeys), ctypes.byref(err))
    if rc:
        raise from_c("page_keys", rc, err)
    return [bytes(out[i].value).decode() for i in range(nkeys.value)]
