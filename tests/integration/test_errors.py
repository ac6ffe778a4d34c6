"""Every error of protocol.md §2-5 and docs/protocol-notes.md: exact status,
exact `detail`, and /v1/stats unchanged afterwards. The server never answers
500 for anything a client sent.

Most cases share one server (module scope): rank 0 of (default, kv) has 8
pages, key "held" holds page 0 and page 1 is RESERVED (for key "res").
"""
import json
import re

import pytest

from kvpserver import finish, launch
from kvptest import Raw, counts, expect, invariants, rank_stats

NEED_ALLOC = "Invalid request format: need 'rank' and 'keys'"
NEED_CONFIRM = "Invalid request format: need 'rank' and 'confirmations'"
NEED_LOC = "Invalid request format: need 'rank' and 'keys'"
BAD_JSON = re.compile(r"Invalid JSON body: .+ at byte \d+")
NOT_OBJECT = "Invalid JSON body: expected an object at byte 0"
ELEM_ALLOC = "Invalid request format: keys[{i}] must be a string or [key, prefix_key]"
ELEM_STR = "Invalid request format: keys[{i}] must be a string"
POSITIVE = "Invalid initialization parameters: num_pages must be a positive integer"
AT_MOST = "Invalid initialization parameters: num_pages must be at most 2147483647"
ROLE = "Invalid initialization parameters: role must be 'worker' or 'scheduler'"
# protocol-notes.md gives two strings for SGLang num_pages of the wrong type
# (the initialize row and the "SGLang body field" row); either is accepted.
SG_NUM_PAGES_TYPE = frozenset({POSITIVE, "Invalid request format: 'num_pages' must be an integer"})
# ...and two for SGLang pages_to_release not a list.
SG_RELEASE_NOT_LIST = frozenset({"Invalid request format: 'pages_to_release' must be a list",
                                 "Confirmation failed: pages_to_release must be a list"})
NS = "Invalid namespace"
NOT_FOUND = "Not Found"
NOT_ALLOWED = "Method Not Allowed"
LONG = "k" * 1025
LONG_UTF8 = "\u00e9" * 513  # 1026 bytes
NUL = "a\u0000b"


def sg404(rank, pool=None):
    if pool is None:
        return f"Rank {rank} not initialized. Please call /{rank}/initialize first."
    return f"Rank {rank} namespace '{pool}' not initialized. Please call /{rank}/initialize first."


def match_detail(r, status, detail):
    assert r.status_code != 500, f"500 for a client error: {r.text[:300]!r}"
    assert r.status_code == status, (
        f"{r.request.method} {r.request.url} body={r.request.body[:200] if r.request.body else b''!r}: "
        f"expected {status}, got {r.status_code}: {r.text[:300]!r}")
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    got = r.json()
    assert isinstance(got, dict) and set(got) == {"detail"}, got
    d = got["detail"]
    if isinstance(detail, re.Pattern):
        assert detail.fullmatch(d), d
    elif isinstance(detail, frozenset):
        assert d in detail, d
    else:
        assert d == detail


def baseline(c):
    """Rank 0 of (default, kv): 8 pages, "held" on page 0, page 1 reserved."""
    c.v_clear()
    c.v_init(0, 8)
    assert c.v_write(0, ["held"]) == [0]
    assert c.v_alloc(0, ["res"]) == [1]


@pytest.fixture(scope="module")
def esrv(tmp_path_factory):
    srv = launch(tmp_path_factory.mktemp("errors"), ["--lease-seconds", "3600"])
    c = srv.client()
    baseline(c)
    srv.c = c
    yield srv
    c.close()
    finish(srv)


def run_case(srv, method, path, body, status, detail):
    before = srv.stats()["namespaces"]
    kw = {} if body is None else {"body": body}
    try:
        r = srv.c.request(method, path, **kw)
        match_detail(r, status, detail)
        after = srv.stats()["namespaces"]
        assert after == before, f"state changed by a failed request:\nbefore={before}\nafter={after}"
    finally:
        # a failing case must not cascade into the next ones
        if srv.alive() and counts(srv.stats(), 0) != (8, 6, 1, 1):
            baseline(srv.c)


def raw(obj_text):
    return Raw(obj_text)


CASES = []


def case(name, path, body, status, detail, method="POST"):
    CASES.append(pytest.param(method, path, body, status, detail, id=name))


# ---- JSON ------------------------------------------------------------------
POST_ROUTES = ["/keys/batch_allocate", "/keys/confirm_write", "/keys/batch_exists", "/keys/get_locations",
               "/keys/delete", "/clear", "/rank/0/initialize", "/0/initialize", "/0/exists",
               "/0/reserve_and_allocate_page_indices", "/0/confirm_write", "/0/delete_keys", "/0/clear",
               "/0/get_page_indices"]
for route in POST_ROUTES:
    case(f"truncated-json{route}", route, raw('{"rank": 0, "keys": ['), 400, BAD_JSON)
    case(f"list-body{route}", route, raw("[]"), 400, NOT_OBJECT)
