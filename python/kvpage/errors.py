"""kvpage's exceptions: every failure the library reports, with what it
says (which operation, which rule, which values)."""
import ctypes as _ctypes
import errno as _errno
import re as _re

from kvpage import _lib


def _rule_names():
    """The rules' names by number, as the library names them (kvp_rule_name
    in kvpage/error.h: NULL past the last)."""
    name = _lib._fn("kvp_rule_name", _ctypes.c_char_p, _ctypes.c_int)
    names = []
    while (n := name(len(names))) is not None:
        names.append(n.decode())
    return tuple(names)


RULES = _rule_names()


class KvpageError(OSError):
    """A call of libkvpage failed. .errno is the positive errno, .code the
    library's negative one; .op the call ("PageFile.read", ...); .rule the
    broken rule's name (see kvpage/error.h); .index, .value, .limit the
    element, the offending value and its bound (-1 / 0 when not about one)."""

    def __init__(self, op, code, msg, rule="none", index=-1, value=0, limit=0):
        super().__init__(-code, f"{op}: {msg}" if msg else f"{op}: {_errno.errorcode.get(-code, code)}")
        self.op, self.code, self.rule = op, code, rule
        self.index, self.value, self.limit = index, value, limit


class KvpageValueError(KvpageError, ValueError):
    """A bad argument (-EINVAL): nothing was done."""


# The library's hints name its C options; a Python caller reads the keyword
# argument that sets each (the CLI words the same hints as its flags).
_HINTS = (("or set mkdir)", "or pass mkdir=True)"),
          ("or ask for KVP_PAGEFILE_MKDIR)", "or pass mkdir=True)"),
          ("open it without KVP_PAGEFILE_DIRECT", "open it with direct=False"),
          ("opened with KVP_PAGEFILE_READONLY", "opened with readonly=True"))


# The resize refusal names the command line's clear; from Python the same is
# Store.clear() on a Store opened with the rank's present sizes.
_CLEAR = _re.compile(r"clear the rank \((kvpage clear [^)]*)\)")


def python_words(msg):
    """msg with the library's hints in the words of kvpage's Python API."""
    for c, py in _HINTS:
        msg = msg.replace(c, py)
    return _CLEAR.sub(r"clear the rank (Store.clear() on a Store opened with its present file "
                      r"size and page size, or \1)", msg)


def from_c(op, code, err):
    """The exception for a C call's negative return and its struct kvp_error."""
    msg = bytes(err.msg).split(b"\0", 1)[0].decode(errors="replace") if err is not None else ""
    msg = python_words(msg)
    if not msg:
        msg = _lib.strerror(code).decode(errors="replace")
    rule = RULES[err.rule] if err is not None and 0 <= err.rule < len(RULES) else "none"
    cls = KvpageValueError if code == -_errno.EINVAL else KvpageError
    if err is None:
        return cls(op, code, msg)
    return cls(op, code, msg, rule, err.index, err.value, err.limit)
