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
import types

import torch


def _flag_json(cmd, flag):
    """The JSON argument of FLAG in a shell command line."""
    words = shlex.split(cmd.replace("\\\n", " "))
    assert flag in words, f"{flag} not in the block"
    return json.loads(words[words.index(flag) + 1])


def sglang(world, text):
    import test_sglang_backend as sg
    text = world.sub(text)
    extra = _flag_json(text, "--hicache-storage-backend-extra-config")
    words = shlex.split(text.replace("\\\n", " "))
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


def _install_fake_vllm():
    import test_vllm_module as vm
    parts = vm.CONNECTOR.split(".")
    mods = {}
    saved = {}
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        m = types.ModuleType(name)
        m.__path__ = []
        mods[name] = m
        saved[name] = sys.modules.get(name)
        sys.modules[name] = m
        if i > 1:
            setattr(mods[".".join(parts[:i - 1])], parts[i - 1], m)
    cm = mods[vm.CONNECTOR]
    exec(compile(vm.FAKE_CONNECTOR_SOURCE, vm.CONNECTOR.replace(".", "/") + ".py", "exec"),
         cm.__dict__)
    sys.modules.pop("kvpage.vllm", None)
    return vm, saved


def vllm(world, text):
    text = world.sub(text)
    ktc_json = _flag_json(text, "--kv-transfer-config")
    vm, saved = _install_fake_vllm()
    try:
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
    finally:
        for name, m in saved.items():
            if m is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = m
        sys.modules.pop("kvpage.vllm", None)
