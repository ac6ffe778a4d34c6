"""SGLang dialect (protocol.md §3): every route, pool namespaces, ranks shared
with the vLLM dialect, and eviction order (§1 Recency)."""
from kvptest import counts, expect, has_rank, invariants, rank_stats


def test_initialize_204(server, client):
    r = client.post("/0/initialize", {"num_pages": 8})
    expect(r, 204)
    assert r.content == b""
    st = invariants(server.stats())
    assert counts(st, 0) == (8, 8, 0, 0)
    # Same size again: 204, nothing changes.
    client.s_write(0, ["a"])
    client.s_init(0, 8)
    assert counts(server.stats(), 0) == (8, 7, 0, 1)
    assert client.s_get(0, ["a"]) == [7]


def test_initialize_explicit_kv_pool_is_default(server, client):
    client.s_init(0, 4, ns="kv")
    assert counts(server.stats(), 0, pool="kv") == (4, 4, 0, 0)
    client.s_write(0, ["a"])
    assert client.s_exists(0, ["a"], ns="kv") == [True]


def test_resize_rule_and_409(server, client):
    client.s_init(0, 8)
    client.s_init(0, 4)  # nothing reserved or held: resized
    assert counts(server.stats(), 0) == (4, 4, 0, 0)
    assert client.s_reserve(0, ["a"]) == [(False, 3)]
    r = client.post("/0/initialize", {"num_pages": 6})
    expect(r, 409, "Rank 0 already initialized with 4 pages; refusing to change to 6 pages while it holds data")
    assert counts(server.stats(), 0) == (4, 3, 1, 0)
    client.s_confirm(0, [["a", 3]])
    r = client.post("/0/initialize", {"num_pages": 2})
    expect(r, 409, "Rank 0 already initialized with 4 pages; refusing to change to 2 pages while it holds data")
    client.s_delete(0, ["a"])
    client.s_init(0, 2)
    assert counts(server.stats(), 0) == (2, 2, 0, 0)


def test_reserve_returns_existed_and_page(server, client):
    client.s_init(0, 8)
    r = client.post("/0/reserve_and_allocate_page_indices", {"keys": [["a", ""], ["b", ""]]})
    expect(r, 200)
    assert r.json() == {"indices": [[False, 7], [False, 6]]}
    assert counts(server.stats(), 0) == (8, 6, 2, 0)
    r = client.post("/0/confirm_write", {"written_keys_to_confirm": [["a", 7]], "pages_to_release": [6]})
    expect(r, 204)
    assert r.content == b""
    assert counts(server.stats(), 0) == (8, 7, 0, 1)
    # Bare-string elements are accepted too.
    r = client.post("/0/reserve_and_allocate_page_indices", {"keys": ["a", ["c", ""]]})
    expect(r, 200)
    assert r.json() == {"indices": [[True, 7], [False, 6]]}
    assert counts(server.stats(), 0) == (8, 6, 1, 1)


def test_reserve_duplicate_new_key_shares_page(server, client):
    client.s_init(0, 8)
    assert client.s_reserve(0, ["a", "b", "a"]) == [(False, 7), (False, 6), (False, 7)]
    assert counts(server.stats(), 0) == (8, 6, 2, 0)


def test_reserve_when_full_gives_minus_one(server, client):
    client.s_init(0, 2)
    assert client.s_reserve(0, ["a", "b", "c"]) == [(False, 1), (False, 0), (False, -1)]
    assert client.s_reserve(0, ["d"]) == [(False, -1)]
    st = invariants(server.stats())
    assert counts(st, 0) == (2, 0, 2, 0)