for route in ["/keys/batch_allocate", "/keys/confirm_write", "/0/reserve_and_allocate_page_indices"]:
    case(f"string-body{route}", route, raw('"x"'), 400, NOT_OBJECT)
    case(f"number-body{route}", route, raw("5"), 400, NOT_OBJECT)
    case(f"null-body{route}", route, raw("null"), 400, NOT_OBJECT)
    case(f"true-body{route}", route, raw("true"), 400, NOT_OBJECT)
    case(f"trailing-garbage{route}", route, raw('{"rank": 0, "keys": []} x'), 400, BAD_JSON)
    case(f"trailing-comma{route}", route, raw('{"rank": 0,}'), 400, BAD_JSON)
    case(f"single-quotes{route}", route, raw("{'rank': 0}"), 400, BAD_JSON)
    case(f"bad-utf8{route}", route, Raw(b'{"rank": 0, "keys": ["\xff\xfe"]}'), 400, BAD_JSON)
    case(f"deep-nesting{route}", route, raw('{"keys": ' + "[" * 100000 + "]" * 100000 + "}"), 400, BAD_JSON)
    case(f"huge-integer{route}", route, raw('{"rank": 123456789012345678901234567890, "keys": []}'), 400,
         re.compile(r"(Invalid JSON body: .+ at byte \d+|Invalid request format: .*)"))

# ---- vLLM batch_allocate --------------------------------------------------------
for name, text in [("string", '"0"'), ("float", "0.0"), ("float1", "1.0"), ("exp", "0e0"), ("bool", "true"),
                   ("null", "null"), ("list", "[0]"), ("object", "{}"), ("2^31", "2147483648"), ("neg", "-1")]:
    case(f"alloc-rank-{name}", "/keys/batch_allocate", raw('{"rank": %s, "keys": [["a", ""]]}' % text), 400,
         NEED_ALLOC)
    case(f"confirm-rank-{name}", "/keys/confirm_write", raw('{"rank": %s, "confirmations": [["held", 0]]}' % text),
         400, NEED_CONFIRM)
    case(f"loc-rank-{name}", "/keys/get_locations", raw('{"rank": %s, "keys": ["held"]}' % text), 400, NEED_LOC)
case("alloc-rank-missing", "/keys/batch_allocate", {"keys": [["a", ""]]}, 400, NEED_ALLOC)
case("alloc-empty-body", "/keys/batch_allocate", None, 400, NEED_ALLOC)
case("confirm-rank-missing", "/keys/confirm_write", {"confirmations": []}, 400, NEED_CONFIRM)
case("confirm-empty-body", "/keys/confirm_write", None, 400, NEED_CONFIRM)
case("loc-rank-missing", "/keys/get_locations", {"keys": []}, 400, NEED_LOC)
for name, val in [("string", "a"), ("object", {}), ("null", None), ("number", 5), ("bool", True)]:
    case(f"alloc-keys-{name}", "/keys/batch_allocate", {"rank": 0, "keys": val}, 400, NEED_ALLOC)
    case(f"loc-keys-{name}", "/keys/get_locations", {"rank": 0, "keys": val}, 400, NEED_LOC)
    case(f"confirm-confirmations-{name}", "/keys/confirm_write", {"rank": 0, "confirmations": val}, 400,
         NEED_CONFIRM)
for name, elem in [("int", 5), ("null", None), ("object", {}), ("empty-list", []), ("one", ["a"]),
                   ("three", ["a", "", ""]), ("key-int", [5, ""]), ("prefix-int", ["a", 5]),
                   ("prefix-null", ["a", None]), ("bool", True), ("nested", [["a"], ""])]:
    case(f"alloc-elem-{name}", "/keys/batch_allocate", {"rank": 0, "keys": [["ok", ""], elem]}, 400,
         ELEM_ALLOC.format(i=1))
case("alloc-shape-before-404", "/keys/batch_allocate", {"rank": 9, "keys": [5]}, 400, ELEM_ALLOC.format(i=0))
case("alloc-keys-shape-before-404", "/keys/batch_allocate", {"rank": 9, "keys": "x"}, 400, NEED_ALLOC)
case("alloc-404", "/keys/batch_allocate", {"rank": 9, "keys": [["a", ""]]}, 404,
     "Allocation failed: Rank 9 not initialized")
case("alloc-404-max-rank", "/keys/batch_allocate", {"rank": 2147483647, "keys": []}, 404,
     "Allocation failed: Rank 2147483647 not initialized")
case("alloc-key-empty", "/keys/batch_allocate", {"rank": 0, "keys": [["", ""]]}, 400, "Invalid key: keys[0] is empty")
case("alloc-key-empty-bare", "/keys/batch_allocate", {"rank": 0, "keys": ["ok", ""]}, 400,
     "Invalid key: keys[1] is empty")
case("alloc-key-long", "/keys/batch_allocate", {"rank": 0, "keys": [["ok", ""], [LONG, ""]]}, 400,
     "Invalid key: keys[1] is longer than 1024 bytes")
case("alloc-key-long-utf8", "/keys/batch_allocate", {"rank": 0, "keys": [[LONG_UTF8, ""]]}, 400,
     "Invalid key: keys[0] is longer than 1024 bytes")
