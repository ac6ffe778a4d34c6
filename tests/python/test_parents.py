"""Each page's parent and tokens, from the Python side to a router: Store.put
(parents=, token_ids=) through the http:// metadata to kvpage serve, whose
KV events (--kv-events) then carry parent_block_hash and token_ids; and
kvpage.sglang, which tells each page of a batch its parent (the page before
it; the first's is SGLang's last prefix key). A subscriber as in
tests/integration/test_kv_events.py (python3-zmq, python3-msgpack)."""
import os
import types

import numpy as np
import pytest

import kvpage
from kvpage.errors import KvpageValueError

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from kvptest import sglang_hash, vllm_hash  # noqa: E402
from test_kv_events import chains, consumers, start_events, stored_events  # noqa: E402,F401

EVENTS = [
    # make python-tsan preloads ThreadSanitizer into this process, where the
    # subscriber's libzmq (Debian's, not built with it) reads as racing with
    # its own I/O thread; the server's side runs under it in
    # tests/integration/test_kv_events.py (make integration-tsan).
    pytest.mark.skipif("libtsan" in os.environ.get("LD_PRELOAD", ""),
                       reason="the subscriber's libzmq is not built with ThreadSanitizer"),
]

BPP = 4096


def hexkey(i):
    return f"{i:032x}"


def events(f):
    for m in EVENTS:
        f = m(f)
    return f


@events
def test_store_put_parents_and_tokens(tmp_path, start_server, consumers):
    srv, cons, c = start_events(start_server, consumers)
    c.close()
    s = kvpage.Store(tmp_path / "r0.pages", 32 * BPP, BPP, meta=srv.url())
    keys = [hexkey(0x500 + i) for i in range(4)]
    bufs = [np.full(BPP, i, np.uint8) for i in range(4)]
    toks = [[i, i + 1, i + 2] for i in range(0, 12, 3)]
    parents = [hexkey(0x4ff)] + keys[:-1]
    assert s.put(keys, bufs, parents=parents, token_ids=toks) == [kvpage.STORED] * 4
    hashes = [vllm_hash(k) for k in keys]
    cons.wait_for({0: set(hashes)})
    assert chains(stored_events(cons)) == {
        h: (vllm_hash(p), t) for h, p, t in zip(hashes, parents, toks)}
    # A key already there is not confirmed again: its parent is not told.
    cons.events.clear()
    more = [hexkey(0x600), hexkey(0x601)]
    res = s.put([keys[3]] + more, [bufs[0]] * 3, parents=[None, keys[3], more[0]],
                token_ids=[None, None, [7]])
    assert res == [kvpage.ALREADY, kvpage.STORED, kvpage.STORED]
    cons.wait_for({0: set(hashes + [vllm_hash(k) for k in more])})
    ev = stored_events(cons)
    # more[0] (no tokens) and more[1] (tokens) are not one event: a run's
    # pages have as many tokens each.
    assert [(e["block_hashes"], e["parent_block_hash"], e["token_ids"]) for e in ev] == [
        ([vllm_hash(more[0])], vllm_hash(keys[3]), []),
        ([vllm_hash(more[1])], vllm_hash(more[0]), [7])]
    # Neither: as before, no parent and no tokens.
    bad = [hexkey(0x700), hexkey(0x701)]
    cons.events.clear()
    assert s.put(bad, bufs[:2]) == [kvpage.STORED] * 2
    cons.wait_for({0: set(hashes + [vllm_hash(k) for k in more + bad])})
    assert [(e["parent_block_hash"], e["token_ids"]) for e in stored_events(cons)] == [
        (None, [])]
    # Parents that are no chain (sent as parent_keys, not prefix_key): an
    # event each.
    cons.events.clear()
    last = [hexkey(0x800), hexkey(0x801)]
    assert s.put(last, bufs[:2], parents=[keys[0], keys[1]]) == [kvpage.STORED] * 2
    cons.wait_for({0: set(hashes + [vllm_hash(k) for k in more + bad + last])})
    assert [(e["block_hashes"], e["parent_block_hash"]) for e in stored_events(cons)] == [
        ([vllm_hash(last[0])], vllm_hash(keys[0])), ([vllm_hash(last[1])], vllm_hash(keys[1]))]
    s.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@events
