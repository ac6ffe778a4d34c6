"""What PageFile and Store share: a C handle that many threads may use at
once and that close() frees only once the calls running on it have
returned."""
import errno
import threading

from kvpage.errors import KvpageError


class Handle:
    _noun = "handle"  # for "the page file is closed"

    def __init__(self, h, closer):
        self._h, self._closer = h, closer
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # One entry per call running. list.append and list.pop are atomic
        # (the GIL; per-object locks without it), so a call costs no lock
        # unless a close is waiting: the hot path of a batch is a handful of
        # Python operations, and each costs a microsecond once the batch's
        # copies have pushed Python out of the core's caches.
        self._users = []
        self._closing = False

    def _call(self, op, fn, *args):
        """fn(handle, *args), with the handle held so that close waits for it."""
        users = self._users
        users.append(None)  # before the check below; close sets _closing, then looks here
        try:
            h = self._h
            if h is None or self._closing:
                raise KvpageError(op, -errno.EBADF, f"the {self._noun} is closed", "arg")
            return fn(h, *args)
        finally:
            users.pop()
            if self._closing:  # a close waits: wake it
                with self._lock:
                    self._idle.notify_all()

    def close(self):
        """Waits for the calls running, then closes. A second close does nothing."""
        with self._lock:
            if self._h is None or self._closing:
                return
            self._closing = True
            while self._users:
                self._idle.wait(0.05)  # notified by the last call; the timeout only a safety net
            h, self._h = self._h, None
        self._closer(h)

    @property
    def closed(self):
        return self._h is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