case("alloc-key-nul", "/keys/batch_allocate", {"rank": 0, "keys": [["ok", ""], ["x", ""], [NUL, ""]]}, 400,
     "Invalid key: keys[2] contains a NUL byte")

# ---- vLLM confirm_write ---------------------------------------------------------
CF = "Confirmation failed: "
case("confirm-404", "/keys/confirm_write", {"rank": 9, "confirmations": [["a", 0]]}, 404,
     "Confirmation failed: Rank 9 not initialized")
case("confirm-404-before-range", "/keys/confirm_write", {"rank": 9, "confirmations": [["a", 99]]}, 404,
     "Confirmation failed: Rank 9 not initialized")
case("confirm-404-release-only", "/keys/confirm_write", {"rank": 9, "confirmations": [], "pages_to_release": [0]},
     404, "Confirmation failed: Rank 9 not initialized")
for name, text in [("int", "5"), ("null", "null"), ("one", '["res"]'), ("page-string", '["res", "1"]'),
                   ("page-float", '["res", 1.0]'), ("page-exp", '["res", 1e0]'), ("page-bool", '["res", true]'),
                   ("page-null", '["res", null]'), ("key-int", "[5, 1]"), ("three", '["res", 1, 2]'),
                   ("object", '{"res": 1}'), ("empty", "[]")]:
    case(f"confirm-elem-{name}", "/keys/confirm_write",
         raw('{"rank": 0, "confirmations": [["held", 0], %s]}' % text), 400,
         CF + "confirmations[1] must be [key, page]")
for p in (8, -1, 2147483648, 100000):
    case(f"confirm-page-{p}", "/keys/confirm_write", {"rank": 0, "confirmations": [["res", p]]}, 400,
         CF + f"confirmations[0] page {p} is outside [0, 8)")
case("confirm-key-empty", "/keys/confirm_write", {"rank": 0, "confirmations": [["", 1]]}, 400,
     CF + "confirmations[0] key is empty")
case("confirm-key-long", "/keys/confirm_write", {"rank": 0, "confirmations": [["res", 1], [LONG, 2]]}, 400,
     CF + "confirmations[1] key is longer than 1024 bytes")
case("confirm-key-nul", "/keys/confirm_write", {"rank": 0, "confirmations": [[NUL, 1]]}, 400,
     CF + "confirmations[0] key contains a NUL byte")
for name, val in [("int", 5), ("string", "x"), ("null", None), ("object", {})]:
    case(f"confirm-release-{name}", "/keys/confirm_write",
         {"rank": 0, "confirmations": [["res", 1]], "pages_to_release": val}, 400,
         CF + "pages_to_release must be a list")
for name, text in [("string", '"2"'), ("float", "2.0"), ("bool", "true"), ("null", "null"), ("list", "[2]")]:
    case(f"confirm-release-elem-{name}", "/keys/confirm_write",
         raw('{"rank": 0, "confirmations": [["res", 1]], "pages_to_release": [3, %s]}' % text), 400,
         CF + "pages_to_release[1] must be an integer page")
for p in (8, -1, 2147483648):
    case(f"confirm-release-page-{p}", "/keys/confirm_write",
         {"rank": 0, "confirmations": [["res", 1]], "pages_to_release": [2, p]}, 400,
         CF + f"pages_to_release[1] page {p} is outside [0, 8)")
case("confirm-held-by-other", "/keys/confirm_write", {"rank": 0, "confirmations": [["other", 0]]}, 409,
     "Confirmation failed: page 0 on rank 0 holds another key")
case("confirm-all-or-nothing-409", "/keys/confirm_write",
     {"rank": 0, "confirmations": [["res", 1], ["other", 0]], "pages_to_release": [2]}, 409,
     "Confirmation failed: page 0 on rank 0 holds another key")
case("confirm-all-or-nothing-range", "/keys/confirm_write",
     {"rank": 0, "confirmations": [["res", 1], ["x", 9]]}, 400, CF + "confirmations[1] page 9 is outside [0, 8)")
case("confirm-all-or-nothing-release", "/keys/confirm_write",
     {"rank": 0, "confirmations": [["res", 1]], "pages_to_release": [9]}, 400,
     CF + "pages_to_release[0] page 9 is outside [0, 8)")
case("confirm-all-or-nothing-key", "/keys/confirm_write",
     {"rank": 0, "confirmations": [["res", 1], ["", 2]]}, 400, CF + "confirmations[1] key is empty")
case("confirm-range-before-conflict", "/keys/confirm_write",
     {"rank": 0, "confirmations": [["other", 0], ["x", 9]]}, 400, CF + "confirmations[1] page 9 is outside [0, 8)")

# ---- vLLM batch_exists / get_locations / delete / initialize -------------------------
for name, val in [("string", "a"), ("object", {}), ("null", None), ("number", 3)]:
    case(f"exists-keys-{name}", "/keys/batch_exists", {"keys": val}, 400, "Invalid keys format")