def test_reserve_and_exists_with_missing_keys(server, client):
    client.s_init(0, 2)
    for op, field in (("reserve_and_allocate_page_indices", "indices"), ("get_page_indices", "indices"),
                      ("exists", "exists")):
        r = client.post(f"/0/{op}", {})
        expect(r, 200)
        assert r.json() == {field: []}, op
        r = client.post(f"/0/{op}")
        expect(r, 200)
        assert r.json() == {field: []}, op
    for op in ("delete_keys", "confirm_write", "clear"):
        expect(client.post(f"/0/{op}", {}), 204)
        expect(client.post(f"/0/{op}"), 204)
    assert counts(server.stats(), 0) == (2, 2, 0, 0)


def test_confirm_semantics_match_vllm(server, client):
    client.s_init(0, 4)
    # first writer wins, nothing leaks
    assert client.s_reserve(0, ["a"]) == [(False, 3)]
    assert client.s_reserve(0, ["a"]) == [(False, 2)]
    client.s_confirm(0, [["a", 2]])
    client.s_confirm(0, [["a", 3]])
    st = invariants(server.stats())
    assert counts(st, 0) == (4, 3, 0, 1)
    assert client.s_get(0, ["a"]) == [2]
    # idempotent retry
    client.s_confirm(0, [["a", 2]])
    assert counts(server.stats(), 0) == (4, 3, 0, 1)
    # releasing a held page is refused and counted
    client.s_confirm(0, [], [2])
    st = server.stats()
    assert counts(st, 0) == (4, 3, 0, 1)
    assert rank_stats(st, 0)["release_of_held_page"] == 1
    assert client.s_get(0, ["a"]) == [2]


def test_exists_and_get_page_indices_are_per_rank(server, client):
    client.s_init(0, 4)
    client.s_init(1, 4)
    assert client.s_write(0, ["a", "b"]) == [3, 2]
    assert client.s_write(1, ["b"]) == [3]
    r = client.post("/0/exists", {"keys": ["a", "b", "c"]})
    expect(r, 200)
    assert r.json() == {"exists": [True, True, False]}
    assert client.s_exists(1, ["a", "b", "c"]) == [False, True, False]
    r = client.post("/0/get_page_indices", {"keys": ["b", "c", "a"]})
    expect(r, 200)
    assert r.json() == {"indices": [2, None, 3]}
    assert client.s_get(1, ["a", "b"]) == [None, 3]
    # reserved but unconfirmed keys do not exist
    assert client.s_reserve(1, ["c"]) == [(False, 2)]
    assert client.s_exists(1, ["c"]) == [False]
    assert client.s_get(1, ["c"]) == [None]


def test_delete_keys_on_one_rank(server, client):
    client.s_init(0, 4)
    client.s_init(1, 4)
    client.s_write(0, ["a", "b"])
    client.s_write(1, ["a"])
    r = client.post("/0/delete_keys", {"keys": ["a", "nope"]})
    expect(r, 204)
    assert r.content == b""
    st = invariants(server.stats())
    assert counts(st, 0) == (4, 3, 0, 1)
    assert counts(st, 1) == (4, 3, 0, 1)
    assert client.s_exists(0, ["a", "b"]) == [False, True]
    assert client.s_exists(1, ["a"]) == [True]
    assert client.s_reserve(0, ["c"]) == [(False, 3)]


def test_clear_one_rank(server, client):
    client.s_init(0, 4)
    client.s_init(1, 4)
    client.s_write(0, ["a", "b"])
    client.s_write(1, ["a", "b"])
    client.s_reserve(0, ["r"])
    r = client.post("/0/clear", {})
    expect(r, 204)
    assert r.content == b""
    st = invariants(server.stats())
    assert counts(st, 0) == (4, 4, 0, 0)
    assert counts(st, 1) == (4, 2, 0, 2)
    assert client.s_exists(0, ["a", "b"]) == [False, False]
    assert client.s_exists(1, ["a", "b"]) == [True, True]
    # the rank stays initialized
    p = client.s_reserve(0, ["c"])
    assert p[0][0] is False and 0 <= p[0][1] < 4


