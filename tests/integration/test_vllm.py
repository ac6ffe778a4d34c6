"""vLLM dialect (protocol.md §1-2): normal flows of every route, as the HF3FS
KV connector drives them (scheduler initialize + batch_exists; workers
initialize, batch_allocate, write, confirm_write, get_locations)."""
import time

from kvptest import counts, expect, has_rank, invariants, rank_stats


# ---- initialize ------------------------------------------------------------

def test_initialize_worker(server, client):
    assert client.v_init(0, 8, "worker") == {"message": "Rank 0 initialized with 8 pages"}
    st = invariants(server.stats())
    assert counts(st, 0) == (8, 8, 0, 0)
    r = rank_stats(st, 0)
    assert r["keys"] == 0


def test_initialize_role_defaults_to_worker(server, client):
    assert client.v_init(3, 5) == {"message": "Rank 3 initialized with 5 pages"}
    assert counts(server.stats(), 3) == (5, 5, 0, 0)


def test_initialize_scheduler_changes_nothing(server, client):
    r = client.post("/rank/0/initialize", {"num_pages": 0, "role": "scheduler"})
    expect(r, 200)
    assert r.json() == {"message": "Scheduler role does not require initialization"}
    # The connector's scheduler sends only the role.
    r = client.post("/rank/0/initialize", {"role": "scheduler"})
    expect(r, 200)
    assert r.json() == {"message": "Scheduler role does not require initialization"}
    st = server.stats()
    assert all(ns["ranks"] == [] for ns in st["namespaces"]), st
    # A scheduler "rank" does not count towards completeness.
    client.v_init(0, 4)
    client.v_write(0, ["a"])
    client.post("/rank/1/initialize", {"role": "scheduler"})
    assert client.v_exists(["a"]) == [True]
    assert not has_rank(server.stats(), 1)


def test_initialize_same_size_again_keeps_state(server, client):
    client.v_init(0, 8)
    client.v_write(0, ["a"])
    assert client.v_init(0, 8) == {"message": "Rank 0 initialized with 8 pages"}
    assert counts(server.stats(), 0) == (8, 7, 0, 1)
    assert client.v_loc(0, ["a"]) == [0]


def test_resize_when_empty(server, client):
    client.v_init(0, 8)
    assert client.v_init(0, 4) == {"message": "Rank 0 initialized with 4 pages"}
    assert counts(server.stats(), 0) == (4, 4, 0, 0)
    assert client.v_init(0, 16) == {"message": "Rank 0 initialized with 16 pages"}
    assert counts(server.stats(), 0) == (16, 16, 0, 0)
    pages = client.v_alloc(0, [f"k{i}" for i in range(16)])
    assert pages == list(range(16))


def test_resize_refused_while_reserved_or_held(server, client):
    client.v_init(0, 8)
    assert client.v_alloc(0, ["a"]) == [0]
    before = server.stats()["namespaces"]
    r = client.post("/rank/0/initialize", {"num_pages": 4, "role": "worker"})
    expect(r, 409, "Rank 0 already initialized with 8 pages; refusing to change to 4 pages while it holds data")
    assert server.stats()["namespaces"] == before
    client.v_confirm(0, [["a", 0]])
    r = client.post("/rank/0/initialize", {"num_pages": 12})
    expect(r, 409, "Rank 0 already initialized with 8 pages; refusing to change to 12 pages while it holds data")
    assert counts(server.stats(), 0) == (8, 7, 0, 1)
    # Once the data is gone the resize goes through.
    client.v_delete(["a"])
    assert client.v_init(0, 4) == {"message": "Rank 0 initialized with 4 pages"}
    assert counts(server.stats(), 0) == (4, 4, 0, 0)


def test_resize_allowed_after_release(server, client):
    client.v_init(0, 8)
    assert client.v_alloc(0, ["a", "b"]) == [0, 1]
    client.v_confirm(0, [], [0, 1])
    assert counts(server.stats(), 0) == (8, 8, 0, 0)
    assert client.v_init(0, 2) == {"message": "Rank 0 initialized with 2 pages"}
    assert counts(server.stats(), 0) == (2, 2, 0, 0)


# ---- batch_allocate ----------------------------------------------------------

def test_batch_allocate_results_in_order(server, client):
    client.v_init(0, 8)
    r = client.post("/keys/batch_allocate", {"rank": 0, "keys": [["a", ""], ["b", ""], "c"]})
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": [["a", 0], ["b", 1], ["c", 2]]}
    st = invariants(server.stats())
    assert counts(st, 0) == (8, 5, 3, 0)
    assert rank_stats(st, 0)["keys"] == 0