for name, val in [("int", 5), ("null", None), ("list", ["held", ""]), ("bool", False)]:
    case(f"exists-elem-{name}", "/keys/batch_exists", {"keys": ["held", val]}, 400, "Invalid keys format")
    case(f"loc-elem-{name}", "/keys/get_locations", {"rank": 0, "keys": ["held", val]}, 400, ELEM_STR.format(i=1))
    case(f"delete-elem-{name}", "/keys/delete", {"keys": ["held", val]}, 400, ELEM_STR.format(i=1))
for route, body in [("/keys/batch_exists", {}), ("/keys/get_locations", {"rank": 0}), ("/keys/delete", {})]:
    short = route.split("/")[-1]
    case(f"{short}-key-empty", route, dict(body, keys=["held", ""]), 400, "Invalid key: keys[1] is empty")
    case(f"{short}-key-long", route, dict(body, keys=[LONG]), 400, "Invalid key: keys[0] is longer than 1024 bytes")
    case(f"{short}-key-nul", route, dict(body, keys=["held", NUL]), 400, "Invalid key: keys[1] contains a NUL byte")
case("loc-404", "/keys/get_locations", {"rank": 9, "keys": ["held"]}, 404,
     "Failed to get key locations: Rank 9 not initialized")
case("loc-shape-before-404", "/keys/get_locations", {"rank": 9, "keys": [5]}, 400, ELEM_STR.format(i=0))

for name, text in [("zero", "0"), ("neg", "-1"), ("string", '"8"'), ("float", "8.0"), ("exp", "8e0"),
                   ("bool", "true"), ("null", "null"), ("list", "[8]")]:
    case(f"vinit-num-pages-{name}", "/rank/5/initialize", raw('{"num_pages": %s, "role": "worker"}' % text), 400,
         POSITIVE)
case("vinit-num-pages-missing", "/rank/5/initialize", {"role": "worker"}, 400, POSITIVE)
case("vinit-empty-body", "/rank/5/initialize", None, 400, POSITIVE)
case("vinit-num-pages-2^31", "/rank/5/initialize", {"num_pages": 2147483648}, 400, AT_MOST)
case("vinit-role-admin", "/rank/5/initialize", {"num_pages": 4, "role": "admin"}, 400, ROLE)
case("vinit-role-int", "/rank/5/initialize", {"num_pages": 4, "role": 5}, 400, ROLE)
case("vinit-role-case", "/rank/5/initialize", {"num_pages": 4, "role": "Worker"}, 400, ROLE)
case("vinit-resize-conflict", "/rank/0/initialize", {"num_pages": 4}, 409,
     "Rank 0 already initialized with 8 pages; refusing to change to 4 pages while it holds data")

# ---- SGLang ---------------------------------------------------------------------
for name, text in [("zero", "0"), ("neg", "-3")]:
    case(f"sinit-num-pages-{name}", "/5/initialize", raw('{"num_pages": %s}' % text), 400, POSITIVE)
for name, text in [("string", '"8"'), ("float", "8.0"), ("bool", "true"), ("null", "null")]:
    case(f"sinit-num-pages-{name}", "/5/initialize", raw('{"num_pages": %s}' % text), 400, SG_NUM_PAGES_TYPE)
case("sinit-num-pages-missing", "/5/initialize", {}, 400, POSITIVE)
case("sinit-num-pages-2^31", "/5/initialize", {"num_pages": 2147483648}, 400, AT_MOST)
case("sinit-resize-conflict", "/0/initialize", {"num_pages": 16}, 409,
     "Rank 0 already initialized with 8 pages; refusing to change to 16 pages while it holds data")
for name, val in [("empty", ""), ("int", 5), ("null", None), ("list", ["kv"]), ("long", "n" * 129), ("nul", "k\u0000v")]:
    for route, body in [("/0/initialize", {"num_pages": 8}), ("/0/exists", {"keys": ["held"]}),
                        ("/0/reserve_and_allocate_page_indices", {"keys": ["z"]}),
                        ("/0/confirm_write", {"written_keys_to_confirm": [["res", 1]]}),
                        ("/0/delete_keys", {"keys": ["held"]}), ("/0/clear", {}),
                        ("/0/get_page_indices", {"keys": ["held"]})]:
        case(f"pool-{name}{route}", route, dict(body, namespace=val), 400, NS)
for op, body in [("exists", {"keys": []}), ("reserve_and_allocate_page_indices", {"keys": [["a", ""]]}),
                 ("confirm_write", {"written_keys_to_confirm": [["a", 99]]}), ("delete_keys", {"keys": ["a"]}),
                 ("clear", {}), ("get_page_indices", {"keys": ["a"]})]:
    case(f"s404-{op}", f"/9/{op}", body, 404, sg404(9))
    case(f"s404-pool-{op}", f"/0/{op}", dict(body, namespace="mamba"), 404, sg404(0, "mamba"))
    case(f"s404-kv-{op}", f"/2147483647/{op}", dict(body, namespace="kv"), 404, sg404(2147483647))