def test_pool_namespaces(server, client):
    client.s_init(0, 4)
    client.s_init(0, 2, ns="mamba")
    st = invariants(server.stats())
    assert counts(st, 0, pool="kv") == (4, 4, 0, 0)
    assert counts(st, 0, pool="mamba") == (2, 2, 0, 0)
    assert client.s_write(0, ["a"], ns="mamba") == [1]
    assert client.s_exists(0, ["a"], ns="mamba") == [True]
    assert client.s_exists(0, ["a"]) == [False]
    assert client.s_get(0, ["a"], ns="kv") == [None]
    assert client.s_get(0, ["a"], ns="mamba") == [1]
    st = server.stats()
    assert counts(st, 0, pool="mamba") == (2, 1, 0, 1)
    assert counts(st, 0, pool="kv") == (4, 4, 0, 0)
    # clear with a namespace clears only that pool
    client.s_write(0, ["k"])
    client.s_clear(0, ns="mamba")
    st = server.stats()
    assert counts(st, 0, pool="mamba") == (2, 2, 0, 0)
    assert counts(st, 0, pool="kv") == (4, 3, 0, 1)
    # a pool that was never initialized on a rank: 404 naming the pool
    r = client.post("/1/exists", {"keys": ["a"], "namespace": "mamba"})
    expect(r, 404, "Rank 1 namespace 'mamba' not initialized. Please call /1/initialize first.")
    r = client.post("/0/get_page_indices", {"keys": ["a"], "namespace": "indexer"})
    expect(r, 404, "Rank 0 namespace 'indexer' not initialized. Please call /0/initialize first.")
    r = client.post("/3/exists", {"keys": ["a"], "namespace": "kv"})
    expect(r, 404, "Rank 3 not initialized. Please call /3/initialize first.")


def test_pool_name_any_bytes_but_nul(server, client):
    pool = "indexer/layer 3 é"
    client.s_init(0, 2, ns=pool)
    assert client.s_write(0, ["a"], ns=pool) == [1]
    assert counts(server.stats(), 0, pool=pool) == (2, 1, 0, 1)
    long_pool = "p" * 128
    client.s_init(5, 1, ns=long_pool)
    assert counts(server.stats(), 5, pool=long_pool) == (1, 1, 0, 0)


def test_ranks_shared_between_vllm_and_sglang_kv_pool(server, client):
    client.v_init(0, 8)
    # vLLM-initialized rank 0 is SGLang rank 0 of pool kv
    assert client.s_exists(0, ["a"]) == [False]
    assert client.v_write(0, ["a"]) == [0]
    assert client.s_exists(0, ["a"]) == [True]
    assert client.s_get(0, ["a"]) == [0]
    assert client.s_reserve(0, ["a", "b"]) == [(True, 0), (False, 7)]
    client.s_confirm(0, [["b", 7]])
    assert client.v_exists(["a", "b"]) == [True, True]
    # a rank initialized through SGLang counts for vLLM completeness
    client.s_init(1, 4)
    assert client.v_exists(["a", "b"]) == [False, False]
    assert client.v_loc(0, ["a"]) == [None]
    client.s_write(1, ["a"])
    assert client.v_exists(["a", "b"]) == [True, False]
    assert client.v_loc(1, ["a"]) == [3]
    # SGLang sees per-rank state, no completeness
    assert client.s_get(0, ["b"]) == [7]
    # another pool's rank does not count for vLLM (which uses pool kv)
    client.s_init(2, 4, ns="mamba")
    assert client.v_exists(["a"]) == [True]
    st = invariants(server.stats())
    assert not has_rank(st, 2, pool="kv")
    # vLLM /clear clears the shared kv pool; the mamba pool is untouched
    client.s_write(2, ["m"], ns="mamba")
    client.v_clear()
    assert client.s_exists(0, ["a"]) == [False]
    assert client.s_exists(2, ["m"], ns="mamba") == [True]