def test_batch_allocate_prefix_key_accepted(server, client):
    client.v_init(0, 4)
    r = client.post("/keys/batch_allocate", {"rank": 0, "keys": [["a", ""], ["b", "a"]]})
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": [["a", 0], ["b", 1]]}


def test_batch_allocate_empty_and_missing_keys(server, client):
    client.v_init(0, 4)
    r = client.post("/keys/batch_allocate", {"rank": 0, "keys": []})
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": []}
    r = client.post("/keys/batch_allocate", {"rank": 0})
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": []}
    assert counts(server.stats(), 0) == (4, 4, 0, 0)


def test_batch_allocate_without_content_type(server, client):
    client.v_init(0, 4)
    r = client.post("/keys/batch_allocate", {"rank": 0, "keys": [["a", ""]]}, content_type=False)
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": [["a", 0]]}


def test_duplicate_keys_in_batch_share_a_page(server, client):
    client.v_init(0, 8)
    r = client.post("/keys/batch_allocate", {"rank": 0, "keys": [["a", ""], ["b", ""], ["a", ""], ["a", ""]]})
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": [["a", 0], ["b", 1], ["a", 0], ["a", 0]]}
    assert counts(server.stats(), 0) == (8, 6, 2, 0)


def test_reuse_of_complete_key(server, client):
    client.v_init(0, 8)
    assert client.v_write(0, ["a"]) == [0]
    assert client.v_exists(["a"]) == [True]
    assert client.v_alloc(0, ["a", "b"]) == [0, 1]
    assert counts(server.stats(), 0) == (8, 6, 1, 1)
    # Rewriting the same bytes and confirming again is a no-op.
    client.v_confirm(0, [["a", 0], ["b", 1]])
    assert counts(server.stats(), 0) == (8, 6, 0, 2)


def test_reuse_of_incomplete_keys_own_page(server, client):
    client.v_init(0, 8)
    client.v_init(1, 8)
    assert client.v_write(0, ["a"]) == [0]
    assert client.v_exists(["a"]) == [False]
    # rank 0 holds a but rank 1 is still writing: same page, none consumed.
    assert client.v_alloc(0, ["a"]) == [0]
    st = server.stats()
    assert counts(st, 0) == (8, 7, 0, 1)
    # rank 1 does not hold a yet: a new page there.
    assert client.v_alloc(1, ["a"]) == [0]
    assert counts(server.stats(), 1) == (8, 7, 1, 0)


def test_allocation_is_per_key_not_all_or_nothing(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 4)
    assert c.v_write(0, ["h"]) == [0]
    # 3 free pages, 5 keys of which one is a hit: the hit and 3 new keys get
    # pages, only the last new key gets -1 (h is returned, so never evicted).
    r = c.post("/keys/batch_allocate", {"rank": 0, "keys": [["h", ""], ["x", ""], ["y", ""], ["z", ""], ["w", ""]]})
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": [["h", 0], ["x", 1], ["y", 2], ["z", 3], ["w", -1]]}
    assert counts(srv.stats(), 0) == (4, 0, 3, 1)
    assert c.v_loc(0, ["h"]) == [0]


def test_full_rank_of_reservations_gives_minus_one(server, client):
    client.v_init(0, 2)
    assert client.v_alloc(0, ["a", "b", "c"]) == [0, 1, -1]
    assert client.v_alloc(0, ["d"]) == [-1]
    assert counts(server.stats(), 0) == (2, 0, 2, 0)


def test_free_pages_reused_last_in_release_order(server, client):
    # vLLM's reference: pages from the front of its free list, released
    # pages appended at its back (protocol-notes, "The order of free pages")
    client.v_init(0, 8)
    assert client.v_alloc(0, ["a", "b", "c", "d"]) == [0, 1, 2, 3]
    client.v_confirm(0, [], [1])
    client.v_confirm(0, [], [3])
    assert client.v_alloc(0, ["e", "f", "g"]) == [4, 5, 6]
    assert client.v_alloc(0, ["h", "i", "j"]) == [7, 1, 3]


# ---- confirm_write -----------------------------------------------------------

