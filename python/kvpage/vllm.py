"""kvpage.vllm: vLLM's HF3FS KV connector with kvpage's page-I/O client,
selected by kv_transfer_config without patching vLLM:

  {"kv_connector": "KvpageHF3FSConnector",
   "kv_connector_module_path": "kvpage.vllm",
   "kv_role": "kv_both",
   "kv_connector_extra_config": {"hf3fs_storage_path": "/data/kvpage",
       "hf3fs_file_size": 1099511627776,
       "hf3fs_metadata_server_url": "http://HOST:18000"}}

vLLM refuses to register a second HF3FSKVConnector, and reads
kv_connector_module_path only for names it has not registered, hence the own
name. KvpageHF3FSConnector subclasses vLLM's HF3FSKVConnector and, before
that class's __init__ runs, rebinds two globals of the module that defines it:
  Hf3fsClient          -> kvpage.compat.Hf3fsClient (the clients are built
                          later, in register_kv_caches, from this name),
                          claiming each rank's file for the connector's
                          metadata (its URL, pool kv, the rank): a file that
                          another metadata owns is refused, not shared
  Hf3fsMetadataClient  -> the same class with hf3fs_metadata_server_url as
                          its base URL when it is built without one (vLLM
                          reads that setting and then builds the client
                          without it, so it always talks to localhost:18000)
and two more, so that the connector never computes on a failed load and
pipeline stages never share pages:
  AsyncOperationManager -> a subclass whose load task reads each block on its
                          own: a block whose page is missing or whose read is
                          not the full page (an error, a short read) is
                          recorded as failed and not scattered; the others are
                          loaded. get_block_ids_with_load_errors() reports the
                          failed blocks of each request in the same pass in
                          which get_finished() reports the request, as vLLM's
                          KVConnectorBase_V1 asks; the scheduler then applies
                          kv_load_failure_policy ("recompute": from the first
                          failed block on; "fail": the request ends with an
                          error). vLLM's own task fails a whole chunk and still
                          reports the request loaded, so it ran on whatever
                          the GPU blocks held.
  Keys: a page is written with its key and read with it, so that its
                          integrity tag binds its bytes to the key (README,
                          "Every page verified"): the metadata client notes
                          the page each key was given (batch_allocate), and
                          the file client writes each page with the key
                          noted for it; a load reads each page with its key.
                          A page whose bytes changed since (another writer,
                          a torn write), or that holds another key's page,
                          is a failed load of its block (below).
  get_tensor_model_parallel_rank -> the rank id of the files and metadata:
                          the TP rank plus pp_rank * tp_size (the TP rank
                          alone with one stage), so that stages, which hold
                          different layers, never share a file or a page.
Its metadata client's confirmations say that their keys are a chain
("prefix_key": null, protocol.md "Parents and tokens"): a save task's
blocks are consecutive full blocks of one request, each key chained on the
one before it, so kvpage serve's KV events carry each block's parent (not
the first's: the client does not know it). No token ids: the worker's save
path has the keys, not the tokens. (Read in vLLM's
kv_connector/v1/hf3fs/hf3fs_connector.py @ 04db319915b0b83919a1dd90512f49b0359655b2,
wait_for_save and the save task; its metadata client, base_url and
_session, in hf3fs_metadata_server.py @ f2f5f881568445dd54f2e8fb5ee8fc4cbc73c509.)
reset_cache() clears the connector's metadata namespace (POST /clear on its
metadata URL: every key of every rank of the namespace is forgotten, the ranks
stay initialized), which vLLM calls from reset_prefix_cache.
Everything else (geometry, keys, scheduling, staging through the GPU) is
vLLM's. The rebinding is process-wide: every HF3FS connector of the process
then uses kvpage's client (one connector per process is what vLLM builds).

Without vLLM this module still imports; constructing the class raises
ImportError saying so.
"""
import importlib
import json
import logging
import os
import re
import sys
import threading
import time
import urllib.request

from kvpage.compat import Hf3fsClient

CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.hf3fs_connector"
CONNECTOR_CLASS = "HF3FSKVConnector"
DEFAULT_METADATA_URL = "http://localhost:18000"
PARALLEL_STATE = "vllm.distributed.parallel_state"

log = logging.getLogger(__name__)

try:
    _Base = getattr(importlib.import_module(CONNECTOR_MODULE), CONNECTOR_CLASS)
    _IMPORT_ERROR = None
except Exception as e:  # vLLM (or its HF3FS connector) is not importable
    _Base = object
    _IMPORT_ERROR = e


def _extra_config(vllm_config):
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(ktc, "kv_connector_extra_config", None)
    return dict(extra or {})


