"""POST /v1/query (the longest stored prefix, per namespace and rank) and
/v1/pins (pins with a time limit) through the real `kvpage serve` (issue 38
§2 and §3; docs/protocol.md §5).

The keys of token ids are computed here with hashlib, as SGLang's HiCache
does (get_hash_str: SHA-256 over the previous page's hash bytes, then each
token as 4 bytes little-endian), so the query by token_ids is checked against
the engines' own keys, not against kvpage's code. With
KVPAGE_TEST_BACKEND=redis everything runs over Redis too (pins and the
block hash index live in the rank's keys, src/meta/redis_lua.h)."""
import hashlib
import os
import struct
import subprocess
import sys
import time

import pytest

import redisfix
from kvpserver import BIN, finish, launch
from kvptest import expect, sglang_hash, vllm_hash

REDIS = redisfix.BACKEND == "redis"


def page_keys(tokens, size, salt=b""):
    prior = hashlib.sha256(b"kvpage-salt\0" + salt).digest() if salt else b""
    out = []
    for i in range(len(tokens) // size):
        h = hashlib.sha256(prior + b"".join(struct.pack("<I", t)
                                            for t in tokens[i * size:(i + 1) * size]))
        out.append(h.hexdigest())
        prior = h.digest()
    return out


def query(c, body, status=200, detail=None):
    r = c.post("/v1/query", body)
    expect(r, status, detail)
    return r.json()


def ranks(ans, pool="kv"):
    for ns in ans["namespaces"]:
        if ns["namespace"] == pool:
            return {int(k): v["pages"] for k, v in ns["ranks"].items()}
    return {}


TOKENS = list(range(1000, 1020))  # 5 pages of 4 tokens


@pytest.fixture
def stored(start_server):
    """A server with ranks 0 and 1 of pool kv holding 3 and 1 pages of
    TOKENS' chain, and rank 0 of pool other holding all 5."""
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    keys = page_keys(TOKENS, 4)
    for rank in (0, 1):
        c.s_init(rank, 16)
    c.s_write(0, keys[:3])
    c.s_write(1, keys[:1])
    c.s_write(1, keys[2:4])  # a gap: rank 1's prefix stays 1
    c.s_init(0, 16, ns="other")
    c.s_write(0, keys, ns="other")
    return srv, c, keys


def test_query_by_keys_per_namespace_and_rank(stored):
    srv, c, keys = stored
    ans = query(c, {"keys": keys, "namespace": "kv"})
    assert ans["deployment"] == "default"
    assert ans["queried"] == {"pages": 5, "tokens": None}
    assert ranks(ans) == {0: 3, 1: 1}
    ns = ans["namespaces"][0]
    assert ns["longest_matched"] == {"pages": 3, "tokens": None}
    assert ns["all_ranks"] == {"pages": 1, "tokens": None}
    assert ans["longest_matched"] == {"pages": 3, "tokens": None}
    # Every namespace of the deployment when none is named; block_size gives tokens.
    ans = query(c, {"keys": keys, "block_size": 4})
    assert {n["namespace"] for n in ans["namespaces"]} == {"kv", "other"}
    assert ranks(ans, "other") == {0: 5}
    assert ans["longest_matched"] == {"pages": 5, "tokens": 20}
    # One rank; a missing first page; another deployment has nothing.
    assert ranks(query(c, {"keys": keys, "rank": 1, "namespace": "kv"})) == {1: 1}
    assert ranks(query(c, {"keys": ["nope"] + keys, "namespace": "kv"})) == {0: 0, 1: 0}
    assert query(c, {"keys": []})["longest_matched"] == {"pages": 0, "tokens": None}
    assert srv.client("/ns/else").post("/v1/query", {"keys": keys}).json()["namespaces"] == []


def test_query_by_token_ids_derives_sglang_keys(stored):
    srv, c, keys = stored
    ans = query(c, {"token_ids": TOKENS + [7, 7], "block_size": 4, "namespace": "kv"})
    assert ans["queried"] == {"pages": 5, "tokens": 20}  # the partial page has no key
    assert ranks(ans) == {0: 3, 1: 1}
    assert ans["namespaces"][0]["longest_matched"] == {"pages": 3, "tokens": 12}
    # A salt starts another chain: nothing stored under it.
    salted = page_keys(TOKENS, 4, b"model-a")
    assert salted[0] != keys[0]
    ans = query(c, {"token_ids": TOKENS, "block_size": 4, "cache_salt": "model-a"})
    assert ans["longest_matched"]["pages"] == 0
    c.s_write(0, salted[:2])
    ans = query(c, {"token_ids": TOKENS, "block_size": 4, "cache_salt": "model-a",
                    "namespace": "kv"})
    assert ranks(ans) == {0: 2, 1: 0}


def test_query_by_block_hashes(stored):
    srv, c, keys = stored
    body = {"block_hashes": [sglang_hash(k) for k in keys], "hash_format": "sglang",
            "namespace": "kv", "block_size": 4}
    ans = query(c, body)
    assert ranks(ans) == {0: 3, 1: 1}
    assert ans["namespaces"][0]["longest_matched"] == {"pages": 3, "tokens": 12}
    # Deleted, evicted and cleared pages leave the answer (over Redis: the
    # scripts keep the index of hashes).
    c.s_delete(0, [keys[1]])
    assert ranks(query(c, body)) == {0: 1, 1: 1}
    c.s_write(0, [keys[1]])
    assert ranks(query(c, body)) == {0: 3, 1: 1}
    c.s_clear(1)
    assert ranks(query(c, body)) == {0: 3, 1: 0}
    c.s_init(2, 2)
    c.s_write(2, keys[:2])
    c.s_write(2, ["x" * 20])  # evicts keys[0]: rank 2 holds keys[1] and x
    assert ranks(query(c, body)) == {0: 3, 1: 0, 2: 0}
    c.s_write(2, [keys[0]])  # evicts keys[1]
    assert ranks(query(c, body)) == {0: 3, 1: 0, 2: 1}
    # vLLM's form: the last 16 hex digits, uint64 (as strings above 2^63-1,
    # or as the int64 of the same bits).
    vk = [f"model@{k}" for k in keys]
    c.s_init(3, 16, ns="v")
    c.s_write(3, vk[:4], ns="v")
    hs = [vllm_hash(k) for k in vk]
    forms = [[str(h) for h in hs], [h - (1 << 64) if h >= 1 << 63 else h for h in hs]]
    for sent in forms:
        ans = query(c, {"block_hashes": sent, "hash_format": "vllm", "namespace": "v"})
        assert ranks(ans, "v") == {3: 4}, sent
    # The SGLang form does not read vLLM keys' ends.
    ans = query(c, {"block_hashes": forms[0], "hash_format": "sglang", "namespace": "v"})
    assert ranks(ans, "v") == {3: 0}


def test_query_says_which_pages_each_rank_holds(stored):
    """"held": true (kvpage's http:// client asks it for
    kvp_meta_exists_hashes) adds one bool per page asked to each rank,
    gaps included; without it the answer is as before."""
    srv, c, keys = stored
    body = {"block_hashes": [sglang_hash(k) for k in keys], "hash_format": "sglang",
            "namespace": "kv"}
    plain = query(c, body)
    assert "held" not in plain["namespaces"][0]["ranks"]["0"]
    ans = query(c, {**body, "held": True})
    got = ans["namespaces"][0]["ranks"]
    assert got["0"] == {"pages": 3, "tokens": None, "held": [True, True, True, False, False]}
    assert got["1"] == {"pages": 1, "tokens": None, "held": [True, False, True, True, False]}
    ans = query(c, {"keys": keys, "held": True, "rank": 1, "block_size": 4})
    assert [ns["namespace"] for ns in ans["namespaces"]] == ["kv"]
    assert ans["namespaces"][0]["ranks"] == {
        "1": {"pages": 1, "tokens": 4, "held": [True, False, True, True, False]}}
    assert query(c, {**body, "held": False}) == plain


@pytest.mark.parametrize("body, detail", [
    ({"keys": ["a"], "held": 1}, "Invalid request: held must be true or false"),
    ({}, "Invalid request: give exactly one of keys, token_ids or block_hashes"),
    ({"keys": ["a"], "token_ids": [1]},
     "Invalid request: give exactly one of keys, token_ids or block_hashes"),
    ({"keys": "a"}, "Invalid request: keys must be a list"),
    ({"keys": [1]}, "Invalid request format: keys[0] must be a string"),
    ({"keys": [""]}, "Invalid key: keys[0] is empty"),
    ({"keys": ["a"], "namespace": 3}, "Invalid namespace"),
    ({"keys": ["a"], "rank": -1}, "Invalid request: rank must be an integer from 0 to 2147483647"),
    ({"keys": ["a"], "block_size": 0},
     "Invalid request: block_size must be an integer from 1 to 1048576"),
    ({"token_ids": [1, 2]}, "Invalid request: token_ids need block_size"),
    ({"token_ids": [1, -2], "block_size": 1},
     "Invalid request: token_ids[1] must be an integer from 0 to 4294967295"),
    ({"token_ids": [1, 2 ** 32], "block_size": 1},
     "Invalid request: token_ids[1] must be an integer from 0 to 4294967295"),
    ({"token_ids": [1], "block_size": 1, "cache_salt": 5},
     "Invalid request: cache_salt must be a string"),
    ({"block_hashes": [1]},
     "Invalid request: block_hashes need hash_format 'sglang' (the key's first 16 hex digits) "
     "or 'vllm' (its last 16)"),
    ({"block_hashes": [1, "x"], "hash_format": "vllm"},
     "Invalid request: block_hashes[1] must be an integer (int64) or a string of decimal digits "
     "(uint64)"),
    ({"block_hashes": [str(2 ** 64)], "hash_format": "vllm"},
     "Invalid request: block_hashes[0] must be an integer (int64) or a string of decimal digits "
     "(uint64)"),
])
def test_query_refuses_bad_bodies(server, body, detail):
    c = server.client()
    c.s_init(0, 4)
    query(c, body, 400, detail)


def test_query_and_pins_methods_and_limits(start_server):
    srv = start_server("--max-keys", "4")
    c = srv.client()
    r = c.request("GET", "/v1/query")
    expect(r, 405)
    assert r.headers["Allow"] == "POST"
    r = c.request("PUT", "/v1/pins", {"keys": ["a"]})
    expect(r, 405)
    assert r.headers["Allow"] == "POST, DELETE"
    expect(c.post("/v1/query", {"keys": list("abcde")}), 413)
    expect(c.post("/v1/query", {"token_ids": [1, 2, 3, 4], "block_size": 1}), 200)
    expect(c.post("/v1/pins", {"keys": list("abcde"), "ttl_s": 1}), 413)


# ---------------------------------------------------------------- pins

def pin(c, body, status=200, detail=None, method="POST"):
    r = c.request(method, "/v1/pins", body)
    expect(r, status, detail)
    return r.json()


def fill(c, rank, keys):
    """Writes keys one by one: the first is the least recently used."""
    for k in keys:
        c.s_write(rank, [k])


@pytest.fixture
def full(start_server):
    """A server whose rank 0 (4 pages) holds a, b, c, d, a the least
    recently used; no read grace."""
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.s_init(0, 4)
    fill(c, 0, ["a", "b", "c", "d"])
    return srv, c


def test_pins_hold_against_eviction(full):
    srv, c = full
    c.s_init(1, 8)
    ans = pin(c, {"keys": ["a", "b"], "ttl_s": 600})
    assert ans == {"pinned": 2, "ttl_s": 600.0, "pinned_keys": 2, "max_pinned_keys": 2}
    # Two new pages on a full rank: LRU would take a and b; the pins make it c and d.
    c.s_write(0, ["e", "f"])
    assert c.s_exists(0, ["a", "b", "c", "d", "e", "f"]) == [True, True, False, False, True, True]
    # Still pinned at the LRU end: the next eviction passes over them again.
    c.s_write(0, ["g"])
    assert c.s_exists(0, ["a", "b", "e", "f", "g"]) == [True, True, False, True, True]
    st = srv.stats()["pins"]
    assert st["supported"] and st["max_pinned_ratio"] == 0.5
    assert st["namespaces"] == [{"deployment": "default", "pool": "kv", "keys": 2, "refs": 2,
                                 "ranks": {"0": 2, "1": 0}, "rank_refs": {"0": 2, "1": 0}}]
    # Unpinned, they are evicted again: pages an eviction passed over count as
    # used then (LRU order now f, a, b, g).
    assert pin(c, {"keys": ["a", "b", "zz"]}, method="DELETE") == {"unpinned": 2,
                                                                  "pinned_keys": 0}
    c.s_write(0, ["h", "i"])
    assert c.s_exists(0, ["f", "a", "b", "g"]) == [False, False, True, True]


def test_pins_are_counted_and_refreshed(full):
    srv, c = full
    pin(c, {"keys": ["a"], "ttl_s": 600})
    assert pin(c, {"keys": ["a", "a"], "ttl_s": 600})["pinned_keys"] == 1  # three references
    st = srv.stats()["pins"]["namespaces"][0]
    assert (st["keys"], st["refs"]) == (1, 3)
    for left in (2, 1):
        assert pin(c, {"keys": ["a"]}, method="DELETE") == {"unpinned": 1, "pinned_keys": 1}
        assert srv.stats()["pins"]["namespaces"][0]["refs"] == left
    assert pin(c, {"keys": ["a"]}, method="DELETE") == {"unpinned": 1, "pinned_keys": 0}
    assert pin(c, {"keys": ["a"]}, method="DELETE") == {"unpinned": 0, "pinned_keys": 0}
    # A short pin refreshed by a long one lasts as long as the long one.
    pin(c, {"keys": ["b"], "ttl_s": 0.2})
    pin(c, {"keys": ["b"], "ttl_s": 600})
    time.sleep(0.5)
    assert srv.stats()["pins"]["namespaces"][0]["keys"] == 1


def test_pins_expire_after_ttl(full):
    srv, c = full
    pin(c, {"keys": ["a"], "ttl_s": 3})
    c.s_write(0, ["e"])
    assert c.s_exists(0, ["a", "b"]) == [True, False]
    deadline = time.monotonic() + 30
    while srv.stats()["pins"]["namespaces"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.stats()["pins"]["namespaces"] == []
    # The eviction that passed over a made it recent (LRU order c, d, a, e):
    # three more pages take c, d and then a, no longer pinned.
    c.s_write(0, ["f", "g", "h"])
    assert c.s_exists(0, ["a", "e"]) == [False, True]


def test_pins_refused_over_the_ratio(start_server):
    srv = start_server("--max-pinned-ratio", "0.25")
    c = srv.client()
    c.s_init(0, 16)
    c.s_init(1, 8)  # the smallest rank sets the limit: 2 keys
    detail = ("Pin refused: pinning 3 more keys would pin 3 keys of the namespace, over the 2 "
              "allowed (--max-pinned-ratio 0.25 of rank 1's 8 pages)")
    pin(c, {"keys": ["a", "b", "c"], "ttl_s": 60}, 409, detail)
    assert srv.stats()["pins"]["namespaces"] == []  # a refused pin pins nothing
    pin(c, {"keys": ["a", "b", "a"], "ttl_s": 60})  # duplicates count once
    pin(c, {"keys": ["b"], "ttl_s": 60})  # a refresh adds no key
    pin(c, {"keys": ["c"], "ttl_s": 60}, 409)
    metrics = c.get("/metrics").text
    assert "kvpage_pins_refused_total 2\n" in metrics
    assert 'kvpage_pinned_keys{deployment="default",pool="kv"} 2\n' in metrics
    assert 'kvpage_pin_refs{deployment="default",pool="kv"} 4\n' in metrics
    assert 'kvpage_rank_pinned_pages{deployment="default",pool="kv",rank="0"} 0\n' in metrics
    c.s_write(0, ["a"])
    assert 'kvpage_rank_pinned_pages{deployment="default",pool="kv",rank="0"} 1\n' in \
        c.get("/metrics").text
    assert srv.stats()["pins"]["refused"] == 2


def test_pins_refuse_bad_requests(server):
    c = server.client()
    pin(c, {"keys": ["a"], "ttl_s": 5}, 404, "Namespace 'kv' not found")
    c.s_init(0, 4, ns="x")
    pin(c, {"keys": ["a"], "ttl_s": 5, "namespace": "x"})
    for body, detail in (
            ({"keys": ["a"]}, "Invalid request: ttl_s must be a number of seconds from 0.001 to "
                              "31536000"),
            ({"keys": ["a"], "ttl_s": 0}, None),
            ({"keys": ["a"], "ttl_s": "5"}, None),
            ({"keys": ["a"], "ttl_s": 1e12}, None),
            ({"block_hashes": [1], "ttl_s": 5},
             "Invalid request: give exactly one of keys, token_ids"),
            ({"keys": [""], "ttl_s": 5}, "Invalid key: keys[0] is empty"),
            ({"keys": ["a"], "ttl_s": 5, "namespace": ""}, "Invalid namespace")):
        r = c.post("/v1/pins", {**body, "namespace": body.get("namespace", "x")})
        expect(r, 400)
        if detail:
            assert r.json()["detail"] == detail, r.text


def test_pins_take_the_clients_lower_ratio(full):
    """"max_pinned_ratio" (kvp_meta_pin's max_ratio over http://): the lower
    of it and --max-pinned-ratio applies; a refusal to a client that asks
    for the rule's fields (X-Kvpage-Errors) carries them and the figures."""
    srv, c = full
    assert pin(c, {"keys": ["a"], "ttl_s": 60, "max_pinned_ratio": 0.25})["max_pinned_keys"] == 1
    pin(c, {"keys": ["b"], "ttl_s": 60, "max_pinned_ratio": 0.25}, 409,
        "Pin refused: pinning 1 more keys would pin 2 keys of the namespace, over the 1 "
        "allowed (--max-pinned-ratio 0.25 of rank 0's 4 pages)")
    assert pin(c, {"keys": ["b"], "ttl_s": 60, "max_pinned_ratio": 1})["max_pinned_keys"] == 2
    r = c.request("POST", "/v1/pins", {"keys": ["c"], "ttl_s": 60},
                  headers={"X-Kvpage-Errors": "fields"})
    expect(r, 409)
    assert r.json() == {
        "detail": "Pin refused: pinning 1 more keys would pin 3 keys of the namespace, over the 2 "
                  "allowed (--max-pinned-ratio 0.5 of rank 0's 4 pages)",
        "rule": "too_many", "index": -1, "value": 3, "limit": 2,
        "pinned_keys": 2, "max_pinned_keys": 2}
    for bad in (0, 1.5, "0.5", None):
        pin(c, {"keys": ["a"], "ttl_s": 60, "max_pinned_ratio": bad}, 400,
            "Invalid request: max_pinned_ratio must be a number in (0, 1]")


def test_pins_and_hashes_through_a_server_over_http(start_server):
    """A kvpage serve with --meta http://OTHER answers /v1/pins and the
    query by block_hashes from the other's state (the http:// client's
    kvp_meta_pin, _unpin, _pinned and _exists_hashes)."""
    back = start_server("--read-grace-ms", "0")
    front = start_server("--meta", back.url())
    b, f = back.client(), front.client()
    b.s_init(0, 4)
    fill(b, 0, ["a", "b", "c", "d"])
    keys = page_keys(TOKENS, 4)
    b.s_init(1, 8)
    b.s_write(1, keys[:2])
    assert pin(f, {"keys": ["a", "b"], "ttl_s": 600}) == {
        "pinned": 2, "ttl_s": 600.0, "pinned_keys": 2, "max_pinned_keys": 2}
    pin(f, {"keys": ["c"], "ttl_s": 600}, 409,
        "Pin refused: POST /v1/pins: 409 Pin refused: pinning 1 more keys would pin 3 keys of "
        "the namespace, over the 2 allowed (--max-pinned-ratio 0.5 of rank 0's 4 pages)")
    for srv in (back, front):
        st = srv.stats()["pins"]
        assert st["supported"], srv
        assert st["namespaces"][0]["keys"] == 2 and st["namespaces"][0]["ranks"]["0"] == 2
    b.s_write(0, ["e", "f"])  # evicts c and d, not the pinned a and b
    assert b.s_exists(0, ["a", "b", "c", "d"]) == [True, True, False, False]
    assert pin(f, {"keys": ["a", "b"]}, method="DELETE") == {"unpinned": 2, "pinned_keys": 0}
    assert back.stats()["pins"]["namespaces"] == []
    body = {"block_hashes": [sglang_hash(k) for k in keys], "hash_format": "sglang"}
    assert ranks(query(f, body)) == {0: 0, 1: 2}
    assert ranks(query(f, {**body, "rank": 1})) == {1: 2}


def test_pins_by_token_ids(start_server):
    srv = start_server("--read-grace-ms", "0")
    c = srv.client()
    c.s_init(0, 8)
    keys = page_keys(TOKENS, 4)
    fill(c, 0, keys[:3] + ["x", "y", "z", "w", "v"])
    pin(c, {"token_ids": TOKENS[:8], "block_size": 4, "ttl_s": 600})
    c.s_write(0, ["n1", "n2", "n3"])  # three evictions: keys[2], x, y
    assert c.s_exists(0, keys[:3]) == [True, True, False]


def test_pins_survive_a_restart(tmp_path):
    """In memory the data directory's file PINS keeps them; over Redis they
    live in Redis (a pin that ended meanwhile is gone by Redis's clock)."""
    state = ["--meta", redisfix.fresh_location()] if REDIS else ["--data-dir", tmp_path / "data"]
    flags = state + ["--read-grace-ms", "0"]
    srv = launch(tmp_path, flags)
    c = srv.client()
    c.s_init(0, 4)
    fill(c, 0, ["a", "b", "c", "d"])
    pin(c, {"keys": ["a"], "ttl_s": 600})
    pin(c, {"keys": ["a"], "ttl_s": 600})
    pin(c, {"keys": ["b"], "ttl_s": 0.3})  # ended by the time the server is back
    finish(srv)
    time.sleep(0.5)
    srv = launch(tmp_path, flags)
    try:
        c = srv.client()
        ns = srv.stats()["pins"]["namespaces"]
        assert ns == [{"deployment": "default", "pool": "kv", "keys": 1, "refs": 2,
                       "ranks": {"0": 1}, "rank_refs": {"0": 2}}]
        c.s_write(0, ["e", "f"])
        assert c.s_exists(0, ["a", "b", "c"]) == [True, False, False]
    finally:
        finish(srv)


def test_pins_on_every_rank(start_server):
    """A pin holds on every rank of the namespace, a larger rank's share
    does not lift the limit, and an unpin releases it everywhere."""
    srv = start_server("--read-grace-ms", "0", "--max-pinned-ratio", "0.5")
    c = srv.client()
    c.s_init(0, 8)
    c.s_init(1, 2)  # the limit: 1 key
    fill(c, 0, list("abcdefgh"))
    fill(c, 1, ["a", "b"])
    assert pin(c, {"keys": ["a"], "ttl_s": 600})["max_pinned_keys"] == 1
    pin(c, {"keys": ["b"], "ttl_s": 600}, 409,
        "Pin refused: pinning 1 more keys would pin 2 keys of the namespace, over the 1 "
        "allowed (--max-pinned-ratio 0.5 of rank 1's 2 pages)")
    c.s_write(0, ["x"])
    c.s_write(1, ["y"])
    assert c.s_exists(0, ["a", "b"]) == [True, False]
    assert c.s_exists(1, ["a", "b"]) == [True, False]
    assert srv.stats()["pins"]["namespaces"][0]["ranks"] == {"0": 1, "1": 1}
    c.s_init(2, 2)  # a rank initialized after the pin holds it too
    fill(c, 2, ["a", "q", "r"])
    assert c.s_exists(2, ["a", "q", "r"]) == [True, False, True]
    assert pin(c, {"keys": ["a"]}, method="DELETE") == {"unpinned": 1, "pinned_keys": 0}
    c.s_write(1, ["z"])
    assert c.s_exists(1, ["a", "y", "z"]) == [False, True, True]


def test_max_pinned_ratio_flag(tmp_path):
    for bad in ("0", "1.5", "x", "-1"):
        p = subprocess.run([BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", "none",
                            "--max-pinned-ratio", bad], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2, (bad, p.stderr)
        assert "--max-pinned-ratio" in p.stderr
    p = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "--max-pinned-ratio R" in p.stdout


def test_status_page_shows_pins(tmp_path, start_server):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_status_page import browse, sections
    srv = start_server()
    c = srv.client()
    c.s_init(0, 8)
    c.s_init(1, 8)
    c.s_write(0, ["a", "b", "c"])
    pin(c, {"keys": ["a", "b"], "ttl_s": 600})
    dom = browse(srv.url("/"), tmp_path)
    rows = sections(dom)[("default", "kv")]
    assert rows[0]["pinned"] == "2" and rows[1]["pinned"] == "0", rows
    assert "2 keys pinned, 0 refused" in dom


def test_pins_and_queries_alongside_writers(start_server):
    """Threads pin, unpin, query and read the figures while others write a
    full rank (evicting) on a server of 4 threads: no error, and the
    state's invariants hold (for TSan)."""
    import threading
    srv = start_server("--read-grace-ms", "0", "--threads", "4")
    setup = srv.client()
    setup.s_init(0, 32)
    errors = []

    def writer(w):
        c = srv.client()
        try:
            for i in range(60):
                c.s_write(0, [f"w{w}-{i}"])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            c.close()

    def pinner(p):
        c = srv.client()
        try:
            for i in range(40):
                keys = [f"w{p}-{j}" for j in range(i % 8, i % 8 + 4)]
                r = c.post("/v1/pins", {"keys": keys, "ttl_s": 0.05 + (i % 3)})
                assert r.status_code in (200, 409), r.text
                r = c.request("DELETE", "/v1/pins", {"keys": keys[:2]})
                assert r.status_code == 200, r.text
                r = c.post("/v1/query", {"keys": keys, "block_size": 16})
                assert r.status_code == 200, r.text
                assert c.get("/metrics").status_code == 200
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads += [threading.Thread(target=pinner, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:5]