def test_confirm_write_204_and_idempotent_retry(server, client):
    client.v_init(0, 8)
    assert client.v_alloc(0, ["a", "b"]) == [0, 1]
    r = client.post("/keys/confirm_write", {"rank": 0, "confirmations": [["a", 0], ["b", 1]], "pages_to_release": []})
    expect(r, 204)
    assert r.content == b""
    st1 = invariants(server.stats())
    assert counts(st1, 0) == (8, 6, 0, 2)
    # The client retries on 5xx: the same confirmation again changes nothing.
    r = client.post("/keys/confirm_write", {"rank": 0, "confirmations": [["a", 0], ["b", 1]], "pages_to_release": []})
    expect(r, 204)
    st2 = server.stats()
    assert counts(st2, 0) == (8, 6, 0, 2)
    assert client.v_loc(0, ["a", "b"]) == [0, 1]


def test_confirm_defaults(server, client):
    client.v_init(0, 4)
    r = client.post("/keys/confirm_write", {"rank": 0})
    expect(r, 204)
    assert counts(server.stats(), 0) == (4, 4, 0, 0)


def test_confirm_with_release_of_unused_reservation(server, client):
    client.v_init(0, 8)
    assert client.v_alloc(0, ["a", "b"]) == [0, 1]
    client.v_confirm(0, [["a", 0]], [1])
    assert counts(server.stats(), 0) == (8, 7, 0, 1)
    assert client.v_loc(0, ["a", "b"]) == [0, None]


def test_first_writer_wins_no_leak(server, client):
    client.v_init(0, 8)
    # Two writers of the same new key, in separate requests: two pages.
    assert client.v_alloc(0, ["a"]) == [0]
    assert client.v_alloc(0, ["a"]) == [1]
    assert counts(server.stats(), 0) == (8, 6, 2, 0)
    client.v_confirm(0, [["a", 0]])
    # The second confirmation loses: a keeps page 0, page 1 is FREE again.
    client.v_confirm(0, [["a", 1]])
    st = invariants(server.stats())
    assert counts(st, 0) == (8, 7, 0, 1)
    assert client.v_loc(0, ["a"]) == [0]
    # Page 1 is FREE again, and handed out after the never-used pages.
    assert client.v_alloc(0, ["b"]) == [2]


def test_confirm_of_free_page_is_accepted(server, client):
    # A reservation that expired or predates a restart: page is FREE.
    client.v_init(0, 8)
    client.v_confirm(0, [["k", 5]])
    assert counts(server.stats(), 0) == (8, 7, 0, 1)
    assert client.v_loc(0, ["k"]) == [5]
    # The held page is not handed out again (it was just looked up, so the
    # default read grace keeps it from being evicted for the last key).
    pages = client.v_alloc(0, [f"n{i}" for i in range(8)])
    assert pages == [0, 1, 2, 3, 4, 6, 7, -1]


def test_release_reserved_page_becomes_free(server, client):
    client.v_init(0, 4)
    assert client.v_alloc(0, ["a", "b"]) == [0, 1]
    client.v_confirm(0, [], [0, 1])
    st = server.stats()
    assert counts(st, 0) == (4, 4, 0, 0)
    assert rank_stats(st, 0)["release_of_held_page"] == 0
    # Releasing a FREE page changes nothing.
    client.v_confirm(0, [], [0, 3])
    assert counts(server.stats(), 0) == (4, 4, 0, 0)


def test_release_of_held_page_is_refused(server, client):
    client.v_init(0, 4)
    assert client.v_write(0, ["a"]) == [0]
    # The connector's write-failure path releases every page of the batch,
    # including pages of keys that are already complete.
    client.v_confirm(0, [], [0])
    st = invariants(server.stats())
    assert counts(st, 0) == (4, 3, 0, 1)
    assert rank_stats(st, 0)["release_of_held_page"] == 1
    assert client.v_loc(0, ["a"]) == [0]
    assert client.v_exists(["a"]) == [True]
    # Page 0 is not handed to a new key.
    assert client.v_alloc(0, ["b", "c", "d", "e"]) == [1, 2, 3, -1]
    client.v_confirm(0, [], [0])
    assert rank_stats(server.stats(), 0)["release_of_held_page"] == 2
    assert client.v_loc(0, ["a"]) == [0]


def test_confirm_and_release_same_page_keeps_data(server, client):
    # The reference test confirms K on p and releases p in one call.
    client.v_init(0, 4)
    assert client.v_alloc(0, ["k"]) == [0]
    client.v_confirm(0, [["k", 0]], [0])
    st = server.stats()
    assert counts(st, 0) == (4, 3, 0, 1)
    assert client.v_loc(0, ["k"]) == [0]