for op in ("exists", "reserve_and_allocate_page_indices", "delete_keys", "get_page_indices"):
    for name, val in [("string", "a"), ("object", {}), ("null", None), ("number", 1)]:
        case(f"s-{op}-keys-{name}", f"/0/{op}", {"keys": val}, 400, "Invalid request format: 'keys' must be a list")
    case(f"s-{op}-key-empty", f"/0/{op}", {"keys": ["held", ""]}, 400, "Invalid key: keys[1] is empty")
    case(f"s-{op}-key-long", f"/0/{op}", {"keys": [LONG_UTF8]}, 400, "Invalid key: keys[0] is longer than 1024 bytes")
    case(f"s-{op}-key-nul", f"/0/{op}", {"keys": [NUL]}, 400, "Invalid key: keys[0] contains a NUL byte")
for op in ("exists", "delete_keys", "get_page_indices"):
    for name, val in [("int", 5), ("null", None), ("list", ["a", ""]), ("bool", True)]:
        case(f"s-{op}-elem-{name}", f"/0/{op}", {"keys": ["held", val]}, 400, ELEM_STR.format(i=1))
for name, elem in [("int", 5), ("null", None), ("object", {}), ("one", ["a"]), ("three", ["a", "", ""]),
                   ("key-int", [5, ""])]:
    case(f"s-reserve-elem-{name}", "/0/reserve_and_allocate_page_indices", {"keys": ["ok", elem]}, 400,
         ELEM_ALLOC.format(i=1))
W = "written_keys_to_confirm"
for name, val in [("string", "x"), ("object", {}), ("null", None), ("number", 2)]:
    case(f"s-confirm-written-{name}", "/0/confirm_write", {W: val}, 400,
         f"Invalid request format: '{W}' must be a list")
    case(f"s-confirm-release-{name}", "/0/confirm_write", {W: [["res", 1]], "pages_to_release": val}, 400,
         SG_RELEASE_NOT_LIST)
for name, text in [("int", "5"), ("one", '["res"]'), ("page-string", '["res", "1"]'), ("page-float", '["res", 1.0]'),
                   ("page-bool", '["res", true]'), ("key-int", "[5, 1]"), ("three", '["res", 1, 2]')]:
    case(f"s-confirm-elem-{name}", "/0/confirm_write", raw('{"%s": [["held", 0], %s]}' % (W, text)), 400,
         CF + f"{W}[1] must be [key, page]")
for p in (8, -1):
    case(f"s-confirm-page-{p}", "/0/confirm_write", {W: [["res", p]]}, 400,
         CF + f"{W}[0] page {p} is outside [0, 8)")
    case(f"s-confirm-release-page-{p}", "/0/confirm_write", {W: [["res", 1]], "pages_to_release": [p]}, 400,
         CF + f"pages_to_release[0] page {p} is outside [0, 8)")
case("s-confirm-release-elem", "/0/confirm_write", raw('{"%s": [["res", 1]], "pages_to_release": ["1"]}' % W), 400,
     CF + "pages_to_release[0] must be an integer page")
case("s-confirm-key-empty", "/0/confirm_write", {W: [["", 1]]}, 400, CF + f"{W}[0] key is empty")
case("s-confirm-key-long", "/0/confirm_write", {W: [[LONG, 1]]}, 400, CF + f"{W}[0] key is longer than 1024 bytes")
case("s-confirm-key-nul", "/0/confirm_write", {W: [[NUL, 1]]}, 400, CF + f"{W}[0] key contains a NUL byte")
case("s-confirm-held-by-other", "/0/confirm_write", {W: [["res", 1], ["other", 0]], "pages_to_release": [3]}, 409,
     "Confirmation failed: page 0 on rank 0 holds another key")

# ---- deployments, ranks in paths, routing ------------------------------------------
for name, dep in [("colon", "bad:name"), ("at", "bad@name"), ("tilde", "b~d"), ("pct", "bad%20name"),
                  ("long", "d" * 129), ("comma", "a,b"), ("enc-slash", "a%2Fb"), ("enc-slash-lower", "a%2fb"),
                  ("enc-nul", "a%00b"), ("enc-nul-only", "%00"), ("enc-long", "%64" * 129)]:
    case(f"dep-{name}-exists", f"/ns/{dep}/keys/batch_exists", {"keys": []}, 400, NS)
    case(f"dep-{name}-alloc", f"/ns/{dep}/keys/batch_allocate", {"rank": 0, "keys": []}, 400, NS)
    case(f"dep-{name}-init", f"/ns/{dep}/rank/0/initialize", {"num_pages": 2}, 400, NS)
    case(f"dep-{name}-sglang", f"/ns/{dep}/0/initialize", {"num_pages": 2}, 400, NS)
    case(f"dep-{name}-clear", f"/ns/{dep}/clear", None, 400, NS)
for text in ("2147483648", "-1", "4294967296", "99999999999999999999"):
    case(f"path-rank-vinit-{text}", f"/rank/{text}/initialize", {"num_pages": 2}, 400, f"Invalid rank: {text}")
    case(f"path-rank-sinit-{text}", f"/{text}/initialize", {"num_pages": 2}, 400, f"Invalid rank: {text}")
    case(f"path-rank-exists-{text}", f"/{text}/exists", {"keys": []}, 400, f"Invalid rank: {text}")
    case(f"path-rank-reserve-{text}", f"/{text}/reserve_and_allocate_page_indices", {"keys": []}, 400,
         f"Invalid rank: {text}")
    case(f"path-rank-clear-{text}", f"/{text}/clear", {}, 400, f"Invalid rank: {text}")
