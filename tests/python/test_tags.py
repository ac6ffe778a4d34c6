"""Integrity tags through every Python entry point (README, "Every page
verified"): another writer changes a page's bytes on disk after it was
written, and each entry point reports that page missing or failed, never
its bytes, while the other pages of the same batch come back intact:
PageFile (-EBADMSG, keys bound, info counters, tags=False), Store (a miss,
stats, the key dropped; over http:// the server counts it in /metrics),
compat.Hf3fsClient (-EBADMSG in batch_read's result), kvpage.sglang (False
for that page), kvpage.vllm (a failed load of that block) and
kvpage.vllm_tier (tags in place of the second checksum store)."""
import errno
import os

import numpy as np
import pytest

import kvpage
from kvpage import PageFile, Store
from kvpage.errors import RULES

BPP = 4096


def pages(n, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, BPP, dtype=np.uint8) for _ in range(n)]


def scribble(path, offset, data=b"\x5c" * 16):
    """Another writer: changes bytes of the page file behind kvpage's back."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def offset_of(path, page_bytes):
    """Where in the file the page holding these bytes starts."""
    blob = open(path, "rb").read()
    at = blob.find(bytes(page_bytes))
    assert at >= 0
    return at


def test_rule_names_mirror_c():
    assert RULES[-1] == "integrity"


def test_pagefile_rejects_a_changed_page_alone(tmp_path):
    path = str(tmp_path / "p.pages")
    pf = PageFile(path, 8 * BPP, BPP)
    src = pages(3)
    assert pf.write([0, BPP, 2 * BPP], src) == [BPP] * 3
    info = pf.info()
    assert info["tags"] == "on" and info["tags_path"] == path + ".tags"
    assert info["tags_slot_size"] == BPP
    scribble(path, BPP + 100)
    dst = [np.full(BPP, 0xA5, np.uint8) for _ in range(3)]
    assert pf.read([0, BPP, 2 * BPP], dst) == [BPP, -errno.EBADMSG, BPP]
    assert np.array_equal(dst[0], src[0]) and np.array_equal(dst[2], src[2])
    assert not dst[1].any()  # zeroed: never the bytes
    info = pf.info()
    assert (info["tags_rejected"], info["tags_verified"]) == (1, 2)
    assert "1" in info["tags_note"]  # the slot of the first rejection
    pf.close()


def test_pagefile_keys_bind_pages(tmp_path):
    pf = PageFile(str(tmp_path / "k.pages"), 8 * BPP, BPP)
    src = pages(2)
    assert pf.write([0, BPP], src, keys=["a", b"b"]) == [BPP, BPP]
    dst = [np.zeros(BPP, np.uint8) for _ in range(3)]
    assert pf.read([0, BPP, 0], dst, keys=["a", "a", None]) == [BPP, -errno.EBADMSG, BPP]
    assert np.array_equal(dst[0], src[0]) and np.array_equal(dst[2], src[0])
    assert not dst[1].any()
    with pytest.raises(kvpage.KvpageValueError):
        pf.read([0], dst[:1], keys=["a", "b"])  # one key per operation
    pf.close()


def test_pagefile_tags_off_serves_the_bytes(tmp_path):
    path = str(tmp_path / "off.pages")
    pf = PageFile(path, 8 * BPP, BPP, tags=False)
    assert pf.write([0], pages(1)) == [BPP]
    scribble(path, 0)
    dst = [np.zeros(BPP, np.uint8)]
    assert pf.read([0], dst) == [BPP]
    assert bytes(dst[0][:16]) == b"\x5c" * 16
    assert pf.info()["tags"] == "off" and not os.path.exists(path + ".tags")
    pf.close()


def _store_round(st, path, keys, src):
    assert st.put(keys, src) == [kvpage.STORED] * len(keys)
    scribble(path, offset_of(path, src[1]) + 10)
    dst = [np.full(BPP, 0xA5, np.uint8) for _ in keys]
    lead, res = st.get(keys, dst)
    return lead, res, dst


def test_store_miss_on_rejection(tmp_path):
    path = str(tmp_path / "s.pages")
    st = Store(path, 16 * BPP, BPP)
    keys, src = ["k0", "k1", "k2"], pages(3, seed=1)
    lead, res, dst = _store_round(st, path, keys, src)
    assert lead == 1 and res == [BPP, -errno.ENOENT, BPP]
    assert np.array_equal(dst[0], src[0]) and np.array_equal(dst[2], src[2])
    assert not dst[1].any()
    stats = st.stats()
    assert stats["rejected"] == 1 and stats["missing"] == 1
    assert st.exists(keys)[1] == [True, False, True]  # dropped: an honest miss next
    assert st.info()["tags_rejected"] == 1
    st.close()


def test_store_tags_off(tmp_path):
    path = str(tmp_path / "so.pages")
    st = Store(path, 16 * BPP, BPP, tags=False)
    keys, src = ["k0", "k1", "k2"], pages(3, seed=2)
    lead, res, dst = _store_round(st, path, keys, src)
    assert lead == 3 and st.stats()["rejected"] == 0
    assert not np.array_equal(dst[1], src[1])  # what tags=False gives up
    st.close()


def test_store_over_http_is_counted_by_the_server(tmp_path, server):
    path = str(tmp_path / "h.pages")
    st = Store(path, 16 * BPP, BPP, meta=server.url("/ns/tg"))
    keys, src = ["h0", "h1", "h2"], pages(3, seed=3)
    lead, res, dst = _store_round(st, path, keys, src)
    assert res == [BPP, -errno.ENOENT, BPP]
    assert np.array_equal(dst[2], src[2])
    assert st.exists(keys)[1] == [True, False, True]
    st.close()
    text = server.client().get("/metrics").text
    assert 'kvpage_pages_rejected_total{deployment="tg",pool="kv"} 1\n' in text
    # vLLM's namespace-wide delete says so the same way; a plain delete is not counted
    c = server.client("/ns/tg")
    assert c.post("/keys/delete", {"keys": ["h0", "h2"], "reason": "integrity"}).status_code == 204
    assert c.post("/keys/delete", {"keys": ["x"]}).status_code == 204
    assert c.post("/0/delete_keys", {"keys": ["y"], "reason": "tired"}).status_code == 400
    text = server.client().get("/metrics").text
    assert 'kvpage_pages_rejected_total{deployment="tg",pool="kv"} 3\n' in text


def test_hf3fs_client_fails_the_page_alone(tmp_path):
    torch = pytest.importorskip("torch")
    from kvpage.compat import Hf3fsClient
    path = str(tmp_path / "hicache.0.bin")
    c = Hf3fsClient(path, 16 * BPP, BPP, 8)
    src = [torch.from_numpy(p) for p in pages(3, seed=4)]
    offs = [0, BPP, 2 * BPP]
    assert c.batch_write(offs, src) == [BPP] * 3
    scribble(path, 2 * BPP + 4000, b"\x01")
    dst = [torch.full((BPP,), 7, dtype=torch.uint8) for _ in range(3)]
    c.check(offs, dst)  # the batch is as valid as before
    assert c.batch_read(offs, dst) == [BPP, BPP, -errno.EBADMSG]
    assert torch.equal(dst[0], src[0]) and torch.equal(dst[1], src[1])
    assert int(dst[2].count_nonzero()) == 0
    c.close()


def test_sglang_page_is_a_miss(tmp_path):
    pytest.importorskip("torch")
    import test_sglang_backend as sg
    pool = sg.MHAPageFirstPool()
    b, ks, want = sg.written(tmp_path, pool, 3)
    assert b.batch_set_v1(ks, sg.indices(3)) == [True] * 3
    k_bytes = sg.raw(pool.page(1 * sg.PS)[0])  # page 1's K, stored as "{key}-k"
    scribble(b.path, offset_of(b.path, k_bytes) + 3)
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(ks, sg.indices(3, first=5)) == [True, False, True]
    for p in (0, 2):
        assert np.array_equal(sg.raw(pool.page((5 + p) * sg.PS)), want[p])
    assert b.store.stats()["rejected"] == 1
    assert b.batch_exists(ks) == 1  # the leading run: page 1 is gone
    b.close()


def test_sglang_tags_config(tmp_path):
    pytest.importorskip("torch")
    import test_sglang_backend as sg
    b = sg.backend(tmp_path, sg.MHAPageFirstPool(), tags=False)
    assert b.store.info()["tags"] == "off"
    b.close()


def vllm_worker(tmp_path, server, monkeypatch, ns):
    """(the vLLM test module, a worker connector over the stand-ins)."""
    pytest.importorskip("torch")
    import test_vllm_load_errors as vl
    import vllm_hf3fs_standin as standin
    cm, ps, base = standin.install(monkeypatch)
    kv = vl._fresh_kvpage_vllm()
    return vl, vl.Worker(kv, base, vl.config(tmp_path / "kv", server.url(f"/ns/{ns}")))


def test_vllm_block_is_a_failed_load(tmp_path, server, monkeypatch):
    vl, w = vllm_worker(tmp_path, server, monkeypatch, "vtag")
    try:
        keys = vl.keys_of("t", 6)
        w.save("w", keys, range(6))  # pages 0..5, the lowest never used first
        want = w.cache[:6].clone()
        path = w.conn._clients[0].path
        scribble(path, 3 * vl.BPP + 17)
        loaded, invalid = w.load("r", keys, range(10, 16))
        assert loaded == {"r"} and invalid == {13}
        for i in (0, 1, 2, 4, 5):
            assert bool((w.cache[10 + i] == want[i]).all()), i
        assert int(w.cache[13].count_nonzero()) == 0  # never scattered
    finally:
        w.close()


def test_vllm_pages_are_bound_to_their_keys(tmp_path, server, monkeypatch):
    """kvpage.vllm writes each page with its key and loads it with it: a
    page that holds another key's intact page (written there, tag and all,
    by another kvpage writer) is a failed load of that block alone."""
    vl, w = vllm_worker(tmp_path, server, monkeypatch, "vkey")
    try:
        keys = vl.keys_of("u", 4)
        w.save("w", keys, range(4))  # pages 0..3
        want = w.cache[:4].clone()
        path = w.conn._clients[0].path
        pf = PageFile(path, 0, vl.BPP, create=False)
        page = [np.zeros(vl.BPP, np.uint8)]
        assert pf.read([vl.BPP], page, keys=[keys[1]]) == [vl.BPP]  # written with its key
        assert pf.read([vl.BPP], page, keys=[keys[0]]) == [-errno.EBADMSG]
        # key 2's page rewritten as key 0's (its bytes, its key): intact, not key 2's
        assert pf.write([2 * vl.BPP], [want[0].numpy()], keys=[keys[0]]) == [vl.BPP]
        pf.close()
        loaded, invalid = w.load("r", keys, range(10, 14))
        assert loaded == {"r"} and invalid == {12}
        for i in (0, 1, 3):
            assert bool((w.cache[10 + i] == want[i]).all()), i
        assert int(w.cache[12].count_nonzero()) == 0
    finally:
        w.close()
