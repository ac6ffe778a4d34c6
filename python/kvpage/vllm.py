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
Everything else (geometry, keys, scheduling, staging through the GPU) is
vLLM's. The rebinding is process-wide: every HF3FS connector of the process
then uses kvpage's client (one connector per process is what vLLM builds).

Without vLLM this module still imports; constructing the class raises
ImportError saying so.
"""
import importlib
import os
import re
import sys

from kvpage.compat import Hf3fsClient

CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.hf3fs_connector"
CONNECTOR_CLASS = "HF3FSKVConnector"
DEFAULT_METADATA_URL = "http://localhost:18000"

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


def _with_url(cls, url):
    """cls, building clients without a URL at url instead of its default."""
    if getattr(cls, "_kvpage_url", None) is not None:
        cls = cls.__bases__[0]  # already wrapped (a second connector): rewrap the original

    class _Client(cls):
        _kvpage_url = url

        def __init__(self, *args, **kwargs):
            if not args and not any(k in kwargs for k in ("base_url", "url", "server_url")):
                args = (url,)
            super().__init__(*args, **kwargs)

    _Client.__name__ = _Client.__qualname__ = cls.__name__
    return _Client


_RANK_FILE = re.compile(r"hf3fs_vllm_data_file_(\d+)$")


def _rank_of(path):
    """The TP rank whose file path is (vLLM names it hf3fs_vllm_data_file_{tp_rank}),
    else vLLM's own idea of this process's rank, else None."""
    m = _RANK_FILE.search(os.path.basename(str(path)))
    if m:
        return int(m.group(1))
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
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
            super().__init__(path, *args, **kwargs)

    _Client.__name__ = _Client.__qualname__ = Hf3fsClient.__name__
    return _Client


def install(module, metadata_url=None):
    """Rebinds module.Hf3fsClient to kvpage's client (claiming each rank's file
    for the metadata at metadata_url, or vLLM's default localhost:18000) and,
    when metadata_url is given, module.Hf3fsMetadataClient to one that uses
    it. Returns module."""
    module.Hf3fsClient = _owned_client(metadata_url or DEFAULT_METADATA_URL)
    if metadata_url and hasattr(module, "Hf3fsMetadataClient"):
        module.Hf3fsMetadataClient = _with_url(module.Hf3fsMetadataClient, metadata_url)
    return module


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


__all__ = ["KvpageHF3FSConnector", "install", "Hf3fsClient"]
from kvpage.vllm_tier import KvpageTier, register  # noqa: E402  (vLLM's secondary tier)
__all__ += ["KvpageTier", "register"]
