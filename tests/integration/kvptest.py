"""Helpers shared by the integration tests: a thin HTTP client for both
dialects, /v1/stats readers and the invariant check of protocol.md §1.

Everything here talks to a real `kvpage serve` over loopback; nothing needs
/work/shared at run time.
"""
import json

import requests

TIMEOUT = 20  # seconds per request; the ASan build is slow, never hang a test

_NOBODY = object()


class Raw:
    """A request body sent byte for byte (malformed JSON, odd numbers)."""

    def __init__(self, data):
        self.data = data.encode() if isinstance(data, str) else data


def session(token=None):
    """A keep-alive requests.Session that ignores proxy variables."""
    s = requests.Session()
    s.trust_env = False
    if token is not None:
        s.headers["Authorization"] = "Bearer " + token
    return s


def encode(body):
    if isinstance(body, Raw):
        return body.data
    return json.dumps(body).encode()


class Client:
    """HTTP client bound to a base URL (`http://127.0.0.1:P` or `.../ns/NAME`)."""

    def __init__(self, base, token=None):
        self.base = base.rstrip("/")
        self.s = session(token)

    def request(self, method, path, body=_NOBODY, headers=None, content_type=True):
        hdrs = dict(headers or {})
        data = None
        if body is not _NOBODY:
            data = encode(body)
            if content_type:
                hdrs.setdefault("Content-Type", "application/json")
        return self.s.request(method, self.base + path, data=data, headers=hdrs, timeout=TIMEOUT)

    def post(self, path, body=_NOBODY, **kw):
        return self.request("POST", path, body, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def close(self):
        self.s.close()

    # ---- vLLM dialect ------------------------------------------------------
    def v_init(self, rank, num_pages, role=None):
        body = {"num_pages": num_pages}
        if role is not None:
            body["role"] = role
        r = self.post(f"/rank/{rank}/initialize", body)
        expect(r, 200)
        return r.json()

    def v_alloc(self, rank, keys):
        """keys: bare strings or [key, prefix]; returns the list of pages."""
        elems = [k if isinstance(k, (list, tuple)) else [k, ""] for k in keys]
        r = self.post("/keys/batch_allocate", {"rank": rank, "keys": elems})
        expect(r, 200)
        j = r.json()
        assert j["rank"] == rank, j
        assert len(j["results"]) == len(keys), j
        for (k, _), (rk, _) in zip(elems, j["results"]):
            assert rk == k, j
        return [p for _, p in j["results"]]

    def v_confirm(self, rank, confirmations=(), release=None):
        body = {"rank": rank, "confirmations": [list(c) for c in confirmations]}
        if release is not None:
            body["pages_to_release"] = list(release)
        r = self.post("/keys/confirm_write", body)
        expect(r, 204)
        assert r.content == b"", r.content
        return r

    def v_exists(self, keys):
        r = self.post("/keys/batch_exists", {"keys": list(keys)})
        expect(r, 200)
        return r.json()["exists"]

    def v_loc(self, rank, keys):
        r = self.post("/keys/get_locations", {"rank": rank, "keys": list(keys)})
        expect(r, 200)
        return r.json()["locations"]

    def v_clear(self):
        r = self.post("/clear")
        expect(r, 204)

    def v_delete(self, keys):
        r = self.post("/keys/delete", {"keys": list(keys)})
        expect(r, 204)

    def v_write(self, rank, keys):
        """Allocate and confirm keys on one rank (a whole save); returns pages."""
        pages = self.v_alloc(rank, keys)
        assert all(p >= 0 for p in pages), pages
        self.v_confirm(rank, list(zip(keys, pages)))
        return pages

    # ---- SGLang dialect ----------------------------------------------------
    @staticmethod
    def _ns(body, ns):
        if ns is not None:
            body["namespace"] = ns
        return body

    def s_init(self, rank, num_pages, ns=None):
        r = self.post(f"/{rank}/initialize", self._ns({"num_pages": num_pages}, ns))
        expect(r, 204)
        assert r.content == b""

    def s_reserve(self, rank, keys, ns=None):
        elems = [k if isinstance(k, (list, tuple)) else [k, ""] for k in keys]
        r = self.post(f"/{rank}/reserve_and_allocate_page_indices",
                      self._ns({"keys": elems}, ns))
        expect(r, 200)
        idx = r.json()["indices"]
        assert len(idx) == len(keys), idx
        return [tuple(x) for x in idx]

    def s_confirm(self, rank, written=(), release=None, ns=None):
        body = {"written_keys_to_confirm": [list(c) for c in written]}
        if release is not None:
            body["pages_to_release"] = list(release)
        r = self.post(f"/{rank}/confirm_write", self._ns(body, ns))
        expect(r, 204)
        assert r.content == b""

    def s_exists(self, rank, keys, ns=None):
        r = self.post(f"/{rank}/exists", self._ns({"keys": list(keys)}, ns))
        expect(r, 200)
        return r.json()["exists"]

    def s_get(self, rank, keys, ns=None):
        r = self.post(f"/{rank}/get_page_indices", self._ns({"keys": list(keys)}, ns))
        expect(r, 200)
        return r.json()["indices"]

    def s_delete(self, rank, keys, ns=None):
        r = self.post(f"/{rank}/delete_keys", self._ns({"keys": list(keys)}, ns))
        expect(r, 204)

    def s_clear(self, rank, ns=None):
        r = self.post(f"/{rank}/clear", self._ns({}, ns))
        expect(r, 204)

    def s_write(self, rank, keys, ns=None):
        idx = self.s_reserve(rank, keys, ns)
        pages = [p for _, p in idx]
        assert all(p >= 0 for p in pages), idx
        self.s_confirm(rank, list(zip(keys, pages)), ns=ns)
        return pages


def expect(r, status, detail=None):
    """Asserts the status (and, when given, the exact error detail)."""
    assert r.status_code == status, (
        f"{r.request.method} {r.request.url}: expected {status}, got {r.status_code}: {r.text[:500]!r}")
    if detail is not None:
        assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
        assert r.json() == {"detail": detail}, r.text[:500]
    return r


# ---- /v1/stats -------------------------------------------------------------

RANK_FIELDS = ("rank", "num_pages", "free", "reserved", "held", "keys", "hits", "misses",
               "allocations", "evictions", "expired_reservations", "release_of_held_page")


def stats(base, token=None):
    """GET {base}/v1/stats as JSON (base is the server's root URL)."""
    s = session(token)
    try:
        r = s.get(base.rstrip("/") + "/v1/stats", timeout=TIMEOUT)
    finally:
        s.close()
    assert r.status_code == 200, (r.status_code, r.text[:500])
    return r.json()


def namespaces(st):
    """The state part of a stats document, comparable across requests (the
    `requests` counters change with every request, the namespaces do not)."""
    return st["namespaces"]


def rank_stats(st, rank, deployment="default", pool="kv"):
    for ns in st["namespaces"]:
        if ns["deployment"] == deployment and ns["pool"] == pool:
            for r in ns["ranks"]:
                if r["rank"] == rank:
                    return r
    raise AssertionError(f"no rank {rank} in namespace ({deployment}, {pool}): {st['namespaces']}")


def has_rank(st, rank, deployment="default", pool="kv"):
    try:
        rank_stats(st, rank, deployment, pool)
        return True
    except AssertionError:
        return False


def invariants(st):
    """protocol.md §1 invariants as far as /v1/stats shows them."""
    assert isinstance(st.get("namespaces"), list), st
    for ns in st["namespaces"]:
        assert isinstance(ns["deployment"], str) and isinstance(ns["pool"], str), ns
        seen = set()
        for r in ns["ranks"]:
            for f in RANK_FIELDS:
                v = r[f]
                assert isinstance(v, int) and not isinstance(v, bool), (f, r)
                assert v >= 0, (f, r)
            assert r["rank"] not in seen, ns
            seen.add(r["rank"])
            assert r["free"] + r["reserved"] + r["held"] == r["num_pages"], (ns["deployment"], ns["pool"], r)
            assert r["keys"] == r["held"], (ns["deployment"], ns["pool"], r)
    return st


def counts(st, rank, deployment="default", pool="kv"):
    """(num_pages, free, reserved, held) of one rank."""
    r = rank_stats(st, rank, deployment, pool)
    return (r["num_pages"], r["free"], r["reserved"], r["held"])


def every_route_unavailable(c, name=None):
    """Every route that needs the state answers 503 `Service unavailable:
    ...` within 15 s (never a hang, never a 500), naming `name` if given;
    /v1/stats too."""
    import time
    for path, body in (("/keys/batch_exists", {"keys": ["x"]}),
                       ("/keys/batch_allocate", {"rank": 0, "keys": [["y", ""]]}),
                       ("/keys/get_locations", {"rank": 0, "keys": ["x"]}),
                       ("/0/exists", {"keys": ["x"]}),
                       ("/rank/1/initialize", {"num_pages": 4})):
        t0 = time.monotonic()
        resp = c.post(path, body)
        assert time.monotonic() - t0 < 15, f"{path} hung"
        expect(resp, 503)
        detail = resp.json()["detail"]
        assert detail.startswith("Service unavailable: "), detail
        assert name is None or name in detail, detail
    resp = c.get("/v1/stats")
    assert resp.status_code == 503, resp.text


def vllm_hash(key):
    """vLLM's block hash of a hex key (maybe_convert_block_hash): its last 8
    bytes, the last 16 hex digits, as a uint64."""
    return int(key[-16:], 16)


def sglang_hash(key):
    """SGLang's hash_str_to_int64 of a hex key: the first 16 hex digits as a
    signed int64."""
    v = int(key[:16], 16)
    return v - (1 << 64) if v >= 1 << 63 else v