for text in ("abc", "1.5", "0x1", "1e3"):
    case(f"path-rank-nonint-vinit-{text}", f"/rank/{text}/initialize", {"num_pages": 2}, 404, NOT_FOUND)
    case(f"path-rank-nonint-exists-{text}", f"/{text}/exists", {"keys": []}, 404, NOT_FOUND)
for path in ["/keys/batch%00exists", "/keys%2Fbatch_exists", "/nope", "/keys/nope", "/0/nope", "/rank/0/nope", "/rank/0", "/keys", "/0", "/ns/alpha/nope",
             "/ns/alpha/keys/nope", "/v1/nope", "/keys/batch_allocate/extra", "/ns"]:
    case(f"unknown-post{path}", path, {}, 404, NOT_FOUND)
for path in ["/nope", "/v2/stats", "/healthz/x", "/ns/alpha"]:
    case(f"unknown-get{path}", path, None, 404, NOT_FOUND, method="GET")
# "/" (and "/ns/NAME/") is the status page (GET only).
case("status-post", "/", {}, 405, "Method Not Allowed")
case("status-bad-ns", "/ns/a!b/", None, 400, "Invalid namespace", method="GET")
for path in ["/keys/batch_allocate", "/keys/confirm_write", "/keys/batch_exists", "/keys/get_locations",
             "/keys/delete", "/clear", "/rank/0/initialize", "/0/initialize", "/0/exists",
             "/0/reserve_and_allocate_page_indices", "/0/confirm_write", "/0/delete_keys", "/0/clear",
             "/0/get_page_indices", "/ns/alpha/keys/batch_exists", "/ns/alpha/0/exists"]:
    case(f"get-on-post{path}", path, None, 405, NOT_ALLOWED, method="GET")
for path in ["/healthz", "/metrics", "/v1/stats"]:
    case(f"post-on-get{path}", path, {}, 405, NOT_ALLOWED)
case("put-clear", "/clear", None, 405, NOT_ALLOWED, method="PUT")
case("delete-exists", "/keys/batch_exists", None, 405, NOT_ALLOWED, method="DELETE")
case("patch-sglang", "/0/exists", {}, 405, NOT_ALLOWED, method="PATCH")


@pytest.mark.parametrize("method,path,body,status,detail", CASES)
def test_error(esrv, method, path, body, status, detail):
    run_case(esrv, method, path, body, status, detail)


def test_valid_edge_values_are_accepted(esrv):
    """The boundaries just inside the limits are not errors."""
    c = esrv.c
    r = c.post("/keys/get_locations", {"rank": 0, "keys": ["k" * 1024]})  # counts a miss
    expect(r, 200)
    assert r.json() == {"locations": [None]}
    before = esrv.stats()["namespaces"]
    r = c.post("/keys/batch_exists", {"keys": ["k" * 1024, "\u00e9" * 512]})
    expect(r, 200)
    assert r.json() == {"exists": [False, False]}
    r = c.post(f"/ns/{'d' * 128}/keys/batch_exists", {"keys": ["a"]})
    expect(r, 200)
    assert r.json() == {"exists": [False]}
    r = c.post("/ns/A-Za.z_09/keys/batch_exists", {})
    expect(r, 200)
    # keys[] of a namespace that was never initialized
    r = c.post("/0/exists", {"keys": ["a"], "namespace": "p" * 128})
    expect(r, 404, sg404(0, "p" * 128))
    assert esrv.stats()["namespaces"] == before


def test_long_key_confirmed(start_server):
    srv = start_server()
    c = srv.client()
    c.v_init(0, 2)
    k = "\u00e9" * 512  # exactly 1024 bytes
    assert c.v_write(0, [k]) == [0]
    assert c.v_loc(0, [k]) == [0]
    assert c.s_get(0, [k]) == [0]


def test_max_rank_in_path_and_body(start_server):
    srv = start_server()
    c = srv.client()
    assert c.v_init(2147483647, 1) == {"message": "Rank 2147483647 initialized with 1 pages"}
    assert c.v_alloc(2147483647, ["a"]) == [0]
    c.s_init(2147483646, 1)
    assert counts(srv.stats(), 2147483646) == (1, 1, 0, 0)


def test_num_pages_max(start_server):
    # 2^31-1 pages is a valid size; the server must not allocate per page
    # eagerly in a way that fails (it may answer 500 only for real OOM).
    srv = start_server()
    c = srv.client()
    r = c.post("/rank/0/initialize", {"num_pages": 2147483647})
    assert r.status_code in (200, 500), r.text
    if r.status_code == 200:
        assert r.json() == {"message": "Rank 0 initialized with 2147483647 pages"}
        assert c.v_alloc(0, ["a", "b"]) == [0, 1]
    else:
        assert r.json()["detail"].startswith("Internal error: ")


# ---- limits --------------------------------------------------------------------

def _padded(obj, size):
    text = json.dumps(obj)
    assert len(text) <= size
    return Raw(text[:-1] + " " * (size - len(text)) + "}")