def test_sglang_sends_parents(tmp_path, start_server, consumers, layout):
    from test_sglang_backend import (MHALayerFirstPool, MHAPageFirstPool, backend, fill, indices,
                                     keys)
    srv, cons, c = start_events(start_server, consumers, "format=array")
    c.close()
    pool = MHALayerFirstPool() if layout == "layer_first" else MHAPageFirstPool()
    b = backend(tmp_path, pool, metadata_url=srv.url())
    ks = keys(5)
    fill(pool, 5)
    prefix = keys(3, salt="p")
    passed = list(prefix)
    info = types.SimpleNamespace(prefix_keys=passed, extra_info=None)
    assert b.batch_set_v1(ks[:3], indices(3), info) == [True] * 3
    passed.extend(ks[:3])  # as SGLang's controller does after the call
    assert b.batch_set_v1(ks[3:], indices(2, first=3), info) == [True] * 2
    h = [sglang_hash(k) for k in ks]
    cons.wait_for({0: set(h)})
    got = chains(stored_events(cons))
    want = {x: (p, []) for x, p in zip(h, [sglang_hash(prefix[-1])] + h[:-1])}
    assert {x: (p, t or []) for x, (p, t) in got.items()} == want
    if layout == "layer_first":  # one key per page: each batch one chained event (or
        # both one, when the publisher took them together: the second goes on the first)
        assert [len(e["block_hashes"]) for e in stored_events(cons)] in ([3, 2], [5])
    b.close()
    # "parents": false sends none.
    cons.events.clear()
    pool2 = MHALayerFirstPool()
    b2 = backend(tmp_path, pool2, name="np", metadata_url=srv.url() + "/ns/np", parents=False)
    more = keys(2, salt="q")
    fill(pool2, 2)
    assert b2.batch_set_v1(more, indices(2), info) == [True] * 2
    cons.wait_for({0: set(h + [sglang_hash(k) for k in more])})
    assert [e["parent_block_hash"] for e in stored_events(cons)] == [None]
    b2.close()


@events
def test_vllm_connector_confirms_chains(tmp_path, start_server, consumers, monkeypatch):
    """kvpage.vllm's metadata client: a save task's blocks are a chain
    (prefix_key null: the first's parent is not known)."""
    import sys

    import vllm_hf3fs_standin as standin
    from test_vllm_load_errors import Worker, _fresh_kvpage_vllm, config, keys_of
    cm, ps, base = standin.install(monkeypatch)
    kv = _fresh_kvpage_vllm()
    try:
        srv, cons, c = start_events(start_server, consumers)
        c.close()
        w = Worker(kv, base, config(tmp_path / "kv", srv.url("/ns/v")))
        keys = keys_of("c", 6)
        w.save("w", keys, range(6))
        h = [vllm_hash(k) for k in keys]
        cons.wait_for({0: set(h)})
        assert chains(stored_events(cons)) == {
            x: (p, None) for x, p in zip(h, [None] + h[:-1])}
        w.close()
    finally:
        sys.modules.pop("kvpage.vllm", None)


@pytest.mark.parametrize("where", ["embedded", "remote"])
def test_store_put_checks_parents(tmp_path, start_server, where):
    """Bad parents or tokens change nothing; good ones store as put does
    (every backend: one without them passes them over)."""
    meta = start_server().url() if where == "remote" else None
    s = kvpage.Store(tmp_path / "r0.pages", 32 * BPP, BPP, meta=meta)
    bufs = [np.full(BPP, 1, np.uint8)] * 2
    bad = [hexkey(0x700), hexkey(0x701)]
    with pytest.raises(KvpageValueError, match="2 keys but 1 parents"):
        s.put(bad, bufs, parents=[None])
    with pytest.raises(KvpageValueError, match="token id"):
        s.put(bad, bufs, token_ids=[[1], [-1]])
    with pytest.raises(KvpageValueError, match="parent 1 contains a NUL byte"):
        s.put(bad, bufs, parents=[None, "a\0b"])
    assert s.exists(bad)[1] == [False, False]
    assert s.put(bad, [[b] for b in bufs], parents=[hexkey(0x6ff), None],
                 token_ids=[[1, 2], None]) == [kvpage.STORED] * 2
    assert s.put([], [], parents=[], token_ids=[]) == []
    out = [np.zeros(BPP, np.uint8) for _ in bad]
    assert s.get(bad, out)[0] == 2 and all((o == 1).all() for o in out)
    s.close()
