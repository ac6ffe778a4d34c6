"""kvpage.vllm against a stand-in of vLLM's HF3FS connector module, written
from its published interface (vLLM is not installed here): a fake `vllm`
package tree in sys.modules whose connector module binds module globals
Hf3fsClient and Hf3fsMetadataClient, builds its metadata client without a
URL (as vLLM does) and its page clients in register_kv_caches."""
import importlib
import os
import sys
import types

import numpy as np
import pytest
import torch

import kvpage.compat

CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.hf3fs_connector"

# The stand-in connector module. Its metadata client speaks the vLLM dialect
# of the metadata protocol (which kvpage serve answers).
FAKE_CONNECTOR_SOURCE = '''
import os
import requests


class Hf3fsMockClient:
    """The engine's own client: must not be used once kvpage is installed."""
    def __init__(self, *a, **kw):
        raise AssertionError("the engine's own Hf3fsClient was used")


Hf3fsClient = Hf3fsMockClient


class Hf3fsMetadataClient:
    def __init__(self, base_url="http://localhost:18000", max_retries=3):
        self.base_url = base_url.rstrip("/")
        self.s = requests.Session()

    def _post(self, path, body):
        r = self.s.post(self.base_url + path, json=body, timeout=10)
        r.raise_for_status()
        return r.json() if r.status_code != 204 and r.content else None

    def initialize(self, rank, num_pages=0, role="worker"):
        self._post(f"/rank/{rank}/initialize", {"num_pages": num_pages, "role": role})

    def allocate_pages_for_keys(self, rank, keys):
        return self._post("/keys/batch_allocate", {"rank": rank, "keys": keys})["results"]

    def confirm_write_for_keys(self, rank, written, release):
        self._post("/keys/confirm_write", {"rank": rank, "confirmations": written,
                                           "pages_to_release": release})

    def get_key_locations(self, rank, keys):
        return self._post("/keys/get_locations", {"rank": rank, "keys": keys})["locations"]

    def check_keys_exist(self, keys):
        return self._post("/keys/batch_exists", {"keys": keys})["exists"]


class HF3FSKVConnector:
    def __init__(self, vllm_config, role, kv_cache_config=None):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self._storage_path = extra.get("hf3fs_storage_path", "/vllm-workspace/mnt/hf3fs")
        self._file_size = int(extra.get("hf3fs_file_size", 1 << 30))
        self._numjobs = int(extra.get("hf3fs_client_numjobs", 2))
        # read, then not passed on: the client below uses its default URL
        self._metadata_server_url = extra.get("hf3fs_metadata_server_url", "http://localhost:18000")
        self._role = role
        self._clients = []
        if role == "scheduler":
            self._metadata_client = Hf3fsMetadataClient()

    def register_kv_caches(self, bytes_per_page, rank=0):
        os.makedirs(self._storage_path, exist_ok=True)
        path = os.path.join(self._storage_path, f"hf3fs_vllm_data_file_{rank}")
        self._rank, self._bytes_per_page = rank, bytes_per_page
        self._clients = [Hf3fsClient(path, self._file_size, bytes_per_page, 8)
                         for _ in range(self._numjobs)]
        self._metadata_client = Hf3fsMetadataClient()
        self._metadata_client.initialize(rank, self._file_size // bytes_per_page, "worker")

    def save(self, keys, pages):
        res = self._metadata_client.allocate_pages_for_keys(self._rank, [[k, ""] for k in keys])
        idx = [p for _, p in res]
        out = self._clients[0].batch_write([i * self._bytes_per_page for i in idx], pages, None)
        assert all(r == self._bytes_per_page for r in out), out
        self._metadata_client.confirm_write_for_keys(self._rank, [[k, i] for k, i in zip(keys, idx)], [])

    def load(self, keys, pages):
        idx = self._metadata_client.get_key_locations(self._rank, keys)
        out = self._clients[-1].batch_read([i * self._bytes_per_page for i in idx], pages)
        return all(r == self._bytes_per_page for r in out)
'''


def _fresh_kvpage_vllm():
    sys.modules.pop("kvpage.vllm", None)
    return importlib.import_module("kvpage.vllm")


def install_fake_vllm(monkeypatch):
    """The stand-in vllm package tree in sys.modules (undone with
    monkeypatch); returns the connector module."""
    parts = CONNECTOR.split(".")
    mods = {}
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        m = types.ModuleType(name)
        m.__path__ = []
        mods[name] = m
        monkeypatch.setitem(sys.modules, name, m)
        if i > 1:
            setattr(mods[".".join(parts[:i - 1])], parts[i - 1], m)
    cm = mods[CONNECTOR]
    exec(compile(FAKE_CONNECTOR_SOURCE, CONNECTOR.replace(".", "/") + ".py", "exec"), cm.__dict__)
    return cm


