"""Stand-ins for the parts of vLLM that kvpage.vllm plugs into, written from
vLLM's code (not copied; vLLM is not installable here), for
tests/python/test_vllm_load_errors.py. Each piece names what it was written
from (repository vllm-project/vllm):

- BASE_SOURCE: KVConnectorBase_V1 and KVConnectorRole,
  vllm/distributed/kv_transfer/kv_connector/v1/base.py
  @ 003df2961dd8830c317a61f9745ccd557da9fa06 (get_finished,
  get_block_ids_with_load_errors and its contract: "failed block IDs must
  appear here no later than" the pass that reports the request in
  get_finished; reset_cache returning True/False/None).
- CONNECTOR_SOURCE: the worker load/save path and the rank of
  vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_connector.py
  @ 04db319915b0b83919a1dd90512f49b0359655b2: module globals Hf3fsClient,
  Hf3fsMetadataClient, get_tensor_model_parallel_rank, DEFAULT_MAX_IO_ENTRIES;
  AsyncOperationManager (one load thread running tasks
  (request_id, block_ids, keys, future) in order, _load_futures keeping a
  request's last task, a failed task ends in _fail_task ->
  future.set_result(False) yet _check_completed_loads reports every done
  future, whole chunk failing on any short read or missing page);
  HF3FSKVConnector._setup_storage_clients (rank =
  get_tensor_model_parallel_rank(), file hf3fs_vllm_data_file_{rank}, numjobs
  clients, metadata initialize); start_load_kv / wait_for_save in chunks of
  max_device_buffer_count; get_finished; close. The metadata client is
  Hf3fsGlobalMetadataClient of hf3fs_metadata_server.py
  @ f2f5f881568445dd54f2e8fb5ee8fc4cbc73c509 (POST f"{base_url}/{endpoint}",
  no clear call). Simplified, and said so where it is: one "layer" whose
  block is one page of uint8 on the CPU (gather/scatter copy rows; vLLM's
  Triton kernels and CUDA streams are not what is tested), keys given in
  the metadata instead of hashed from tokens.
- PARALLEL_STATE_SOURCE: get_tensor_model_parallel_rank,
  get_tensor_model_parallel_world_size, get_pp_group() (.rank_in_group,
  .world_size; asserts when not initialized) of
  vllm/distributed/parallel_state.py @ 0c175ae9295b575078961a68c4d3a2a838dce5ef,
  set by the test through set_ranks().
- handle_invalid_blocks(): the scheduler's use of the connector's output,
  vllm/v1/core/sched/scheduler.py @ 00024d314514900f361ad072af6931e403b7f589
  (recompute_kv_load_failures = kv_load_failure_policy == "recompute";
  _update_requests_with_invalid_blocks and _handle_invalid_blocks for
  requests WAITING_FOR_REMOTE_KVS), and the worker's order of calls,
  vllm/v1/worker/kv_connector_model_runner_mixin.py
  @ 00f4240ee6458263d76cf51ca7901ce1350bb4d1 (get_finished / transfer
  results first, then get_block_ids_with_load_errors, in one output).
"""
import sys
import types

BASE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.hf3fs_connector"
PARALLEL_STATE = "vllm.distributed.parallel_state"

BASE_SOURCE = '''
import enum


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorBase_V1:
    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def reset_cache(self):
        return None
'''

PARALLEL_STATE_SOURCE = '''
_TP = (0, 1)  # (rank, world size)
_PP = None    # (rank, world size), None: the group is not initialized


class _Group:
    def __init__(self, rank, size):
        self.rank_in_group, self.world_size = rank, size


def set_ranks(tp_rank=0, tp_size=1, pp_rank=None, pp_size=None):
    global _TP, _PP
    _TP = (tp_rank, tp_size)
    _PP = None if pp_rank is None else (pp_rank, pp_size)


def get_tensor_model_parallel_rank():
    return _TP[0]


def get_tensor_model_parallel_world_size():
    return _TP[1]


def get_pp_group():
    assert _PP is not None, "pipeline model parallel group is not initialized"
    return _Group(*_PP)
'''