def test_max_body(start_server):
    srv = start_server("--max-body", "1000")
    c = srv.client()
    c.v_init(0, 4)
    before = srv.stats()["namespaces"]
    r = c.post("/keys/batch_exists", _padded({"keys": ["a"]}, 1000))
    expect(r, 200)
    assert r.json() == {"exists": [False]}
    for route, obj in [("/keys/batch_exists", {"keys": ["a"]}),
                       ("/keys/batch_allocate", {"rank": 0, "keys": [["a", ""]]}),
                       ("/0/reserve_and_allocate_page_indices", {"keys": [["a", ""]]})]:
        r = c.post(route, _padded(obj, 1001))
        match_detail(r, 413, "Request body too large: limit is 1000 bytes")
        r = c.post(route, _padded(obj, 5000))
        match_detail(r, 413, "Request body too large: limit is 1000 bytes")
    assert srv.stats()["namespaces"] == before
    # still serving afterwards
    assert srv.client().v_alloc(0, ["a"]) == [0]


def test_max_keys(start_server):
    srv = start_server("--max-keys", "10")
    c = srv.client()
    c.v_init(0, 16)
    ten = [f"k{i}" for i in range(10)]
    eleven = [f"k{i}" for i in range(11)]
    assert c.v_alloc(0, ten) == list(range(10))
    c.v_confirm(0, [], list(range(10)))
    before = srv.stats()["namespaces"]
    msg = "Too many keys: more than 10 in one request"
    cases = [
        ("/keys/batch_allocate", {"rank": 0, "keys": [[k, ""] for k in eleven]}),
        ("/keys/batch_exists", {"keys": eleven}),
        ("/keys/get_locations", {"rank": 0, "keys": eleven}),
        ("/keys/delete", {"keys": eleven}),
        ("/keys/confirm_write", {"rank": 0, "confirmations": [[k, i] for i, k in enumerate(eleven)]}),
        ("/keys/confirm_write", {"rank": 0, "confirmations": [], "pages_to_release": list(range(11))}),
        ("/0/exists", {"keys": eleven}),
        ("/0/get_page_indices", {"keys": eleven}),
        ("/0/delete_keys", {"keys": eleven}),
        ("/0/reserve_and_allocate_page_indices", {"keys": eleven}),
        ("/0/confirm_write", {"written_keys_to_confirm": [[k, i] for i, k in enumerate(eleven)]}),
        ("/0/confirm_write", {"pages_to_release": list(range(11))}),
    ]
    for route, body in cases:
        r = c.post(route, body)
        match_detail(r, 413, msg)
        assert srv.stats()["namespaces"] == before, route
    r = c.post("/keys/batch_exists", {"keys": [f"k{i}" for i in range(25)]})
    match_detail(r, 413, "Too many keys: more than 10 in one request")
    # exactly the limit is fine everywhere
    assert c.v_exists(ten) == [False] * 10
    c.v_confirm(0, [[k, i] for i, k in enumerate(ten)], list(range(10)))
    assert counts(srv.stats(), 0) == (16, 6, 0, 10)


# ---- token and address filtering ------------------------------------------------

def test_token(start_server):
    srv = start_server("--token", "s3cret")
    anon = srv.client(token=None)
    wrong = srv.client(token="nope")
    good = srv.client()
    good.v_init(0, 4)
    good.v_write(0, ["a"])
    before = srv.stats()["namespaces"]
    for c in (anon, wrong):
        for method, path, body in [("POST", "/keys/batch_allocate", {"rank": 0, "keys": [["b", ""]]}),
                                   ("POST", "/keys/confirm_write", {"rank": 0, "confirmations": [["b", 1]]}),
                                   ("POST", "/keys/batch_exists", {"keys": ["a"]}),
                                   ("POST", "/clear", None),
                                   ("POST", "/0/reserve_and_allocate_page_indices", {"keys": ["b"]}),
                                   ("POST", "/0/clear", {}),
                                   ("POST", "/rank/1/initialize", {"num_pages": 2}),
                                   ("GET", "/v1/stats", None), ("GET", "/metrics", None)]:
            kw = {} if body is None else {"body": body}
            r = c.request(method, path, **kw)
            match_detail(r, 401, "Invalid or missing bearer token")
            assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), r.headers
    r = anon.request("POST", "/keys/batch_exists", {"keys": ["a"]}, headers={"Authorization": "Basic czNjcmV0"})
    match_detail(r, 401, "Invalid or missing bearer token")
    r = anon.request("POST", "/keys/batch_exists", {"keys": ["a"]}, headers={"Authorization": "Bearer s3cret2"})
    match_detail(r, 401, "Invalid or missing bearer token")
    r = anon.request("POST", "/keys/batch_exists", {"keys": ["a"]}, headers={"Authorization": "Bearer "})
    match_detail(r, 401, "Invalid or missing bearer token")
    assert srv.stats()["namespaces"] == before
    # /healthz needs no token
    r = anon.get("/healthz")
    assert r.status_code == 200 and r.text.strip() == "ok"
    assert good.v_exists(["a"]) == [True]
    r = good.get("/metrics")
    assert r.status_code == 200