def test_deployment_prefix_with_sglang(server):
    v = server.client("/ns/qwen-tp2")
    v.v_init(0, 4)
    r = v.post("/0/exists", {"keys": ["a"], "namespace": "kv"})
    expect(r, 200)
    assert r.json() == {"exists": [False]}
    v.s_write(0, ["a"], ns="kv")
    assert v.v_exists(["a"]) == [True]
    assert v.v_loc(0, ["a"]) == [3]
    # the default deployment does not see it, and has no rank 0
    d = server.client()
    r = d.post("/0/exists", {"keys": ["a"]})
    expect(r, 404, "Rank 0 not initialized. Please call /0/initialize first.")
    assert d.v_exists(["a"]) == [False]
    assert counts(server.stats(), 0, "qwen-tp2", "kv") == (4, 3, 0, 1)


def test_sglang_404_on_every_route(server, client):
    for op in ("exists", "reserve_and_allocate_page_indices", "confirm_write", "delete_keys", "clear",
               "get_page_indices"):
        r = client.post(f"/7/{op}", {})
        expect(r, 404, "Rank 7 not initialized. Please call /7/initialize first.")
        r = client.post(f"/7/{op}", {"namespace": "mamba"})
        expect(r, 404, "Rank 7 namespace 'mamba' not initialized. Please call /7/initialize first.")


# ---- recency and eviction ------------------------------------------------------

