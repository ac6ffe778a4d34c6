"""Sizes as the command line takes them (src/util/size.h): a whole number
of bytes, optionally followed by K, M, G or T (powers of 1024, either case)
and then optionally iB or B: "4G", "2M", "1TiB", "512KB", "4096". Anything
else that is not a string goes through int() as before (ints, numpy ints)."""
import errno
import re

from kvpage.errors import KvpageValueError

_SIZE = re.compile(r"([0-9]+)(?:([kKmMgGtT])(?:iB|B)?)?")
_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}


def size_arg(op, name, v):
    """v as a number of bytes; KvpageValueError (a ValueError) naming the
    argument for a string that is not a size or does not fit in 64 bits."""
    if not isinstance(v, str):
        return int(v)
    m = _SIZE.fullmatch(v)
    if m:
        n = int(m.group(1)) << _SHIFT.get((m.group(2) or "").lower(), 0)
        if n < 1 << 64:
            return n
    raise KvpageValueError(op, -errno.EINVAL,
                           f"{name} {v!r} is not a size: a whole number of bytes, optionally "
                           f"followed by K, M, G or T (powers of 1024), e.g. 4G, 2M, 2MiB",
                           "arg")
