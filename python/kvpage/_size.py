"""Sizes as the command line takes them (kvp_parse_size, kvpage/size.h): a
whole number of bytes, optionally followed by K, M, G or T (powers of 1024,
either case) and then optionally iB or B: "4G", "2M", "1TiB", "512KB",
"4096". Anything else that is not a string goes through int() as before
(ints, numpy ints)."""
import ctypes
import errno

from kvpage._lib import P, _fn, c_char_p, c_int, c_uint64
from kvpage.errors import KvpageValueError

_parse_size = _fn("kvp_parse_size", c_int, c_char_p, P(c_uint64))


def size_arg(op, name, v):
    """v as a number of bytes; KvpageValueError (a ValueError) naming the
    argument for a string that is not a size or does not fit in 64 bits."""
    if not isinstance(v, str):
        return int(v)
    n = c_uint64()
    # The library reads ASCII up to the first NUL: anything else is not a size.
    if v.isascii() and "\0" not in v and _parse_size(v.encode(), ctypes.byref(n)) == 0:
        return n.value
    raise KvpageValueError(op, -errno.EINVAL,
                           f"{name} {v!r} is not a size: a whole number of bytes, optionally "
                           f"followed by K, M, G or T (powers of 1024), e.g. 4G, 2M, 2MiB",
                           "arg")