@pytest.fixture
def fake_vllm(monkeypatch):
    yield install_fake_vllm(monkeypatch)
    sys.modules.pop("kvpage.vllm", None)


def vllm_config(**extra):
    ktc = types.SimpleNamespace(kv_connector="KvpageHF3FSConnector",
                                kv_connector_module_path="kvpage.vllm", kv_role="kv_both",
                                kv_connector_extra_config=extra)
    return types.SimpleNamespace(kv_transfer_config=ktc)


def test_imports_without_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    try:
        kv = _fresh_kvpage_vllm()
        assert kv._Base is object
        with pytest.raises(ImportError, match="needs vLLM's HF3FS connector"):
            kv.KvpageHF3FSConnector(vllm_config(), "worker")
    finally:
        sys.modules.pop("kvpage.vllm", None)


def test_subclass_rebinds_client_and_url(fake_vllm, tmp_path):
    kv = _fresh_kvpage_vllm()
    assert issubclass(kv.KvpageHF3FSConnector, fake_vllm.HF3FSKVConnector)
    original_meta = fake_vllm.Hf3fsMetadataClient
    url = "http://127.0.0.1:1/ns/x"
    c = kv.KvpageHF3FSConnector(vllm_config(hf3fs_metadata_server_url=url,
                                            hf3fs_storage_path=str(tmp_path)), "scheduler")
    assert issubclass(fake_vllm.Hf3fsClient, kvpage.compat.Hf3fsClient)
    assert c._metadata_client.base_url == url
    assert isinstance(c._metadata_client, original_meta)
    # a second connector rewraps the original class, not the wrapper
    url2 = "http://127.0.0.1:2"
    c2 = kv.KvpageHF3FSConnector(vllm_config(hf3fs_metadata_server_url=url2), "scheduler")
    assert c2._metadata_client.base_url == url2
    assert fake_vllm.Hf3fsMetadataClient.__bases__ == (original_meta,)
    # a URL passed explicitly still wins
    assert fake_vllm.Hf3fsMetadataClient("http://h:3").base_url == "http://h:3"


def test_without_url_the_default_stays(fake_vllm):
    kv = _fresh_kvpage_vllm()
    c = kv.KvpageHF3FSConnector(vllm_config(), "scheduler")
    assert c._metadata_client.base_url == "http://localhost:18000"
    assert issubclass(fake_vllm.Hf3fsClient, kvpage.compat.Hf3fsClient)


def test_factory_path_round_trip_on_kvpage_serve(fake_vllm, tmp_path, server):
    """What vLLM's factory does with an unregistered name: import
    kv_connector_module_path, take kv_connector; then the worker saves and
    loads pages through kvpage's client and a real kvpage serve."""
    url = server.url("/ns/vllm")
    cfg = vllm_config(hf3fs_metadata_server_url=url, hf3fs_storage_path=str(tmp_path / "kv"),
                      hf3fs_file_size=1 << 20, hf3fs_client_numjobs=2)
    ktc = cfg.kv_transfer_config
    cls = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    worker = cls(cfg, "worker")
    bpp = 4096
    worker.register_kv_caches(bpp, rank=0)
    assert all(isinstance(cl, kvpage.compat.Hf3fsClient) for cl in worker._clients)
    assert worker._metadata_client.base_url == url
    keys = [f"{i:032x}" for i in range(5)]
    g = torch.Generator().manual_seed(3)
    pages = [torch.randint(0, 256, (bpp,), dtype=torch.uint8, generator=g) for _ in keys]
    worker.save(keys, pages)
    sched = cls(cfg, "scheduler")
    assert sched._metadata_client.check_keys_exist(keys + ["f" * 32]) == [True] * 5 + [False]
    back = [torch.zeros(bpp, dtype=torch.uint8) for _ in keys]
    assert worker.load(keys, back)
    for a, b in zip(pages, back):
        assert np.array_equal(a.numpy(), b.numpy())
    assert os.path.getsize(tmp_path / "kv" / "hf3fs_vllm_data_file_0") == 1 << 20
    # the rank's file is claimed for the connector's metadata: another is refused
    owner = (tmp_path / "kv" / "hf3fs_vllm_data_file_0.owner").read_text()
    assert f"location {url}\ndeployment vllm\npool kv\nrank 0\n" in owner
    with pytest.raises(kvpage.KvpageError) as e:
        kvpage.Store(str(tmp_path / "kv" / "hf3fs_vllm_data_file_0"), 0, bpp)
    assert e.value.rule == "owner"
    for cl in worker._clients:
        cl.close()