# ---- batch_exists / get_locations -----------------------------------------------

def test_batch_exists_completeness_across_two_ranks(server, client):
    client.v_init(0, 8)
    client.v_init(1, 8)
    assert client.v_exists(["a", "b"]) == [False, False]
    client.v_write(0, ["a", "b"])
    assert client.v_exists(["a", "b", "zz"]) == [False, False, False]
    assert client.v_loc(0, ["a", "b"]) == [None, None]
    client.v_write(1, ["b"])
    assert client.v_exists(["a", "b", "zz"]) == [False, True, False]
    assert client.v_loc(0, ["a", "b"]) == [None, 1]
    assert client.v_loc(1, ["a", "b"]) == [None, 0]
    client.v_write(1, ["a"])
    assert client.v_exists(["b", "a"]) == [True, True]
    assert client.v_loc(1, ["a", "b"]) == [1, 0]


def test_batch_exists_empty_and_unknown_namespace(server, client):
    assert client.v_exists([]) == []
    r = client.post("/keys/batch_exists", {})
    expect(r, 200)
    assert r.json() == {"exists": []}
    # Nothing initialized anywhere: all false, not an error.
    assert client.v_exists(["a", "b"]) == [False, False]
    c2 = server.client("/ns/never")
    assert c2.v_exists(["a"]) == [False]


def test_late_initializing_rank(server, client):
    client.v_init(0, 8)
    client.v_write(0, ["a"])
    assert client.v_exists(["a"]) == [True]
    assert client.v_loc(0, ["a"]) == [0]
    # Completeness is evaluated at query time: a new rank makes a incomplete...
    client.v_init(1, 8)
    assert client.v_exists(["a"]) == [False]
    assert client.v_loc(0, ["a"]) == [None]
    assert client.v_loc(1, ["a"]) == [None]
    # ...until that rank writes it too (the reference would never complete it).
    assert client.v_alloc(1, ["a"]) == [0]
    client.v_confirm(1, [["a", 0]])
    assert client.v_exists(["a"]) == [True]
    assert client.v_loc(0, ["a"]) == [0]
    assert client.v_loc(1, ["a"]) == [0]


def test_get_locations_order_and_misses(server, client):
    client.v_init(0, 8)
    client.v_write(0, ["a", "b", "c"])
    assert client.v_loc(0, ["c", "x", "a", "b", "c"]) == [2, None, 0, 1, 2]
    assert client.v_loc(0, []) == []
    r = client.post("/keys/get_locations", {"rank": 0})
    expect(r, 200)
    assert r.json() == {"locations": []}


def test_reserved_key_is_not_located(server, client):
    client.v_init(0, 4)
    assert client.v_alloc(0, ["a"]) == [0]
    assert client.v_loc(0, ["a"]) == [None]
    assert client.v_exists(["a"]) == [False]


# ---- clear / delete ----------------------------------------------------------

def test_clear_keeps_ranks_initialized(server, client):
    client.v_init(0, 6)
    client.v_init(1, 4)
    client.v_write(0, ["a", "b"])
    client.v_write(1, ["a"])
    assert client.v_alloc(0, ["r"]) == [2]
    r = client.post("/clear")
    expect(r, 204)
    assert r.content == b""
    st = invariants(server.stats())
    assert counts(st, 0) == (6, 6, 0, 0)
    assert counts(st, 1) == (4, 4, 0, 0)
    assert client.v_exists(["a", "b"]) == [False, False]
    # Workers initialize only once: they must keep working without it.
    assert client.v_loc(0, ["a"]) == [None]
    pages = client.v_alloc(0, ["c"])
    assert 0 <= pages[0] < 6
    client.v_confirm(0, [["c", pages[0]]])
    pages1 = client.v_alloc(1, ["c"])
    assert 0 <= pages1[0] < 4
    client.v_confirm(1, [["c", pages1[0]]])
    assert client.v_exists(["c"]) == [True]


def test_clear_with_json_body_and_uninitialized_namespace(server, client):
    r = client.post("/clear", {})
    expect(r, 204)
    r = server.client("/ns/nobody").post("/clear")
    expect(r, 204)
    assert all(ns["ranks"] == [] for ns in server.stats()["namespaces"])