def _three_held(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.s_init(0, 3)
    # highest free page first: reserving c, b, a puts a on 0, b on 1, c on 2
    assert c.s_reserve(0, ["c", "b", "a"]) == [(False, 2), (False, 1), (False, 0)]
    c.s_confirm(0, [["a", 0], ["b", 1], ["c", 2]])
    return srv, c


def test_eviction_order_reverse_touch_in_lookup(start_server):
    srv, c = _three_held(start_server)
    # touched c, b, a: a most recent, c least
    assert c.s_get(0, ["a", "b", "c"]) == [0, 1, 2]
    assert c.s_reserve(0, ["x"]) == [(False, 2)]
    assert c.s_exists(0, ["a", "b", "c"]) == [True, True, False]
    assert c.s_reserve(0, ["y"]) == [(False, 1)]
    assert c.s_exists(0, ["a", "b"]) == [True, False]
    assert c.s_reserve(0, ["z"]) == [(False, 0)]
    assert c.s_exists(0, ["a"]) == [False]
    st = invariants(srv.stats())
    assert counts(st, 0) == (3, 0, 3, 0)
    assert rank_stats(st, 0)["evictions"] == 3
    assert c.s_reserve(0, ["w"]) == [(False, -1)]


def test_eviction_order_reverse_touch_in_one_batch(start_server):
    srv, c = _three_held(start_server)
    assert c.s_get(0, ["a", "b", "c"]) == [0, 1, 2]
    assert c.s_reserve(0, ["x", "y", "z"]) == [(False, 2), (False, 1), (False, 0)]


def test_eviction_order_follows_lookup_order(start_server):
    srv, c = _three_held(start_server)
    assert c.s_get(0, ["c", "b", "a"]) == [2, 1, 0]  # c most recent, a least
    assert c.s_reserve(0, ["x"]) == [(False, 0)]
    assert c.s_reserve(0, ["y"]) == [(False, 1)]
    assert c.s_exists(0, ["a", "b", "c"]) == [False, False, True]


def test_reserve_hits_touch_in_reverse(start_server):
    srv, c = _three_held(start_server)
    assert c.s_get(0, ["c", "b", "a"]) == [2, 1, 0]  # LRU order a, b, c
    # allocation hits touch too, last to first: order now c, b, a
    assert c.s_reserve(0, ["a", "b", "c"]) == [(True, 0), (True, 1), (True, 2)]
    assert c.s_reserve(0, ["x"]) == [(False, 2)]
    assert c.s_exists(0, ["a", "b", "c"]) == [True, True, False]


def test_exists_does_not_touch(start_server):
    srv, c = _three_held(start_server)
    assert c.s_get(0, ["a", "b", "c"]) == [0, 1, 2]  # LRU order c, b, a
    assert c.s_exists(0, ["c"]) == [True]
    assert c.s_reserve(0, ["x"]) == [(False, 2)]


def test_batch_never_evicts_its_own_hit(start_server):
    srv, c = _three_held(start_server)
    assert c.s_get(0, ["a", "b", "c"]) == [0, 1, 2]  # LRU order c, b, a
    # c is the LRU but is a hit later in this batch: b goes instead
    assert c.s_reserve(0, ["x", "c"]) == [(False, 1), (True, 2)]
    assert c.s_exists(0, ["a", "b", "c"]) == [True, False, True]


def test_get_page_indices_starts_read_grace(server, client):
    # default --read-grace-ms 5000
    client.s_init(0, 1)
    client.s_write(0, ["a"])
    assert client.s_get(0, ["a"]) == [0]
    assert client.s_reserve(0, ["b"]) == [(False, -1)]
    assert client.s_exists(0, ["a"]) == [True]
    assert rank_stats(server.stats(), 0)["evictions"] == 0


def test_reserve_hit_does_not_start_read_grace(start_server):
    srv = start_server("--read-grace-ms", "600000")
    c = srv.client()
    c.s_init(0, 1)
    c.s_write(0, ["a"])
    assert c.s_reserve(0, ["a"]) == [(True, 0)]
    assert c.s_reserve(0, ["b"]) == [(False, 0)]
    assert c.s_exists(0, ["a"]) == [False]


# ---- a realistic HiCache flow ---------------------------------------------------

def test_hicache_flow_mha_zero_copy_and_hybrid_pool(server):
    """batch_set_v1 / batch_get_v1 / batch_exists as HiCacheHF3FS drives
    them: keys split into '-k'/'-v' halves, existing keys skipped, a failed
    write released, a second pool (mamba) with '{key}_{pool}' keys."""
    c = server.client()
    c.s_init(0, 8)
    c.s_init(0, 4, ns="mamba")
    pages = ["h1", "h2", "h3"]
    kv_keys = [f"{h}-{x}" for h in pages for x in ("k", "v")]
    idx = c.s_reserve(0, kv_keys)
    assert idx == [(False, 7 - i) for i in range(6)]
    # the write of h3-v fails: its page is released, the rest confirmed
    written = [[k, p] for k, (_, p) in zip(kv_keys, idx) if k != "h3-v"]
    c.s_confirm(0, written, [2])
    assert counts(server.stats(), 0) == (8, 3, 0, 5)
    # batch_exists: the leading run of pages whose k and v both exist
    ex = c.s_exists(0, kv_keys)
    assert ex == [True, True, True, True, True, False]
    # a second instance saves the same prefix: existing keys come back
    # [true, page] and are skipped, only h3-v is written
    idx2 = c.s_reserve(0, kv_keys)
    assert idx2 == [(True, 7), (True, 6), (True, 5), (True, 4), (True, 3), (False, 2)]
    c.s_confirm(0, [["h3-v", 2]], [])
    assert c.s_get(0, kv_keys) == [7, 6, 5, 4, 3, 2]
    # the hybrid pool has its own pages and keys
    m_keys = [f"{h}_mamba" for h in pages]
    assert c.s_write(0, m_keys, ns="mamba") == [3, 2, 1]
    assert c.s_exists(0, m_keys) == [False, False, False]
    assert c.s_get(0, m_keys, ns="mamba") == [3, 2, 1]
    st = invariants(server.stats())
    assert counts(st, 0, pool="kv") == (8, 2, 0, 6)
    assert counts(st, 0, pool="mamba") == (4, 1, 0, 3)
    # HiCacheHF3FS.clear clears every pool of the rank
    c.s_clear(0)
    c.s_clear(0, ns="mamba")
    st = server.stats()
    assert counts(st, 0, pool="kv") == (8, 8, 0, 0)
    assert counts(st, 0, pool="mamba") == (4, 4, 0, 0)
