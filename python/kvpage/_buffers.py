"""Buffers to (address, length): anything with the buffer protocol
(bytearray, memoryview, numpy arrays, mmap) and CPU torch tensors, by data
pointer and byte size. A buffer that is not contiguous, or not writable where
bytes are read into it, is refused with a message saying so."""
import ctypes
import sys
from array import array

try:  # numpy is optional; its arrays get a fast path
    from numpy import ndarray as _ndarray
except ImportError:  # pragma: no cover
    _ndarray = None


_char_at = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def _torch_tensor(obj):
    t = type(obj)
    return t.__module__.split(".", 1)[0] == "torch" and hasattr(obj, "data_ptr")


# What makes the fast path give up (the slow path then finds the fault and
# words its message): a buffer of another kind, read-only or not contiguous,
# an empty one, an offset that is no int64.
_NOT_FAST = (TypeError, ValueError, BufferError, AttributeError, OverflowError, RuntimeError)


def _refuse():
    raise ValueError


def fast_words(code, buffers, offsets=None):
    """The struct words of a batch of the common buffers, built in one pass:
    array(code) of (offset,) address, size per buffer, and the tuple that
    keeps the buffers alive; or (None, None) for any other batch, which
    addresses() then takes with its checks and messages.

    Why one pass: after a batch of large pages the caller's core has copied
    megabytes, its caches hold none of Python's code or objects, and every
    further Python operation of the next call costs about a microsecond
    (bench/README.md, issue 14). The common buffers are writable C-contiguous
    numpy arrays and memoryviews (c_char.from_buffer refuses every other)
    and contiguous CPU torch tensors."""
    try:
        bufs = tuple(buffers)
        if not bufs:
            return None, None
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(bufs[0], torch.Tensor):
            if offsets is None:
                w = [x for t in bufs for x in (
                    t.data_ptr() if t.is_cpu and t.is_contiguous() else _refuse(),
                    t.numel() * t.element_size())]
            elif len(offsets) != len(bufs):
                return None, None
            else:
                w = [x for o, t in zip(offsets, bufs) for x in (
                    o, t.data_ptr() if t.is_cpu and t.is_contiguous() else _refuse(),
                    t.numel() * t.element_size())]
        elif offsets is None:
            w = [x for b in bufs for x in (_addressof(_char_at(b)), b.nbytes)]
        elif len(offsets) != len(bufs):
            return None, None
        else:
            w = [x for o, b in zip(offsets, bufs) for x in (o, _addressof(_char_at(b)), b.nbytes)]
        return array(code, w), bufs
    except _NOT_FAST:
        return None, None


def addresses(buffers, writable, what):
    """(addrs, nbytes, keepalive) of a batch of buffers: two lists and what
    keeps the memory alive. The common case, a writable C-contiguous numpy
    array, costs one ctypes call each (from_buffer refuses a non-contiguous
    or read-only array, which then takes address()'s path and its messages)."""
    addrs, sizes, keep = [], [], []
    for i, b in enumerate(buffers):
        if type(b) is _ndarray:
            try:
                c = _char_at(b)
            except (TypeError, ValueError, BufferError):
                pass
            else:
                addrs.append(_addressof(c))
                sizes.append(b.nbytes)
                keep.append(c)
                continue
        a, nb, k = address(b, writable, what, i)
        addrs.append(a)
        sizes.append(nb)
        keep.append(k)
    return addrs, sizes, keep


def address(obj, writable, what, index=None):
    """(address, nbytes, keepalive) of obj. what names it in messages: with
    index, "buffer INDEX of WHAT" (formatted only when there is an error)."""
    if type(obj) is _ndarray:  # the common case, made cheap (obj.ctypes costs 2 us)
        fl = obj.flags
        if fl.c_contiguous:
            nb = obj.nbytes
            if nb == 0:
                return 0, 0, obj
            if fl.writeable:
                c = _char_at(obj)
                return _addressof(c), nb, c
            if not writable:
                return obj.ctypes.data, nb, obj
    if index is not None:
        what = f"buffer {index} of {what}"
    if _torch_tensor(obj):
        if obj.device.type != "cpu":
            raise ValueError(f"{what} is a {obj.device.type} tensor: kvpage moves host memory; "
                             "copy it to the CPU (kvpage.compat.Hf3fsClient stages CUDA tensors)")
        if not obj.is_contiguous():
            raise ValueError(f"{what} is a non-contiguous tensor (shape {tuple(obj.shape)}, "
                             f"stride {tuple(obj.stride())}): pass .contiguous() or a view "
                             "of whole pages")
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None and hasattr(obj, "flags"):  # numpy: no copy, no from_buffer
        if not obj.flags.c_contiguous:
            raise ValueError(f"{what} is a non-contiguous array (strides {obj.strides})")
        if writable and not obj.flags.writeable:
            raise ValueError(f"{what} is read-only, but bytes are read into it")
        return ai["data"][0], obj.nbytes, obj
    if isinstance(obj, bytes):
        if writable:
            raise ValueError(f"{what} is bytes (read-only), but bytes are read into it")
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0, len(obj), obj
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what} is a {type(obj).__name__}: kvpage takes a buffer (bytearray, "
                        "memoryview, numpy array) or a CPU torch tensor") from None
    if not mv.c_contiguous:
        raise ValueError(f"{what} is a non-contiguous buffer")
    if mv.nbytes == 0:
        return 0, 0, mv
    if mv.readonly:
        if writable:
            raise ValueError(f"{what} is read-only, but bytes are read into it")
        copy = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv)
        return ctypes.addressof(copy), mv.nbytes, copy
    c = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
    return ctypes.addressof(c), mv.nbytes, (c, mv)