CONNECTOR_SOURCE = '''
import json
import os
import queue
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorRole)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

DEFAULT_MAX_IO_ENTRIES = 8


# vLLM binds its USRBIO client or its mock here; kvpage.vllm must replace it
Hf3fsClient = None


class Hf3fsMetadataClient:
    def __init__(self, base_url="http://localhost:18000", max_retries=3):
        self.base_url = base_url.rstrip("/")

    def _post(self, endpoint, json_data):
        req = urllib.request.Request(f"{self.base_url}/{endpoint}",
                                     data=json.dumps(json_data).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if r.status != 204 and body else {}

    def initialize(self, rank, num_pages=0, role="worker"):
        self._post(f"rank/{rank}/initialize", {"num_pages": num_pages, "role": role})

    def allocate_pages_for_keys(self, rank, keys):
        return self._post("keys/batch_allocate", {"rank": rank, "keys": keys}).get("results", {})

    def confirm_write_for_keys(self, rank, key_confirmations, pages_to_release=None):
        self._post("keys/confirm_write", {"rank": rank, "confirmations": key_confirmations,
                                          "pages_to_release": pages_to_release or []})

    def batch_key_exists(self, keys):
        return self._post("keys/batch_exists", {"keys": keys}).get("exists", [])

    def get_key_locations(self, rank, keys):
        return self._post("keys/get_locations", {"rank": rank, "keys": keys}).get("locations", [])


class AtomicCounter:
    def __init__(self, n):
        self._n, self._i, self._lock = n, 0, threading.Lock()

    def next(self):
        with self._lock:
            i, self._i = self._i, (self._i + 1) % self._n
        return i


class CopyBufferAllocator:
    """Page-shaped staging buffers (CPU here, the GPU in vLLM); None past the limit."""
    def __init__(self, device, dtype, shape, max_count):
        self._free = [torch.zeros(shape, dtype=dtype) for _ in range(max_count)]
        self._lock = threading.Lock()

    def alloc_buffer(self, n):
        with self._lock:
            if n > len(self._free):
                return None
            out, self._free = self._free[:n], self._free[n:]
        return out

    def free_buffer(self, buffers):
        with self._lock:
            self._free.extend(buffers)


class _Stream:
    """A CUDA stream's interface, on the CPU."""
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


class AsyncOperationManager:
    def __init__(self, connector):
        self._connector = connector
        self._bytes_per_page = connector._bytes_per_page
        self._rank = connector._rank
        self._save_futures, self._load_futures = {}, {}
        self._pending_finished_requests = set()
        self._load_stream = self._save_stream = _Stream()
        self._save_buffer_allocator = CopyBufferAllocator(
            None, torch.uint8, connector._shape_per_page, connector._max_device_buffer_count)
        self._load_buffer_allocator = CopyBufferAllocator(
            None, torch.uint8, connector._shape_per_page, connector._max_device_buffer_count)
        self.failed, self.succeeded = [], []  # the stats vLLM keeps, per operation
        self._stop_event = threading.Event()
        self._save_queue, self._load_queue = queue.Queue(), queue.Queue()
        self._io_executor = ThreadPoolExecutor(max_workers=connector._numjobs)
        self._save_thread = threading.Thread(target=self._worker,
                                             args=(self._save_queue, self._handle_save_task))
        self._load_thread = threading.Thread(target=self._worker,
                                             args=(self._load_queue, self._handle_load_task))
        self._save_thread.start()
        self._load_thread.start()

    def _worker(self, q, handle):
        while not self._stop_event.is_set():
            try:
                task = q.get(timeout=0.05)
            except queue.Empty:
                continue
            handle(task)

    def submit_save_operation(self, request_id, block_ids, block_hashes):
        future = Future()
        self._save_queue.put((request_id, block_ids, block_hashes, future, None))
        self._save_futures.setdefault(request_id, []).append(future)
        return future

    def submit_load_operation(self, request_id, block_ids, block_hashes):
        future = Future()
        self._load_queue.put((request_id, block_ids, block_hashes, future))
        self._load_futures[request_id] = future  # the last chunk's only, as vLLM
        return future

    def get_finished_operations(self, finished_req_ids):
        return self._check_completed_saves(finished_req_ids), self._check_completed_loads()

    def _check_completed_saves(self, finished_req_ids):
        done = set()
        for rid in list(self._pending_finished_requests) + list(finished_req_ids):
            if rid not in self._save_futures:
                done.add(rid)
            elif all(f.done() for f in self._save_futures[rid]):
                done.add(rid)
                self._save_futures.pop(rid)
                self._pending_finished_requests.discard(rid)
            else:
                self._pending_finished_requests.add(rid)
        return done

    def _check_completed_loads(self):
        done = set()
        for rid in list(self._load_futures):
            if self._load_futures[rid].done():  # done, whatever its result
                done.add(rid)
                self._load_futures.pop(rid)
        return done

    def _handle_save_task(self, task):
        request_id, block_ids, keys, future, _event = task
        conn = self._connector
        results = conn._metadata_client.allocate_pages_for_keys(self._rank, [(k, "") for k in keys])
        if any(r[1] < 0 for r in results):
            return self._fail_task("Saved", "Page allocation failed", request_id, future)
        pages = [r[1] for r in results]
        buffers = self._save_buffer_allocator.alloc_buffer(len(block_ids))
        conn._gather_or_scatter_kv_caches(block_ids, buffers, "gather")
        offsets = [p * self._bytes_per_page for p in pages]
        futures = [self._io_executor.submit(conn._clients[conn._ac.next()].batch_write,
                                            offsets[i:i + DEFAULT_MAX_IO_ENTRIES],
                                            buffers[i:i + DEFAULT_MAX_IO_ENTRIES], None)
                   for i in range(0, len(offsets), DEFAULT_MAX_IO_ENTRIES)]
        ok = all(r == self._bytes_per_page for f in futures for r in f.result())
        self._save_buffer_allocator.free_buffer(buffers)
        if ok:
            conn._metadata_client.confirm_write_for_keys(self._rank, list(zip(keys, pages)), [])
            return self._succeed_task("Saved", time.perf_counter(), request_id, len(keys), future)
        conn._metadata_client.confirm_write_for_keys(self._rank, [], pages)
        return self._fail_task("Saved", "Write operation failed", request_id, future)

    def _handle_load_task(self, task):
        """vLLM's: any missing page or short read fails the whole chunk, nothing scattered."""
        request_id, block_ids, keys, future = task
        conn = self._connector
        try:
            pages = conn._metadata_client.get_key_locations(self._rank, keys)
            if any(p is None for p in pages):
                return self._fail_task("Loaded", "Blocks not found", request_id, future)
            buffers = self._load_buffer_allocator.alloc_buffer(len(block_ids))
            offsets = [p * self._bytes_per_page for p in pages]
            futures = [self._io_executor.submit(conn._clients[conn._ac.next()].batch_read,
                                                offsets[i:i + DEFAULT_MAX_IO_ENTRIES],
                                                buffers[i:i + DEFAULT_MAX_IO_ENTRIES])
                       for i in range(0, len(offsets), DEFAULT_MAX_IO_ENTRIES)]
            ok = all(r == self._bytes_per_page for f in futures for r in f.result())
            if not ok:
                self._load_buffer_allocator.free_buffer(buffers)
                return self._fail_task("Loaded", "Read operation failed", request_id, future)
            with self._load_stream:
                conn._gather_or_scatter_kv_caches(block_ids, buffers, "scatter")
            self._load_stream.synchronize()
            self._load_buffer_allocator.free_buffer(buffers)
            return self._succeed_task("Loaded", time.perf_counter(), request_id,
                                      len(block_ids), future)
        except Exception as e:
            return self._fail_task("Loaded", f"Task execution error: {e}", request_id, future)

    def _fail_task(self, operation, error_msg, request_id, future):
        self.failed.append((operation, request_id, error_msg))
        future.set_result(False)

    def _succeed_task(self, operation, start_time, request_id, block_count, future):
        self.succeeded.append((operation, request_id, block_count))
        future.set_result(True)

    def shutdown(self):
        self._stop_event.set()
        self._save_thread.join()
        self._load_thread.join()
        self._io_executor.shutdown(wait=True)


class HF3FSKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        kv_config = vllm_config.kv_transfer_config
        self._storage_path = kv_config.get_from_extra_config(
            "hf3fs_storage_path", "/vllm-workspace/mnt/hf3fs")
        self._metadata_server_url = kv_config.get_from_extra_config(
            "hf3fs_metadata_server_url", "http://localhost:18000")
        self._file_size = kv_config.get_from_extra_config("hf3fs_file_size", 1 << 30)
        self._numjobs = kv_config.get_from_extra_config("hf3fs_client_numjobs", 16)
        self._max_device_buffer_count = max(
            kv_config.get_from_extra_config("hf3fs_max_device_buffer_count", 128),
            self._numjobs * DEFAULT_MAX_IO_ENTRIES)
        if role == KVConnectorRole.SCHEDULER:
            self._metadata_client = Hf3fsMetadataClient()  # no URL, as vLLM
            self._metadata_client.initialize(0, role="scheduler")

    # one layer [num_blocks, bytes_per_page] of uint8: a block is one page
    def register_kv_caches(self, kv_caches):
        self._kv_caches = kv_caches
        first = next(iter(kv_caches.values()))
        self._bytes_per_page = first.shape[1] * first.element_size()
        self._shape_per_page = [first.shape[1]]
        self._setup_storage_clients()
        self._async_manager = AsyncOperationManager(self)

    def _setup_storage_clients(self):
        os.makedirs(self._storage_path, exist_ok=True)
        self._rank = get_tensor_model_parallel_rank()
        file_path = os.path.join(self._storage_path, f"hf3fs_vllm_data_file_{self._rank}")
        self._ac = AtomicCounter(self._numjobs)
        self._clients = [Hf3fsClient(path=file_path, size=self._file_size,
                                     bytes_per_page=self._bytes_per_page,
                                     entries=DEFAULT_MAX_IO_ENTRIES)
                         for _ in range(self._numjobs)]
        self._metadata_client = Hf3fsMetadataClient()
        self._metadata_client.initialize(self._rank, self._file_size // self._bytes_per_page,
                                         role="worker")

    def _gather_or_scatter_kv_caches(self, block_ids, block_buffers, operation):
        cache = next(iter(self._kv_caches.values()))
        for buf, block_id in zip(block_buffers, block_ids):
            if operation == "gather":
                buf.copy_(cache[block_id])
            else:
                cache[block_id].copy_(buf)

    # metadata: a list of SimpleNamespace(request_id, block_ids, load_keys, save_keys)
    def start_load_kv(self, forward_context, **kwargs):
        self._submit("load_keys", self._async_manager.submit_load_operation)

    def wait_for_save(self):
        self._submit("save_keys", self._async_manager.submit_save_operation)

    def _submit(self, field, submit):
        """Each request's blocks and keys, max_device_buffer_count at a time."""
        n = self._max_device_buffer_count
        for r in self._get_connector_metadata():
            keys = getattr(r, field) or []
            ids = r.block_ids[:len(keys)]
            for i in range(0, len(ids), n):
                submit(r.request_id, ids[i:i + n], keys[i:i + n])

    def get_finished(self, finished_req_ids):
        return self._async_manager.get_finished_operations(finished_req_ids)

    def close(self):
        if hasattr(self, "_async_manager"):
            self._async_manager.shutdown()
        for client in getattr(self, "_clients", []):
            client.close()
'''