def test_keys_delete(server, client):
    client.v_init(0, 4)
    client.v_init(1, 4)
    client.v_write(0, ["a", "b"])
    client.v_write(1, ["a", "b"])
    r = client.post("/keys/delete", {"keys": ["a", "unknown"]})
    expect(r, 204)
    assert r.content == b""
    st = invariants(server.stats())
    assert counts(st, 0) == (4, 3, 0, 1)
    assert counts(st, 1) == (4, 3, 0, 1)
    assert client.v_exists(["a", "b"]) == [False, True]
    assert client.v_loc(0, ["a", "b"]) == [None, 1]
    # Page 0 of each rank is free again, handed out after the never-used ones.
    assert client.v_alloc(0, ["c", "d", "e"]) == [2, 3, 0]
    # Deleting on a namespace that was never initialized: 204.
    r = server.client("/ns/nobody").post("/keys/delete", {"keys": ["a"]})
    expect(r, 204)
    r = client.post("/keys/delete", {})
    expect(r, 204)


# ---- deployments ---------------------------------------------------------------

def test_ns_prefix_isolates_deployments(server):
    dflt = server.client()
    alpha = server.client("/ns/alpha")
    beta = server.client("/ns/beta.v2_x-1")
    dflt.v_init(0, 8)
    alpha.v_init(0, 4)
    assert alpha.v_write(0, ["a"]) == [0]
    assert dflt.v_exists(["a"]) == [False]
    assert alpha.v_exists(["a"]) == [True]
    assert dflt.v_loc(0, ["a"]) == [None]
    assert dflt.v_alloc(0, ["a"]) == [0]  # its own page 0, not a hit
    st = invariants(server.stats())
    assert counts(st, 0, "alpha") == (4, 3, 0, 1)
    assert counts(st, 0, "default") == (8, 7, 1, 0)
    # beta never initialized rank 0
    r = beta.post("/keys/batch_allocate", {"rank": 0, "keys": [["a", ""]]})
    expect(r, 404, "Allocation failed: Rank 0 not initialized")
    beta.v_init(0, 2)
    assert beta.v_exists(["a"]) == [False]
    st = server.stats()
    assert counts(st, 0, "beta.v2_x-1") == (2, 2, 0, 0)
    # /clear of one deployment leaves the others alone.
    alpha.v_clear()
    assert dflt.v_loc(0, ["a"]) == [None]
    assert counts(server.stats(), 0, "default") == (8, 7, 1, 0)
    assert counts(server.stats(), 0, "alpha") == (4, 4, 0, 0)


def test_ns_default_is_the_plain_base_url(server):
    plain = server.client()
    named = server.client("/ns/default")
    plain.v_init(0, 4)
    plain.v_write(0, ["a"])
    assert named.v_exists(["a"]) == [True]
    assert named.v_loc(0, ["a"]) == [0]


# ---- eviction and read grace ---------------------------------------------------

def test_eviction_of_least_recently_used(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 3)
    for k in ["a", "b", "c"]:
        c.v_write(0, [k])  # LRU order now a, b, c
    assert c.v_loc(0, ["a"]) == [0]  # a is most recent: b, c, a
    assert c.v_exists(["b"]) == [True]  # existence checks do not touch
    assert c.v_alloc(0, ["d"]) == [1]  # evicts b
    st = invariants(srv.stats())
    assert counts(st, 0) == (3, 0, 1, 2)
    assert rank_stats(st, 0)["evictions"] == 1
    assert c.v_exists(["a", "b", "c"]) == [True, False, True]
    assert c.v_loc(0, ["b"]) == [None]
    c.v_confirm(0, [["d", 1]])  # order: c, a, d
    assert c.v_alloc(0, ["e"]) == [2]  # evicts c
    assert c.v_exists(["a", "c", "d"]) == [True, False, True]
    assert rank_stats(srv.stats(), 0)["evictions"] == 2


def test_allocation_hit_touches(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 2)
    c.v_write(0, ["a"])
    c.v_write(0, ["b"])  # order a, b
    assert c.v_alloc(0, ["a"]) == [0]  # hit: order b, a
    c.v_confirm(0, [["a", 0]])
    assert c.v_alloc(0, ["x"]) == [1]  # evicts b
    assert c.v_exists(["a", "b"]) == [True, False]


def test_request_never_evicts_a_page_it_returns(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 2)
    c.v_write(0, ["a"])
    c.v_write(0, ["b"])  # order a, b: a is the LRU
    # a is a hit later in the same batch, so c must evict b, not a.
    assert c.v_alloc(0, ["c", "a"]) == [1, 0]
    assert c.v_exists(["a", "b"]) == [True, False]
    st = invariants(srv.stats())
    assert counts(st, 0) == (2, 0, 1, 1)


