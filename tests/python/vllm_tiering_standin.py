"""Stand-ins of vLLM's tiered-offloading modules (vLLM cannot be installed
here), written from the repository vllm-project/vllm as the search index
stores it; only what a secondary tier sees is reproduced:

  vllm/v1/kv_offload/base.py @ 14d6506e258a4e59702f2690c05de70cbcec87f1
      OffloadKey (block hash + 4-byte big-endian group index), ReqContext,
      OffloadingEvent(keys, medium, removed); LookupResult (MISS, HIT,
      HIT_PENDING, RETRY), RequestOffloadingContext and ScheduleEndContext
      as vllm/v1/kv_offload/tiering/fs/manager.py imports them from there
      @ 1d0a6c68db87c40d4d5bbf47ed7ea10ae3409251.
  vllm/v1/kv_offload/tiering/base.py, two versions (the index gives them by
      file id, not by commit; find_files names commit
      2ac005777b4f4e08e88c469794145674a069d4bd for the path):
      "aug2026" (file id 54668088396): JobMetadata(job_id, keys, block_ids,
      is_promotion, req_context), JobResult(job_id, success), the abstract
      lookup -> LookupResult, submit_store, submit_load, get_finished_jobs,
      on_new_request, drain_jobs; "later" (file id 69756206310, later main):
      TransferJob(job_id, keys, chunk_ids, is_promotion, req_context),
      JobResult(job_id, success, successful_keys=None, transfer_time=None)
      (partial success of promotions), class attribute medium.
  vllm/v1/kv_offload/tiering/factory.py: register_tier(tier_type,
      module_path, class_name) and create_secondary_tier(tier_config,
      primary_kv_view, offloading_spec) passing offloading_spec=,
      primary_kv_view=, tier_type= and the config's other keys (file id
      54532185971; register_tier also @ 0411f953de014cc29c91aa7060d66f603bde6a54);
      with module_paths (PR #51007, file id 57442209518): get_tier_class
      imports tier_config["module_path"] for an unregistered type, takes the
      class named by type, asserts it subclasses SecondaryTierManager, and
      create_secondary_tier drops "module_path" from the keys it passes.
  The offloading spec: only kv_events_config.enable_kv_cache_events (as the
      fs tier @ 0255eeaabf66661958ae72b1e85eebcdb39de2a5 reads it) and a
      config.model name and dtype (FileMapper @ 0078e9d2b020be709d7d756877106fd1015ea4f4).
"""
import abc
import dataclasses
import enum
import importlib
import sys
import types
from typing import Any, Collection

import numpy as np


def _base_module():
    m = types.ModuleType("vllm.v1.kv_offload.base")

    def make_offload_key(block_hash, group_idx):
        return bytes(block_hash) + int(group_idx).to_bytes(4, "big", signed=False)

    @dataclasses.dataclass
    class ReqContext:
        req_id: str
        kv_transfer_params: dict = None

    class LookupResult(enum.Enum):
        MISS = enum.auto()
        HIT = enum.auto()
        HIT_PENDING = enum.auto()
        RETRY = enum.auto()

    @dataclasses.dataclass
    class OffloadingEvent:
        keys: list
        medium: str
        removed: bool

    @dataclasses.dataclass
    class RequestOffloadingContext:
        policy: Any = "block_level"

    @dataclasses.dataclass
    class ScheduleEndContext:
        new_req_ids: Collection = ()
        preempted_req_ids: Collection = ()

    m.OffloadKey = bytes
    m.make_offload_key = make_offload_key
    m.ReqContext, m.LookupResult, m.OffloadingEvent = ReqContext, LookupResult, OffloadingEvent
    m.RequestOffloadingContext, m.ScheduleEndContext = RequestOffloadingContext, ScheduleEndContext
    return m