def _module(name, source=None):
    m = types.ModuleType(name)
    m.__path__ = []
    if source is not None:
        exec(compile(source, name.replace(".", "/") + ".py", "exec"), m.__dict__)
    return m


def install(monkeypatch):
    """Fresh stand-in modules in sys.modules (undone by monkeypatch); returns
    (connector module, parallel_state module, base module)."""
    for name in ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
                 "vllm.distributed.kv_transfer.kv_connector",
                 "vllm.distributed.kv_transfer.kv_connector.v1",
                 "vllm.distributed.kv_transfer.kv_connector.v1.hf3fs"]:
        monkeypatch.setitem(sys.modules, name, _module(name))
    ps = _module(PARALLEL_STATE, PARALLEL_STATE_SOURCE)
    monkeypatch.setitem(sys.modules, PARALLEL_STATE, ps)
    base = _module(BASE_MODULE, BASE_SOURCE)
    monkeypatch.setitem(sys.modules, BASE_MODULE, base)
    cm = _module(CONNECTOR_MODULE, CONNECTOR_SOURCE)
    monkeypatch.setitem(sys.modules, CONNECTOR_MODULE, cm)
    return cm, ps, base


class KVTransferConfig:
    """The fields of vLLM's KVTransferConfig the connector and scheduler read
    (kv_load_failure_policy: "recompute" | "fail", default "fail")."""

    def __init__(self, extra, kv_load_failure_policy="fail"):
        self.kv_connector = "KvpageHF3FSConnector"
        self.kv_connector_module_path = "kvpage.vllm"
        self.kv_role = "kv_both"
        self.kv_connector_extra_config = dict(extra)
        self.kv_load_failure_policy = kv_load_failure_policy

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


