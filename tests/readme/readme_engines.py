"""The README's engine commands, checked through the stand-ins of the
engines' classes in tests/python (SGLang and vLLM cannot be installed here):
the JSON a block passes is parsed as the engine would, handed to kvpage's
module exactly as the engine's loader does, and pages make a round trip
through it against the kvpage serve that the block names.

Only the sizes are made small (a stand-in page is a few hundred bytes, and
a 1 TiB file of them would be more pages than a rank holds); every other key
of the README's JSON is passed as written."""
import importlib
import json
import os
import re
import shlex
import sys

import torch


def _flag_json(cmd, flag):
    """The JSON argument of FLAG in a shell command line."""
    words = shlex.split(cmd.replace("\\\n", " "), comments=True)
    assert flag in words, f"{flag} not in the block"
    return json.loads(words[words.index(flag) + 1])


def sglang(world, text):
    import test_sglang_backend as sg
    text = world.sub(text)
    extra = _flag_json(text, "--hicache-storage-backend-extra-config")
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    assert words[words.index("--hicache-storage-backend") + 1] == "dynamic"
    assert "--enable-hierarchical-cache" in words
    layout = words[words.index("--hicache-mem-layout") + 1]
    # SGLang's dynamic backend factory: import module_path, take class_name,
    # construct it with (storage_config, kwargs).
    for k in ("backend_name", "module_path", "class_name"):
        assert k in extra, k
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    extra = dict(extra, file_size=1 << 20)
    cfg = sg.storage_config(**extra)
    b = cls(cfg, {})
    pool = sg.MHAPageFirstPool()
    assert pool.layout == layout
    b.register_mem_pool_host(pool)
    try:
        sg.fill(pool, 4)
        keys = sg.keys(4, "readme")
        assert all(b.batch_set_v1(keys, sg.indices(4)))
        want = pool.kv_buffer.clone()
        pool.kv_buffer.zero_()
        assert all(b.batch_get_v1(keys, sg.indices(4)))
        assert torch.equal(pool.kv_buffer, want)
    finally:
        b.close()


def vllm(world, text):
    text = world.sub(text)
    ktc_json = _flag_json(text, "--kv-transfer-config")
    import pytest
    import test_vllm_module as vm
    with pytest.MonkeyPatch.context() as mp:
        vm.install_fake_vllm(mp)
        mp.delitem(sys.modules, "kvpage.vllm", raising=False)
        extra = dict(ktc_json.get("kv_connector_extra_config", {}))
        os.makedirs(os.path.dirname(extra["hf3fs_storage_path"]), exist_ok=True)
        extra["hf3fs_file_size"] = 1 << 20
        cfg = vm.vllm_config(**extra)
        # vLLM's factory: an unregistered name is looked up in
        # kv_connector_module_path.
        cls = getattr(importlib.import_module(ktc_json["kv_connector_module_path"]),
                      ktc_json["kv_connector"])
        worker = cls(cfg, "worker")
        bpp = 4096
        worker.register_kv_caches(bpp, rank=0)
        keys = [f"{i:032x}" for i in range(3)]
        pages = [torch.full((bpp,), i + 1, dtype=torch.uint8) for i in range(3)]
        worker.save(keys, pages)
        back = [torch.zeros(bpp, dtype=torch.uint8) for _ in keys]
        assert worker.load(keys, back)
        assert all(torch.equal(a, b) for a, b in zip(pages, back))
        for cl in worker._clients:
            cl.close()
    sys.modules.pop("kvpage.vllm", None)  # it was bound to the stand-in


def vllm_stock(world, text):
    """Stock vLLM: its metadata client always uses http://localhost:18000,
    so the block must run `kvpage serve` there (its default address) and
    name that URL; the server, started with the block's flags on a free
    port, answers a save and a lookup as vLLM's client makes them."""
    from kvptest import Client
    import kvpserver
    serve = re.search(r"^kvpage serve(.*?)(?:&|$)", text, re.M)
    assert serve, "the block starts no kvpage serve"
    flags = shlex.split(serve.group(1).split("#")[0])
    assert "--listen" not in flags, "stock vLLM needs the default address 127.0.0.1:18000"
    ktc = _flag_json(text, "--kv-transfer-config")
    assert ktc["kv_connector"] == "HF3FSKVConnector"
    extra = ktc["kv_connector_extra_config"]
    assert extra["hf3fs_metadata_server_url"] == "http://localhost:18000"
    for k in ("hf3fs_storage_path", "hf3fs_file_size"):
        assert k in extra, k
    srv = kvpserver.launch(world.tmp, [world.sub(f) for f in flags], None)
    world.servers.append(srv)
    c = Client(srv.base)
    num_pages = int(extra["hf3fs_file_size"]) // (2 << 20)
    c.v_init(0, num_pages, role="worker")
    keys = [f"{i:032x}" for i in range(4)]
    pages = c.v_write(0, keys)
    assert c.v_exists(keys + ["f" * 32]) == [True] * 4 + [False]
    assert c.v_loc(0, keys) == pages
    c.close()


def sglang_stock(world, text):
    """Stock SGLang: the JSON file has the keys SGLang requires, and the
    server at its metadata_server_url answers SGLang's dialect for a rank."""
    from kvptest import Client
    m = re.search(r"<<'JSON'\n(.*?)\nJSON\n", text, re.S)
    assert m, "no JSON file in the block"
    cfg = json.loads(world.sub(m.group(1)))
    for k in ("file_path_prefix", "file_size", "numjobs", "entries"):
        assert k in cfg, k
    name = re.search(r"^cat > (\S+) <<", text, re.M).group(1)
    assert f"SGLANG_HICACHE_HF3FS_CONFIG_PATH={name}" in text
    assert "--hicache-storage-backend hf3fs" in text
    c = Client(cfg["metadata_server_url"])
    num_pages = int(cfg["file_size"]) // (16 << 20)
    for rank in (0, 1):
        c.s_init(rank, num_pages)
        c.s_write(rank, ["k1", "k2"])
        assert c.s_exists(rank, ["k1", "k2", "k3"]) == [True, True, False]
    c.close()