def test_request_never_evicts_an_earlier_hit(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 2)
    c.v_write(0, ["a"])
    c.v_write(0, ["b"])  # order a, b
    assert c.v_alloc(0, ["a", "c"]) == [0, 1]
    assert c.v_exists(["a", "b"]) == [True, False]


def test_get_locations_touches_last_to_first(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 3)
    c.v_write(0, ["a", "b", "c"])
    assert c.v_loc(0, ["a", "b", "c"]) == [0, 1, 2]  # c touched first: order c, b, a
    assert c.v_alloc(0, ["x"]) == [2]
    assert c.v_alloc(0, ["y"]) == [1]
    assert c.v_exists(["a", "b", "c"]) == [True, False, False]


def test_reserved_pages_are_never_evicted(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 2)
    assert c.v_alloc(0, ["a", "b"]) == [0, 1]
    assert c.v_alloc(0, ["c"]) == [-1]
    assert counts(srv.stats(), 0) == (2, 0, 2, 0)
    assert rank_stats(srv.stats(), 0)["evictions"] == 0


def test_eviction_on_one_rank_makes_key_incomplete(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 1)
    c.v_init(1, 4)
    c.v_write(0, ["a"])
    c.v_write(1, ["a"])
    assert c.v_exists(["a"]) == [True]
    assert c.v_alloc(0, ["b"]) == [0]  # evicts a on rank 0
    assert c.v_exists(["a"]) == [False]
    assert c.v_loc(1, ["a"]) == [None]
    st = invariants(srv.stats())
    assert counts(st, 1) == (4, 3, 0, 1)


def test_eviction_lru_is_per_rank(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 2)
    c.v_init(1, 2)
    c.v_write(0, ["a"])
    c.v_write(0, ["b"])
    c.v_write(1, ["b"])
    c.v_write(1, ["a"])
    assert c.v_alloc(0, ["x"]) == [0]  # evicts a on rank 0
    assert c.v_alloc(1, ["y"]) == [0]  # evicts b on rank 1
    st = invariants(srv.stats())
    assert counts(st, 0) == (2, 0, 1, 1)
    assert counts(st, 1) == (2, 0, 1, 1)