# The keys of the pages about to be written, per rank: page -> key, noted
# by the metadata client's allocation and taken by the file client's write
# (vLLM's save task allocates, then writes offsets only). Process-wide, as
# the rebinding is; one save task at a time per connector.
_page_keys = {}
_page_keys_lock = threading.Lock()


def _note_pages(rank, results):
    """Notes batch_allocate's [key, page] results of rank."""
    try:
        pairs = [(int(p), str(k)) for k, p in results if type(p) is int and p >= 0]
    except (TypeError, ValueError):  # not the shape expected: write without keys
        return
    with _page_keys_lock:
        _page_keys.setdefault(int(rank), {}).update(pairs)


def _take_keys(rank, offsets, bytes_per_page):
    """The keys noted for the pages at offsets (None where none), forgotten."""
    with _page_keys_lock:
        noted = _page_keys.get(rank, {})
        return [noted.pop(int(o) // bytes_per_page, None) for o in offsets]


def _with_url(cls, url):
    """cls, building clients without a URL at url instead of its default,
    noting the page each key is allocated (_note_pages)."""
    if getattr(cls, "_kvpage_url", None) is not None:
        cls = cls.__bases__[0]  # already wrapped (a second connector): rewrap the original

    class _Client(cls):
        _kvpage_url = url

        def __init__(self, *args, **kwargs):
            if not args and not any(k in kwargs for k in ("base_url", "url", "server_url")):
                args = (url,)
            super().__init__(*args, **kwargs)

        def allocate_pages_for_keys(self, rank, keys):
            results = super().allocate_pages_for_keys(rank, keys)
            _note_pages(rank, results)
            return results

        def confirm_write_for_keys(self, rank, key_confirmations, pages_to_release=None):
            # A save task's keys are consecutive full blocks of one request
            # (vLLM's chained block keys, one chunk of them): each block's
            # parent is the block before it ("prefix_key": the first's is not
            # known here). kvpage serve's KV events then carry the chain.
            base = getattr(self, "base_url", None)
            if not key_confirmations or not isinstance(base, str):
                return super().confirm_write_for_keys(rank, key_confirmations, pages_to_release)
            body = {"rank": rank, "confirmations": [list(c) for c in key_confirmations],
                    "pages_to_release": list(pages_to_release or []), "prefix_key": None}
            _post_json(base, "/keys/confirm_write", body, getattr(self, "_session", None))

    _Client.__name__ = _Client.__qualname__ = cls.__name__
    return _Client


_RANK_FILE = re.compile(r"hf3fs_vllm_data_file_(\d+)$")


def stage_rank():
    """This process's rank id for page files and metadata: vLLM's TP rank,
    plus pp_rank * tp_size when the model is split into pipeline stages
    (stages hold different layers, so they must not share pages). With one
    stage it is the TP rank, as vLLM's own connector has it."""
    ps = importlib.import_module(PARALLEL_STATE)
    tp_rank = int(ps.get_tensor_model_parallel_rank())
    try:
        pp = ps.get_pp_group()
        pp_rank, pp_size = int(pp.rank_in_group), int(pp.world_size)
    except (AttributeError, AssertionError):  # no pipeline group (not initialized, older vLLM)
        return tp_rank
    if pp_size <= 1:
        return tp_rank
    return pp_rank * int(ps.get_tensor_model_parallel_world_size()) + tp_rank


def _rank_of(path):
    """The rank whose file path is (vLLM names it hf3fs_vllm_data_file_{rank}),
    else this process's stage_rank(), else None."""
    m = _RANK_FILE.search(os.path.basename(str(path)))
    if m:
        return int(m.group(1))
    try:
        return stage_rank()
    except Exception:
        return None


def _owned_client(url):
    """Hf3fsClient claiming each file for (url, its /ns/NAME or default, pool kv,
    the file's rank): the namespace vLLM's routes of kvpage serve use."""

    class _Client(Hf3fsClient):
        _kvpage_url = url

        def __init__(self, path, *args, **kwargs):
            rank = _rank_of(path)
            if rank is not None and "owner" not in kwargs:
                kwargs["owner"] = {"location": url, "rank": rank}
            self._kvpage_rank = rank
            super().__init__(path, *args, **kwargs)

        def batch_write(self, offsets, tensors, event=None, keys=None):
            if keys is None and self._kvpage_rank is not None:
                try:
                    keys = _take_keys(self._kvpage_rank, offsets, self.bytes_per_page)
                except TypeError:  # not a list of offsets: the client's check says so
                    keys = None
            return super().batch_write(offsets, tensors, event, keys)

    _Client.__name__ = _Client.__qualname__ = Hf3fsClient.__name__
    return _Client


class _LoadErrors:
    """The mixin of vLLM's AsyncOperationManager that install() puts in its
    module: a load task reads block by block and records the blocks that
    failed; when get_finished reports a request loaded, its failed blocks
    move to the set that take_load_errors() hands out once.

    Written against AsyncOperationManager of vLLM's hf3fs_connector.py
    (vllm-project/vllm @ 04db319915b0b83919a1dd90512f49b0359655b2): its load
    tasks are (request_id, block_ids, keys, future) run in order by one
    thread, and _load_futures keeps a request's last task."""

    _kvpage_entries = 8  # the pages of one batch_read: vLLM's DEFAULT_MAX_IO_ENTRIES

    def __init__(self, *args, **kwargs):
        # before vLLM's __init__, which starts the load thread
        self._kvpage_lock = threading.Lock()
        self._kvpage_failed = {}  # request id -> its failed block ids, until reported
        self._kvpage_errors = set()  # reported with their request, not yet taken
        super().__init__(*args, **kwargs)

    def _handle_load_task(self, task):
        request_id, block_ids, keys, future = task
        start = time.perf_counter()
        try:
            failed = self._load_blocks(list(block_ids), list(keys))
            why = f"{len(failed)} of {len(block_ids)} blocks not loaded (no location or not a full read)"
        except Exception as e:  # the metadata, a buffer, the scatter: nothing is known good
            failed, why = set(block_ids), f"Task execution error: {e}"
        with self._kvpage_lock:  # before the future: get_finished may report the request at once
            if failed:
                self._kvpage_failed.setdefault(request_id, set()).update(failed)
        if failed:
            return self._fail_task("Loaded", why, request_id, future)
        return self._succeed_task("Loaded", start, request_id, len(block_ids), future)

    def _load_blocks(self, block_ids, keys):
        """Reads the pages of keys into block_ids; returns the ids of the blocks
        that did not get their page (no key, no location, not a full read)."""
        conn = self._connector
        pages = conn._metadata_client.get_key_locations(self._rank, keys) if keys else []
        held = [type(p) is int and p >= 0 for p in pages]  # None: not (or no longer) stored
        todo = [(b, p) for b, p, h in zip(block_ids, pages, held) if h]
        todo_keys = [k for k, h in zip(keys, held) if h]
        failed = set(block_ids) - {b for b, _ in todo}
        if not todo:
            return failed
        buffers = self._load_buffer_allocator.alloc_buffer(len(todo))
        if buffers is None:
            raise RuntimeError(f"Buffer allocation failed for {len(todo)} blocks")
        try:
            results = self._read_pages([p for _, p in todo], buffers, todo_keys)
            good = [i for i, r in enumerate(results) if r == self._bytes_per_page]
            failed.update(b for (b, _), r in zip(todo, results) if r != self._bytes_per_page)
            if good:
                with _current(self._load_stream):
                    conn._gather_or_scatter_kv_caches(
                        [todo[i][0] for i in good], [buffers[i] for i in good], "scatter")
                self._load_stream.synchronize()
        finally:
            self._load_buffer_allocator.free_buffer(buffers)
        return failed

    def _read_pages(self, pages, buffers, keys):
        """batch_read of the pages into buffers, each with its key (its tag
        must name it), entries at a time on the I/O pool; one result per
        page (a batch that raised counts as failed)."""
        conn, step = self._connector, self._kvpage_entries
        futures = []
        for i in range(0, len(pages), step):
            client = conn._clients[conn._ac.next()]
            futures.append((i, self._io_executor.submit(
                client.batch_read, [p * self._bytes_per_page for p in pages[i:i + step]],
                buffers[i:i + step], keys=keys[i:i + step])))
        results = [-1] * len(pages)
        for i, fut in futures:
            try:
                res = list(fut.result())[:step]
            except Exception as e:
                log.error("kvpage.vllm: a batch_read of pages %s failed: %s", pages[i:i + step], e)
                continue
            results[i:i + len(res)] = res
        return results[:len(pages)]

    def _check_completed_loads(self):
        done = super()._check_completed_loads()
        with self._kvpage_lock:
            for rid in done:
                self._kvpage_errors |= self._kvpage_failed.pop(rid, set())
        return done

    def take_load_errors(self):
        """The failed blocks of the requests reported loaded since the last call."""
        with self._kvpage_lock:
            errors, self._kvpage_errors = self._kvpage_errors, set()
        return errors


def _current(stream):
    """The context in which stream is the current one: torch.cuda.stream(s)
    for a CUDA stream (vLLM writes `with torch.cuda.stream(s)` or, with newer
    torch, `with s`), the stream itself otherwise."""
    torch = sys.modules.get("torch")
    cuda_stream = getattr(getattr(torch, "cuda", None), "Stream", None)
    if cuda_stream is not None and isinstance(stream, cuda_stream):
        return torch.cuda.stream(stream)
    return stream


def _checked_manager(cls, entries):
    """vLLM's AsyncOperationManager with _LoadErrors mixed in (a manager
    already wrapped is rewrapped from vLLM's), batches of entries pages."""
    if issubclass(cls, _LoadErrors):
        cls = cls.__bases__[-1]

    class _Manager(_LoadErrors, cls):
        _kvpage_entries = int(entries)

    _Manager.__name__ = _Manager.__qualname__ = cls.__name__
    return _Manager


def install(module, metadata_url=None):
    """Rebinds module.Hf3fsClient to kvpage's client (claiming each rank's file
    for the metadata at metadata_url, or vLLM's default localhost:18000) and,
    when metadata_url is given, module.Hf3fsMetadataClient to one that uses
    it; module.AsyncOperationManager to one whose loads report failed blocks,
    and module.get_tensor_model_parallel_rank to stage_rank. Returns module."""
    module.Hf3fsClient = _owned_client(metadata_url or DEFAULT_METADATA_URL)
    if metadata_url and hasattr(module, "Hf3fsMetadataClient"):
        module.Hf3fsMetadataClient = _with_url(module.Hf3fsMetadataClient, metadata_url)
    if hasattr(module, "AsyncOperationManager"):
        module.AsyncOperationManager = _checked_manager(
            module.AsyncOperationManager, getattr(module, "DEFAULT_MAX_IO_ENTRIES", 8))
    if hasattr(module, "get_tensor_model_parallel_rank"):
        module.get_tensor_model_parallel_rank = stage_rank
    return module


def _post_json(url, path, body, session=None):
    """POST body (JSON) to url + path through session (a requests.Session:
    vLLM's metadata client's, with its retries) or urllib; True on 2xx,
    else raises (as vLLM's client does)."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if session is not None:
        r = session.post(url.rstrip("/") + path, data=data, headers=headers, timeout=30)
        r.raise_for_status()
        return True
    req = urllib.request.Request(url.rstrip("/") + path, data=data, headers=headers,
                                 method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return 200 <= r.status < 300


def _clear(url):
    """POST /clear on a metadata URL (vLLM's metadata client has no call for
    it): every key of the namespace is forgotten, its ranks stay."""
    return _post_json(url, "/clear", {})


class KvpageHF3FSConnector(_Base):
    """vLLM's HF3FS connector over kvpage.compat.Hf3fsClient, honouring
    hf3fs_metadata_server_url. Constructed by vLLM as
    (vllm_config, role[, kv_cache_config])."""

    def __init__(self, vllm_config, role, *args, **kwargs):
        if _Base is object:
            raise ImportError(
                f"kvpage.vllm: KvpageHF3FSConnector needs vLLM's HF3FS connector "
                f"({CONNECTOR_MODULE}.{CONNECTOR_CLASS}), which could not be imported: "
                f"{_IMPORT_ERROR!r}") from _IMPORT_ERROR
        url = _extra_config(vllm_config).get("hf3fs_metadata_server_url")
        # the module whose globals the connector's code reads (a re-exporting
        # shim's globals would not do)
        install(sys.modules[_Base.__module__], url)
        super().__init__(vllm_config, role, *args, **kwargs)

    def get_block_ids_with_load_errors(self):
        """The blocks whose load failed, of the requests get_finished has just
        reported loaded (vLLM calls this right after get_finished); each once."""
        manager = getattr(self, "_async_manager", None)
        if manager is None or not hasattr(manager, "take_load_errors"):
            return set()
        return manager.take_load_errors()

    def reset_cache(self):
        """Clears the connector's metadata namespace; True when it was cleared,
        False (logged) when the metadata server could not be reached."""
        url = (getattr(getattr(self, "_metadata_client", None), "base_url", None)
               or _extra_config(getattr(self, "_vllm_config", None)).get("hf3fs_metadata_server_url")
               or DEFAULT_METADATA_URL)
        try:
            return _clear(url)
        except Exception as e:
            log.error("kvpage.vllm: reset_cache could not clear the metadata: %s", e)
            return False


__all__ = ["KvpageHF3FSConnector", "install", "Hf3fsClient"]
from kvpage.vllm_tier import KvpageTier, register  # noqa: E402  (vLLM's secondary tier)
__all__ += ["KvpageTier", "register"]