class Request:
    """What the scheduler knows of a request waiting for its async load."""

    def __init__(self, request_id, block_ids, block_size):
        self.request_id, self.block_ids, self.block_size = request_id, list(block_ids), block_size
        self.status = "WAITING_FOR_REMOTE_KVS"
        self.num_computed_tokens = 0
        self.num_external_computed_tokens = len(block_ids) * block_size


def handle_invalid_blocks(requests, invalid_block_ids, policy, failed_recving):
    """The scheduler's _update_requests_with_invalid_blocks +
    _handle_invalid_blocks for async loads (evict_blocks=False). Returns the
    ids of the requests that fail (policy "fail"); with "recompute" the
    affected requests' num_computed_tokens end at their first invalid block
    and they join failed_recving (a set, updated)."""
    affected, marked = set(), set()
    for req in requests:
        if req.status != "WAITING_FOR_REMOTE_KVS":
            continue
        computed = (req.num_computed_tokens if req.request_id in failed_recving
                    else len(req.block_ids) * req.block_size)
        n_blocks = (computed + req.block_size - 1) // req.block_size
        hit = first = False
        for idx, block_id in zip(range(n_blocks), req.block_ids):
            if block_id not in invalid_block_ids:
                continue
            hit = True
            if block_id in marked:
                continue
            marked.add(block_id)
            if first:
                continue
            first = True
            req.num_computed_tokens = idx * req.block_size
            req.num_external_computed_tokens -= computed - req.num_computed_tokens
        if hit:
            affected.add(req.request_id)
    if not affected:
        return set()
    if policy != "recompute":
        return affected
    failed_recving |= affected
    return set()