def _tier_base_module(flavor, base):
    m = types.ModuleType("vllm.v1.kv_offload.tiering.base")
    def job(name, rows):  # JobMetadata (block_ids) and later main's TransferJob (chunk_ids)
        return dataclasses.make_dataclass(name, [
            ("job_id", int), ("keys", Collection), (rows, np.ndarray), ("is_promotion", bool),
            ("req_context", Any)])

    if flavor == "aug2026":
        m.JobMetadata = job("JobMetadata", "block_ids")
        JobResult = dataclasses.make_dataclass("JobResult", [("job_id", int), ("success", bool)])
    else:
        m.TransferJob = job("TransferJob", "chunk_ids")
        JobResult = dataclasses.make_dataclass("JobResult", [
            ("job_id", int), ("success", bool),
            ("successful_keys", Collection, dataclasses.field(default=None)),
            ("transfer_time", float, dataclasses.field(default=None))])

    class SecondaryTierManager(abc.ABC):
        medium = None

        def __init__(self, offloading_spec, primary_kv_view, tier_type):
            self._offloading_spec = offloading_spec
            self._primary_kv_view = primary_kv_view
            self.tier_type = tier_type

        @abc.abstractmethod
        def lookup(self, key, req_context): ...

        @abc.abstractmethod
        def submit_store(self, job_metadata): ...

        @abc.abstractmethod
        def submit_load(self, job_metadata): ...

        @abc.abstractmethod
        def get_finished_jobs(self): ...

        @abc.abstractmethod
        def on_new_request(self, req_context): ...

        @abc.abstractmethod
        def drain_jobs(self): ...

        def has_pending_work(self):
            return False

        def take_events(self):
            return ()

        def touch(self, keys, req_context):
            return

        def on_request_finished(self, req_context):
            return

        def on_schedule_end(self, context):
            return

        def shutdown(self):
            return

        def get_stats(self):
            return None

    m.JobId = int
    m.JobResult, m.SecondaryTierManager = JobResult, SecondaryTierManager
    m.LookupResult = base.LookupResult
    return m


def _factory_module(tier_base, module_paths):
    m = types.ModuleType("vllm.v1.kv_offload.tiering.factory")
    STM = tier_base.SecondaryTierManager

    class SecondaryTierFactory:
        _registry = {}

        @classmethod
        def register_tier(cls, tier_type, module_path, class_name):
            if tier_type in cls._registry:
                raise ValueError(f"Tier '{tier_type}' is already registered.")

            def loader():
                return getattr(importlib.import_module(module_path), class_name)

            cls._registry[tier_type] = loader

        @classmethod
        def get_tier_class(cls, tier_config):
            tier_type = tier_config.get("type")
            if not tier_type:
                raise ValueError("Secondary tier configuration must include 'type'")
            if tier_type in cls._registry:
                return cls._registry[tier_type]()
            module_path = tier_config.get("module_path") if module_paths else None
            if module_path is None:
                raise ValueError(f"Unknown secondary tier type: {tier_type!r}. "
                                 f"Supported types: {list(cls._registry)}.")
            tier_cls = getattr(importlib.import_module(module_path), tier_type)
            assert issubclass(tier_cls, STM)
            return tier_cls

        @classmethod
        def create_secondary_tier(cls, tier_config, primary_kv_view, offloading_spec):
            tier_cls = cls.get_tier_class(tier_config)
            config = dict(tier_config)
            tier_type = config.pop("type")
            if module_paths:
                config.pop("module_path", None)
            return tier_cls(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                            tier_type=tier_type, **config)

    m.SecondaryTierFactory = SecondaryTierFactory
    return m


def spec(model="Qwen/Qwen3-8B", dtype="bfloat16", events=True):
    """An offloading spec with what a tier reads of it."""
    return types.SimpleNamespace(
        config=types.SimpleNamespace(model=types.SimpleNamespace(name=model, dtype=dtype)),
        kv_events_config=types.SimpleNamespace(enable_kv_cache_events=events))


def install(monkeypatch, flavor="aug2026", module_paths=True):
    """Puts the stand-in vllm package into sys.modules (undone by monkeypatch)
    and imports kvpage.vllm and kvpage.vllm_tier afresh over it. Returns a
    namespace: base, tier_base, factory (the modules), vllm (kvpage.vllm),
    tier (kvpage.vllm_tier)."""
    base = _base_module()
    tier_base = _tier_base_module(flavor, base)
    factory = _factory_module(tier_base, module_paths)
    for name in ("vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.tiering"):
        pkg = types.ModuleType(name)
        pkg.__path__ = []
        monkeypatch.setitem(sys.modules, name, pkg)
    monkeypatch.setitem(sys.modules, base.__name__, base)
    monkeypatch.setitem(sys.modules, tier_base.__name__, tier_base)
    monkeypatch.setitem(sys.modules, factory.__name__, factory)
    import kvpage
    for mod in ("kvpage.vllm", "kvpage.vllm_tier"):  # imported afresh, undone after
        monkeypatch.setitem(sys.modules, mod, sys.modules.get(mod))
        del sys.modules[mod]
        monkeypatch.setattr(kvpage, mod.split(".")[1], None, raising=False)
    vllm_mod = importlib.import_module("kvpage.vllm")
    tier_mod = importlib.import_module("kvpage.vllm_tier")
    return types.SimpleNamespace(base=base, tier_base=tier_base, factory=factory,
                                 vllm=vllm_mod, tier=tier_mod)
