"""kvpage.compat.Hf3fsClient: a drop-in for the page-I/O client of vLLM's
HF3FS connector and SGLang's HiCache hf3fs backend, over kvpage.PageFile.

What differs from theirs: a bad batch raises ValueError whose message starts
with "Hf3fsClient.check Failed" and then says which operation broke which
rule with which values, and the client stays open (theirs closes itself);
every rule is checked on every operation (theirs uses all() where any() was
meant); results are matched to their operations; an empty batch is valid.
Several clients on one file and one client shared by many threads are safe
(kvp_pagefile is thread-safe; each client has its own file descriptor).

After close() (which may be called any number of times) the client does what
the engines' clients promise their callers: flush() does nothing and
batch_read/batch_write move nothing and answer 0 for every operation, never
an exception, also for a batch that was running when close() came.

CUDA tensors (vLLM passes them, with a CUDA event for writes) are staged
through pinned host memory with torch's own copies, after waiting for the
event. No GPU was available where this was written: that path is untested.
"""
import errno
import os
import threading

from kvpage import _lib
from kvpage._size import size_arg
from kvpage.errors import KvpageValueError
from kvpage.pagefile import PageFile
from kvpage.store import claim

_PREFIX = "Hf3fsClient.check Failed"


try:
    from numpy import ndarray as _ndarray
except ImportError:  # pragma: no cover
    _ndarray = None


def _on_gpu(tensors):
    """The tensors not in host memory (cheap for numpy arrays and CPU tensors)."""
    return [t for t in tensors if type(t) is not _ndarray and _is_tensor(t) and t.device.type != "cpu"]


def _is_tensor(t):
    return type(t).__module__.split(".", 1)[0] == "torch" and hasattr(t, "data_ptr")


def _nothing_moved(offsets):
    """A closed client's answer: 0 bytes for every operation."""
    try:
        return [0] * len(offsets)
    except TypeError:  # not even a list of offsets: still no exception
        return []


def _nbytes(t):
    if _is_tensor(t):
        return t.numel() * t.element_size()
    nb = getattr(t, "nbytes", None)
    if nb is not None:
        return nb
    return memoryview(t).nbytes