def test_token_from_environment(start_server):
    srv = start_server(env={"KVPAGE_TOKEN": "envtok"})
    anon = srv.client(token=None)
    r = anon.post("/keys/batch_exists", {"keys": ["a"]})
    match_detail(r, 401, "Invalid or missing bearer token")
    good = srv.client(token="envtok")
    r = good.post("/keys/batch_exists", {"keys": ["a"]})
    expect(r, 200)
    assert r.json() == {"exists": [False]}
    assert anon.get("/healthz").status_code == 200


def test_allow_refuses_other_addresses(start_server):
    srv = start_server("--allow", "10.0.0.0/8")
    c = srv.client()
    for method, path, body in [("POST", "/keys/batch_exists", {"keys": []}),
                               ("POST", "/rank/0/initialize", {"num_pages": 2}),
                               ("POST", "/0/initialize", {"num_pages": 2}),
                               ("GET", "/v1/stats", None)]:
        kw = {} if body is None else {"body": body}
        r = c.request(method, path, **kw)
        match_detail(r, 403, "Client address not allowed")


def test_allow_single_host_elsewhere(start_server):
    srv = start_server("--allow", "127.0.0.2/32")
    r = srv.client().post("/keys/batch_exists", {"keys": []})
    match_detail(r, 403, "Client address not allowed")


def test_allow_loopback(start_server):
    srv = start_server("--allow", "127.0.0.0/8")
    c = srv.client()
    r = c.post("/keys/batch_exists", {"keys": ["a"]})
    expect(r, 200)
    assert r.json() == {"exists": [False]}
    c.v_init(0, 2)
    assert rank_stats(srv.stats(), 0)["num_pages"] == 2


def test_allow_repeatable(start_server):
    srv = start_server("--allow", "10.0.0.0/8", "--allow", "127.0.0.1/32")
    r = srv.client().post("/keys/batch_exists", {"keys": ["a"]})
    expect(r, 200)
    assert r.json() == {"exists": [False]}


# ---- never 500 ------------------------------------------------------------------

def test_never_500_on_garbage(start_server):
    srv = start_server()
    c = srv.client()
    c.v_init(0, 4)
    c.v_write(0, ["a"])
    bodies = [None, Raw(""), Raw(" "), Raw("{"), Raw("}"), Raw("[]"), Raw('{"a":'), Raw("\x00"),
              Raw(b"\xff\xfe\xfd"), Raw('{"rank": {}, "keys": {"a": 1}}'), {"keys": [[[]]]},
              {"rank": 0, "keys": [[["a"], [""]]]}, {"rank": 0, "confirmations": [[["a"], 0]]},
              {"rank": 0, "confirmations": [["a", 0, 0]], "pages_to_release": [[0]]},
              {"keys": None, "namespace": None, "num_pages": None, "role": None, "rank": None},
              {"rank": -0, "keys": [], "num_pages": 1e300}, Raw('{"num_pages": 1e400}'),
              Raw('{"rank": -9223372036854775809, "keys": []}'), Raw('{"rank": 9223372036854775807, "keys": []}'),
              Raw('{"rank": 0, "keys": ["\\ud800"]}'), Raw('{"keys": ["\\u0000"]}'),
              Raw('{"rank": 0, "confirmations": [["b", 9223372036854775807]]}'),
              Raw('{"rank": 0, "confirmations": [], "pages_to_release": [-9223372036854775808]}'),
              Raw('{"rank":0,"rank":1,"keys":[]}'),
              Raw("[" * 5000), Raw('{"keys": "' + "x" * 100000 + '"}')]
    routes = POST_ROUTES + ["/ns/x/keys/batch_exists", "/1/exists", "/rank/1/initialize"]
    for route in routes:
        for body in bodies:
            kw = {} if body is None else {"body": body}
            r = c.post(route, **kw)
            assert r.status_code < 500, (route, body.data[:80] if isinstance(body, Raw) else body, r.status_code,
                                         r.text[:200])
            if r.status_code >= 400:
                assert set(r.json()) == {"detail"}, r.text[:200]
    invariants(srv.stats())


# ---- HTTP/1.1 framing -------------------------------------------------------------

def _chunks(data, size=7):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def test_chunked_request_body(start_server):
    srv = start_server("--max-body", "1000")
    c = srv.client()
    c.v_init(0, 4)
    body = json.dumps({"rank": 0, "keys": [["a", ""], ["b", ""]]}).encode()
    r = c.s.post(srv.url("/keys/batch_allocate"), data=_chunks(body), timeout=20,
                 headers={"Content-Type": "application/json"})
    assert "chunked" in r.request.headers.get("Transfer-Encoding", "")
    expect(r, 200)
    assert r.json() == {"rank": 0, "results": [["a", 0], ["b", 1]]}
    before = srv.stats()["namespaces"]
    big = _padded({"rank": 0, "keys": [["c", ""]]}, 3000).data
    r = c.s.post(srv.url("/keys/batch_allocate"), data=_chunks(big, 100), timeout=20)
    match_detail(r, 413, "Request body too large: limit is 1000 bytes")
    assert srv.stats()["namespaces"] == before