def test_read_grace_zero_evicts_looked_up_page(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.v_init(0, 2)
    c.v_write(0, ["a"])
    c.v_write(0, ["b"])
    assert c.v_loc(0, ["a"]) == [0]  # order b, a
    assert c.v_alloc(0, ["b"]) == [1]  # allocation hit: order a, b
    c.v_confirm(0, [["b", 1]])
    assert c.v_alloc(0, ["c"]) == [0]  # a is the LRU, no grace: evicted


def test_read_grace_protects_looked_up_page(start_server):
    srv = start_server("--read-grace-ms", "600000")
    c = srv.client()
    c.v_init(0, 2)
    c.v_write(0, ["a"])
    c.v_write(0, ["b"])
    assert c.v_loc(0, ["a"]) == [0]  # a looked up: grace starts
    assert c.v_alloc(0, ["b"]) == [1]  # hit on b touches it but starts no grace
    c.v_confirm(0, [["b", 1]])
    # a is the LRU but a reader may still be reading it: b goes instead.
    assert c.v_alloc(0, ["c"]) == [1]
    assert c.v_exists(["a", "b"]) == [True, False]
    c.v_confirm(0, [["c", 1]])


def test_read_grace_only_evictable_page_gives_minus_one(start_server):
    srv = start_server("--read-grace-ms", "600000")
    c = srv.client()
    c.v_init(0, 1)
    c.v_write(0, ["a"])
    assert c.v_loc(0, ["a"]) == [0]
    assert c.v_alloc(0, ["b"]) == [-1]
    st = invariants(srv.stats())
    assert counts(st, 0) == (1, 0, 0, 1)
    assert rank_stats(st, 0)["evictions"] == 0
    assert c.v_loc(0, ["a"]) == [0]


def test_default_read_grace_protects_looked_up_page(server, client):
    # Default --read-grace-ms is 5000.
    client.v_init(0, 1)
    client.v_write(0, ["a"])
    assert client.v_loc(0, ["a"]) == [0]
    assert client.v_alloc(0, ["b"]) == [-1]
    assert client.v_exists(["a"]) == [True]


def test_not_looked_up_page_is_evictable_despite_grace(start_server):
    srv = start_server("--read-grace-ms", "600000")
    c = srv.client()
    c.v_init(0, 1)
    c.v_write(0, ["a"])
    assert c.v_exists(["a"]) == [True]  # not a lookup
    assert c.v_alloc(0, ["b"]) == [0]
    assert rank_stats(srv.stats(), 0)["evictions"] == 1


# ---- leases ------------------------------------------------------------------

def test_lease_expiry_frees_reservation(start_server):
    srv = start_server("--lease-seconds", "1")
    c = srv.client()
    c.v_init(0, 4)
    assert c.v_alloc(0, ["a", "b"]) == [0, 1]
    st = srv.stats()
    assert counts(st, 0) == (4, 2, 2, 0)
    assert rank_stats(st, 0)["expired_reservations"] == 0
    other = srv.client("/ns/other")
    other.v_init(0, 2)
    assert other.v_alloc(0, ["x", "y", "z"]) == [0, 1, -1]
    time.sleep(1.5)
    # an allocation reclaims expired reservations by itself
    z = other.v_alloc(0, ["z"])
    assert z in ([0], [1]), z
    st = invariants(srv.stats())
    assert counts(st, 0, "other") == (2, 1, 1, 0)
    assert counts(st, 0) == (4, 4, 0, 0)
    assert rank_stats(st, 0)["expired_reservations"] == 2
    # The late writer's confirmation is still accepted while the page is free.
    c.v_confirm(0, [["a", 0]])
    assert counts(srv.stats(), 0) == (4, 3, 0, 1)
    assert c.v_loc(0, ["a"]) == [0]


# ---- a realistic connector flow ---------------------------------------------------

def _chain(tokens_per_block, blocks, prev=""):
    """Block keys as the HF3FS connector builds them: md5 chained over full blocks."""
    import hashlib
    keys = []
    for b in blocks:
        prev = hashlib.md5(f"{prev}_{b}".encode()).hexdigest()
        keys.append(prev)
    return keys


def test_connector_flow_tp2(server):
    sched = server.client()
    w0 = server.client()
    w1 = server.client()
    r = sched.post("/rank/0/initialize", {"num_pages": 0, "role": "scheduler"})
    expect(r, 200)
    assert w0.v_init(0, 16, "worker") == {"message": "Rank 0 initialized with 16 pages"}
    assert w1.v_init(1, 16, "worker") == {"message": "Rank 1 initialized with 16 pages"}
    blocks = [list(range(i * 16, i * 16 + 16)) for i in range(6)]
    keys = _chain(16, blocks[:4])
    # request 1: nothing cached; both workers save 4 blocks
    assert sched.v_exists(keys) == [False] * 4
    p0 = w0.v_write(0, keys)
    assert sched.v_exists(keys) == [False] * 4  # rank 1 has not saved yet
    p1 = w1.v_write(1, keys)
    assert p0 == p1 == [0, 1, 2, 3]
    assert sched.v_exists(keys) == [True] * 4
    # request 2 shares the first two blocks, then diverges
    keys2 = keys[:2] + _chain(16, [blocks[5]], keys[1])
    assert sched.v_exists(keys2) == [True, True, False]
    assert w0.v_loc(0, keys2[:2]) == [0, 1]
    assert w1.v_loc(1, keys2[:2]) == [0, 1]
    assert w0.v_write(0, keys2[2:]) == [4]
    # rank 1's write fails: it releases every page of its batch, including a
    # reused page of a complete key (the connector's failure path)
    pages = w1.v_alloc(1, [keys[0], keys2[2]])
    assert pages == [0, 4]
    w1.v_confirm(1, [], pages)
    st = invariants(server.stats())
    assert counts(st, 1) == (16, 12, 0, 4)
    assert rank_stats(st, 1)["release_of_held_page"] == 1
    assert sched.v_exists(keys2) == [True, True, False]
    assert w1.v_loc(1, [keys[0]]) == [0]
    # rank 1 retries and succeeds (on a never-used page: page 4 is reused last)
    assert w1.v_write(1, keys2[2:]) == [5]
    assert sched.v_exists(keys2) == [True, True, True]
    assert counts(server.stats(), 0) == (16, 11, 0, 5)


def test_percent_encoded_path_is_decoded_per_segment(server, client):
    """An escape in a deployment name or a route decodes to the same name
    ("/ns/a%2Db" is "/ns/a-b"); an encoded '/' or NUL in a name is a bad name
    (400 Invalid namespace, test_errors.py), not another path. http.client
    sends the path as written (requests would undo these escapes itself)."""
    import http.client
    import json as _json

    plain = server.client("/ns/a-b")
    try:
        plain.v_init(0, 4)
        assert plain.v_alloc(0, ["k"]) == [0]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        body = _json.dumps({"rank": 0, "confirmations": [["k", 0]]})
        conn.request("POST", "/ns/a%2Db/keys/confirm%5Fwrite", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 204, r.read()  # confirm_write's success (§2)
        r.read()
        conn.close()
        assert plain.v_exists(["k"]) == [True]
        assert client.v_exists(["k"]) == [False]  # another deployment than "default"
    finally:
        plain.close()


# ---- kvpage extension: "namespace" (the pool) on the namespace-wide routes ----

def test_namespace_field_selects_the_pool(server, client):
    """batch_exists, get_locations, /clear and /keys/delete take an optional
    body field "namespace" (default "kv"), as the SGLang routes do
    (docs/protocol-notes.md); vLLM's clients never send it."""
    client.s_init(0, 4, ns="p1")
    client.s_init(1, 4, ns="p1")
    client.s_write(0, ["a", "b"], ns="p1")
    client.s_write(1, ["a"], ns="p1")
    client.v_init(0, 4)
    # complete = held on both ranks of pool p1; the kv pool knows nothing of it
    r = client.post("/keys/batch_exists", {"keys": ["a", "b"], "namespace": "p1"})
    expect(r, 200)
    assert r.json() == {"exists": [True, False]}
    assert client.v_exists(["a", "b"]) == [False, False]
    r = client.post("/keys/batch_exists", {"keys": ["a"], "namespace": "kv"})
    assert r.json() == {"exists": [False]}
    # the same through the general path (an escaped key is not a plain body)
    r = client.post("/keys/batch_exists", {"keys": ["\u00e9", "a"], "namespace": "p1"})
    expect(r, 200)
    assert r.json() == {"exists": [False, True]}
    r = client.post("/keys/get_locations", {"rank": 0, "keys": ["a", "b"], "namespace": "p1"})
    expect(r, 200)
    assert r.json() == {"locations": [3, None]}
    r = client.post("/keys/get_locations", {"rank": 1, "namespace": "p1", "keys": ["a"]})
    assert r.json() == {"locations": [3]}
    r = client.post("/keys/get_locations", {"rank": 0, "keys": ["a"]})
    assert r.json() == {"locations": [None]}
    # a pool never initialized: as an unknown namespace (protocol-notes.md)
    r = client.post("/keys/batch_exists", {"keys": ["a"], "namespace": "nope"})
    expect(r, 200)
    assert r.json() == {"exists": [False]}
    r = client.post("/keys/get_locations", {"rank": 0, "keys": ["a"], "namespace": "nope"})
    expect(r, 404, "Failed to get key locations: Rank 0 not initialized")
    # delete on every rank of p1
    expect(client.post("/keys/delete", {"keys": ["a"], "namespace": "p1"}), 204)
    assert client.s_exists(0, ["a", "b"], ns="p1") == [False, True]
    assert client.s_exists(1, ["a"], ns="p1") == [False]
    # /clear of p1 only
    client.v_write(0, ["k"])
    expect(client.post("/clear", {"namespace": "p1"}), 204)
    assert client.s_exists(0, ["b"], ns="p1") == [False]
    assert client.v_exists(["k"]) == [True]
    expect(client.post("/clear", {"namespace": "nope"}), 204)
    expect(client.post("/keys/delete", {"keys": ["k"], "namespace": "nope"}), 204)
    assert client.v_exists(["k"]) == [True]


def test_namespace_field_invalid(server, client):
    client.v_init(0, 4)
    for route, body in (("/keys/batch_exists", {"keys": []}),
                        ("/keys/get_locations", {"rank": 0, "keys": []}),
                        ("/keys/delete", {"keys": []}),
                        ("/clear", {})):
        for bad in ("", 7, None, ["kv"], "x" * 129, "a\u0000b"):
            r = client.post(route, dict(body, namespace=bad))
            expect(r, 400, "Invalid namespace")
        # the namespace is read before the other fields
        r = client.post(route, {"keys": 5, "rank": "x", "namespace": 1})
        expect(r, 400, "Invalid namespace")
        # a valid pool of any bytes but NUL (as SGLang's) is taken: an unknown one
        ok = {"/keys/batch_exists": 200, "/keys/get_locations": 404}.get(route, 204)
        expect(client.post(route, dict(body, namespace="p q/\u00e9")), ok)