class Hf3fsClient:
    """Hf3fsClient(path, size, bytes_per_page, entries[, client_timeout]).

    mmap_reads: kvpage.PageFile's; None (the default) takes the environment's
    KVPAGE_MMAP_READS, for engines that construct the client themselves.

    owner: the metadata whose keys point into this file, as a dict with
    "location" (a metadata URL or directory, as kvpage.Store's meta) and
    optionally "rank" (0), "deployment" and "pool" (the defaults of
    kvpage.Store). Given, the file is claimed for it before it is opened
    (kvpage.store.claim): a file another owner recorded raises KvpageError
    (EEXIST) and is not opened. The engines' own code passes none (a client
    cannot know keys); kvpage.vllm passes its connector's.

    mkdir: the file's missing directories are created (True, the default:
    what the engines' clients do).

    backend: kvpage.PageFile's. "auto" (the default) uses 3FS's USRBIO rings
    when the file is on a 3FS mount and 3FS's library is found (as the
    engines' own clients do), else the file system's calls; alloc_host()
    hands out host memory that such a client reads into and writes from
    without a copy.

    tags: kvpage.PageFile's (True, the default): a page whose bytes changed
    since it was written through kvpage (another writer, a torn write, a
    bit flip) reads as failed, -EBADMSG in batch_read's result for that
    operation (its buffer zeroed), never the bytes; the other operations
    are unaffected and check() is as before. The engines' clients know no
    keys: the tag binds the bytes, not the key."""

    def __init__(self, path, size, bytes_per_page, entries, client_timeout=None, *,
                 mmap_reads=None, owner=None, mkdir=True, backend="auto", tags=True):
        # client_timeout (SGLang's fifth argument) bounds a 3FS ring wait; local
        # and FUSE I/O here has no such wait, so it is accepted and unused.
        self.path, self.size = path, size_arg("Hf3fsClient", "size", size)
        self.bytes_per_page = size_arg("Hf3fsClient", "bytes_per_page", bytes_per_page)
        self.entries = int(entries)
        self.client_timeout = client_timeout
        self._closed = False
        if owner is not None:
            o = dict(owner)
            unknown = set(o) - {"location", "rank", "deployment", "pool"}
            if unknown or "location" not in o:
                raise KvpageValueError("Hf3fsClient", -errno.EINVAL,
                                       "owner needs \"location\" and takes only \"rank\", "
                                       f"\"deployment\" and \"pool\" besides (got {sorted(o)})",
                                       "arg")
            if mkdir:  # the owner record sits beside the file: its directory first
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            claim(path, o["location"], rank=int(o.get("rank", 0)),
                  deployment=o.get("deployment"), pool=o.get("pool"))
        self._pf = PageFile(path, self.size, self.bytes_per_page, self.entries, create=True,
                            mmap_reads=mmap_reads, mkdir=mkdir, backend=backend, tags=tags)
        self._stage_lock = threading.Lock()
        self._stage = []  # pinned host buffers for CUDA tensors, reused

    def check(self, offsets, tensors):
        """Raises ValueError("Hf3fsClient.check Failed: ...") naming the first
        rule the batch breaks; the client stays usable."""
        n = len(offsets)
        if n > self.entries:
            raise ValueError(f"{_PREFIX}: {n} operations, more than entries = {self.entries}")
        if len(tensors) != n:
            raise ValueError(f"{_PREFIX}: {n} offsets but {len(tensors)} tensors")
        for i in range(n):
            off, t = offsets[i], tensors[i]
            size = _nbytes(t)
            if off < 0 or off + size > self.size:
                raise ValueError(f"{_PREFIX}: operation {i}: offset {off} + size {size} is "
                                 f"outside the file of {self.size} bytes")
            if size > self.bytes_per_page:
                raise ValueError(f"{_PREFIX}: operation {i}: size {size} exceeds "
                                 f"bytes_per_page {self.bytes_per_page}")
            if _is_tensor(t) and not t.is_contiguous():
                raise ValueError(f"{_PREFIX}: operation {i}: the tensor is not contiguous "
                                 f"(shape {tuple(t.shape)}, stride {tuple(t.stride())})")

    def _host(self, tensors, fill):
        """CUDA tensors -> pinned host tensors (copied in when fill)."""
        import torch
        if not torch.cuda.is_available():
            raise ValueError(f"{_PREFIX}: a {tensors[0].device} tensor, but this torch has no "
                             "CUDA support: pass CPU tensors")
        with self._stage_lock:
            stage = self._stage.pop() if self._stage else []
        while len(stage) < len(tensors):
            stage.append(torch.empty(self.bytes_per_page, dtype=torch.uint8, pin_memory=True))
        host = []
        for i, t in enumerate(tensors):
            h = stage[i][: _nbytes(t)].view(t.dtype).view(t.shape)
            if fill:
                h.copy_(t)
            host.append(h)
        return stage, host

    def _unstage(self, stage):
        with self._stage_lock:
            self._stage.append(stage)

    def _io(self, op, offsets, tensors, keys=None):
        """The page file's read (op "batch_read") or write ("batch_write"),
        its errors naming op; keys: the pages' keys (kvpage.PageFile's)."""
        if op == "batch_read":
            return self._pf._batch(op, _lib.pagefile_read, offsets, tensors, True, keys,
                                   _lib.pagefile_read_keyed)
        return self._pf._batch(op, _lib.pagefile_write, offsets, tensors, False, keys,
                               _lib.pagefile_write_keyed)

    def _direct(self, op, offsets, tensors, keys=None):
        """op straight on host memory (the page file's fast path first); None
        when a tensor is on a GPU and must be staged."""
        try:
            return self._io(op, offsets, tensors, keys)
        except KvpageValueError as e:
            raise ValueError(f"{_PREFIX}: {e.strerror}") from e
        except ValueError as e:  # a buffer kvpage cannot take, or a CUDA tensor
            if not _on_gpu(tensors):
                raise ValueError(f"{_PREFIX}: {e}") from e
        return None

    def _unless_closed(self, batch, offsets, *args):
        """batch(offsets, *args), or 0 bytes per operation once the client is
        closed (also when close() came while the batch ran)."""
        if self._closed:
            return _nothing_moved(offsets)
        try:
            return batch(offsets, *args)
        except Exception:
            if self._closed:
                return _nothing_moved(offsets)
            raise

    def batch_read(self, offsets, tensors, keys=None):
        """Reads each tensor's bytes at its offset. Returns the bytes read per
        operation, or a negative errno for one that failed (-EBADMSG: the
        page failed its integrity tag; its tensor is zeroed, or untouched
        when staged); 0 for every operation once the client is closed.
        keys (kvpage's, optional): the key each page was written with
        (batch_write's keys); a page written with another is rejected."""
        return self._unless_closed(self._read, offsets, tensors, keys)

    def _read(self, offsets, tensors, keys):
        res = self._direct("batch_read", offsets, tensors, keys)
        if res is not None:
            return res
        self.check(offsets, tensors)
        stage, host = self._host(tensors, False)
        try:
            res = self._io("batch_read", offsets, host, keys)
            for t, h, r in zip(tensors, host, res):
                if r == _nbytes(t):
                    t.copy_(h)
            return res
        finally:
            self._unstage(stage)

    def batch_write(self, offsets, tensors, event=None, keys=None):
        """Writes each tensor at its offset (after event, a CUDA event vLLM
        passes, has completed). Returns the bytes written per operation, or a
        negative errno for one that failed; 0 for every operation once the
        client is closed. keys (kvpage's, optional): each page's key, bound
        into its integrity tag."""
        return self._unless_closed(self._write, offsets, tensors, event, keys)

    def _write(self, offsets, tensors, event, keys):
        if event is not None and hasattr(event, "synchronize"):
            event.synchronize()
        res = self._direct("batch_write", offsets, tensors, keys)
        if res is not None:
            return res
        self.check(offsets, tensors)
        stage, host = self._host(tensors, True)
        try:
            return self._io("batch_write", offsets, host, keys)
        finally:
            self._unstage(stage)

    def alloc_host(self, nbytes):
        """A host buffer of nbytes (a torch uint8 tensor when torch is
        installed, else a writable memoryview) for the engine's host pool:
        with the USRBIO backend it is 3FS's shared memory, so batch_read and
        batch_write on tensors inside it move without a copy; otherwise
        ordinary aligned memory. Released by close(): use it no longer than
        the client."""
        mv = self._pf.alloc(nbytes)
        try:
            import torch
        except ImportError:  # pragma: no cover
            return mv
        return torch.frombuffer(mv, dtype=torch.uint8)

    @property
    def backend(self):
        """What moves the pages: "psync", "uring" or "usrbio"."""
        return self._pf.backend(True)

    def get_size(self):
        return self.size

    def flush(self):
        """fsync of the file; nothing once the client is closed."""
        if self._closed:
            return
        try:
            self._pf.flush()
        except Exception:
            if not self._closed:  # not a close that came meanwhile
                raise

    def close(self):
        """Closes the file (after the batches running on it have returned);
        a second close does nothing."""
        self._closed = True
        pf = getattr(self, "_pf", None)  # None: the constructor failed before opening
        if pf is not None:
            pf.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
