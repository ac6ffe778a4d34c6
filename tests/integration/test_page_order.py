"""Page numbers on each dialect's routes come in its reference's order
(docs/protocol-notes.md, "The order of free pages"; issue 35): SGLang's
routes the highest free page first and freed pages last-in first-out,
vLLM's the lowest first and freed pages last, in release order; with
--read-grace-ms 0 eviction takes the pages SGLang's reference takes. The
expected numbers come by hand from the references' code and, in the random
runs, from the stand-ins of refservers.py (which record the references'
commits). Runs on the in-process backend and, with KVPAGE_TEST_BACKEND=redis,
on Redis."""
import random

import redisfix
from kvptest import counts, invariants
from refservers import SglangRank, VllmState


def _grace0(start_server, *flags):
    srv = start_server("--read-grace-ms", "0", *flags)
    return srv, srv.client()


def test_sglang_fresh_rank_highest_first_and_freed_lifo(start_server):
    srv, c = _grace0(start_server)
    c.s_init(0, 8)
    assert c.s_write(0, ["a", "b", "c", "d"]) == [7, 6, 5, 4]
    c.s_delete(0, ["b"])
    c.s_delete(0, ["d"])
    # the latest freed first (4, then 6), then the highest never used
    assert c.s_reserve(0, ["e", "f", "g"]) == [(False, 4), (False, 6), (False, 3)]
    # released reservations are freed pages like any other: g's 3, then e's 4
    c.s_confirm(0, [["f", 6]], [3, 4])
    assert c.s_reserve(0, ["h", "i", "j"]) == [(False, 4), (False, 3), (False, 2)]
    invariants(srv.stats())


def test_sglang_eviction_takes_the_least_recently_used(start_server):
    srv, c = _grace0(start_server)
    ref = SglangRank(4)
    c.s_init(0, 4)
    keys = ["a", "b", "c", "d"]
    got = c.s_reserve(0, keys)
    assert got == ref.reserve(keys) == [(False, 3), (False, 2), (False, 1), (False, 0)]
    written = [[k, p] for k, (_, p) in zip(keys, got)]
    c.s_confirm(0, written)
    ref.confirm(written)
    # b looked up, c hit by an allocation: the LRU order is now a, d, b, c
    assert c.s_get(0, ["b"]) == ref.get(["b"]) == [2]
    assert c.s_reserve(0, ["c"]) == ref.reserve(["c"]) == [(True, 1)]
    # full: new keys take the pages of a, then d, then b
    assert c.s_reserve(0, ["x", "y"]) == ref.reserve(["x", "y"]) == [(False, 3), (False, 0)]
    assert c.s_exists(0, keys) == ref.exists(keys) == [False, True, True, False]
    c.s_confirm(0, [["x", 3]], [0])
    ref.confirm([["x", 3]], [0])
    # y's released page is free again: it comes before any eviction
    assert c.s_reserve(0, ["z", "w"]) == ref.reserve(["z", "w"]) == [(False, 0), (False, 2)]
    assert c.s_exists(0, ["b", "c"]) == [False, True]
    invariants(srv.stats())


def test_vllm_fresh_rank_lowest_first_and_freed_reused_last(start_server):
    srv, c = _grace0(start_server)
    ref = VllmState()
    c.v_init(0, 6)
    ref.init(0, 6)
    assert c.v_alloc(0, ["a", "b", "c"]) == ref.alloc(0, ["a", "b", "c"]) == [0, 1, 2]
    c.v_confirm(0, [["a", 0]], [2, 1])
    ref.confirm(0, [["a", 0]], [2, 1])
    # never-used pages first, then the freed ones in the order they were freed
    assert c.v_alloc(0, ["d", "e", "f"]) == ref.alloc(0, ["d", "e", "f"]) == [3, 4, 5]
    c.v_confirm(0, [], [4])
    ref.confirm(0, [], [4])
    assert c.v_alloc(0, ["g", "h", "i"]) == ref.alloc(0, ["g", "h", "i"]) == [2, 1, 4]
    invariants(srv.stats())


def test_vllm_eviction_when_full(start_server):
    """vLLM's reference has no eviction (a full rank answers -1); kvpage
    evicts the least recently used page as on SGLang's routes."""
    srv, c = _grace0(start_server)
    c.v_init(0, 3)
    assert c.v_write(0, ["a", "b", "c"]) == [0, 1, 2]
    assert c.v_loc(0, ["a"]) == [0]  # b is now the least recently used
    assert c.v_alloc(0, ["d", "e"]) == [1, 2]
    assert c.v_exists(["a", "b", "c"]) == [True, False, False]


def test_both_dialects_take_from_the_two_ends_of_one_list(start_server):
    srv, c = _grace0(start_server)
    c.v_init(0, 8)
    assert c.v_alloc(0, ["a"]) == [0]
    assert c.s_reserve(0, ["b"]) == [(False, 7)]
    assert c.v_alloc(0, ["c"]) == [1]
    assert c.s_reserve(0, ["d"]) == [(False, 6)]
    c.v_confirm(0, [], [0, 7, 1, 6])  # the list: 2 3 4 5 0 7 1 6
    assert c.v_alloc(0, ["e"]) == [2]
    assert c.s_reserve(0, ["f", "g"]) == [(False, 6), (False, 1)]
    assert c.v_alloc(0, ["h", "i", "j", "k"]) == [3, 4, 5, 0]
    assert c.s_reserve(0, ["l"]) == [(False, 7)]
    st = invariants(srv.stats())
    assert counts(st, 0) == (8, 0, 8, 0)


def test_sglang_matches_its_reference_step_by_step(start_server):
    """A random run of the operations whose page numbers the reference
    defines alike (new keys reserved then confirmed or released, deletes,
    single-key lookups and hits, exists), compared answer by answer."""
    srv, c = _grace0(start_server)
    rng = random.Random(35)
    ref = SglangRank(8)
    c.s_init(0, 8)
    names = [f"k{i}" for i in range(24)]
    for step in range(300):
        op = rng.random()
        held = list(ref.lru)
        if op < 0.45:
            k = rng.randint(1, 3)
            new = [n for n in names if n not in ref.lru]
            if len(ref.free) + len(ref.lru) < k:
                continue
            keys = rng.sample(new, k)
            got = c.s_reserve(0, keys)
            assert got == ref.reserve(keys), (step, keys)
            written = [[n, p] for n, (_, p) in zip(keys, got) if rng.random() < 0.7]
            release = [p for n, (_, p) in zip(keys, got) if [n, p] not in written]
            c.s_confirm(0, written, release)
            ref.confirm(written, release)
        elif op < 0.6 and held:
            keys = rng.sample(held, min(len(held), rng.randint(1, 2))) + ["nope"]
            c.s_delete(0, keys)
            ref.delete(keys)
        elif op < 0.75 and held:
            key = rng.choice(held)
            assert c.s_get(0, [key]) == ref.get([key]), step
        elif op < 0.9 and held:
            key = rng.choice(held)
            assert c.s_reserve(0, [key]) == ref.reserve([key]), step
        else:
            keys = rng.sample(names, 4)
            assert c.s_exists(0, keys) == ref.exists(keys), step
    invariants(srv.stats())


def test_vllm_matches_its_reference_step_by_step(start_server):
    """Allocations of new keys while the free pages suffice (the reference
    has no eviction and answers -1 for the whole batch otherwise), each
    confirmed or released, compared answer by answer."""
    srv, c = _grace0(start_server)
    rng = random.Random(35)
    ref = VllmState()
    c.v_init(0, 16)
    ref.init(0, 16)
    names = [f"k{i}" for i in range(200)]
    n_new = 0
    for step in range(200):
        k = rng.randint(1, 3)
        if len(ref.free[0]) < k:
            break
        keys = names[n_new:n_new + k]
        n_new += k
        got = c.v_alloc(0, keys)
        assert got == ref.alloc(0, keys), step
        confs = [[n, p] for n, p in zip(keys, got) if rng.random() < 0.3]
        release = [p for n, p in zip(keys, got) if [n, p] not in confs]
        rng.shuffle(release)
        c.v_confirm(0, confs, release)
        ref.confirm(0, confs, release)
        if confs:
            assert c.v_loc(0, [confs[0][0]]) == ref.locations(0, [confs[0][0]])
    assert step > 20
    invariants(srv.stats())


def test_order_after_a_restart(start_server, tmp_path):
    """In process (--data-dir) a restart forgets the release order: every
    FREE page counts as never used. With the state in Redis, the order is
    Redis's and a restart of the server keeps it."""
    redis = redisfix.BACKEND == "redis"
    flags = ["--meta", redisfix.fresh_location()] if redis else ["--data-dir", str(tmp_path / "d")]
    srv, c = _grace0(start_server, *flags)
    c.s_init(0, 8)
    assert c.s_write(0, ["a", "b", "c", "d"]) == [7, 6, 5, 4]
    c.s_delete(0, ["a"])
    c.s_delete(0, ["d"])  # SGLang's next: 4, 7, 3
    c.v_init(1, 8)
    assert c.v_write(1, ["va", "vb", "vc", "vd"]) == [0, 1, 2, 3]
    c.v_delete(["vb"])
    c.v_delete(["vd"])  # vLLM's next: 4, 5, 6
    srv.stop()
    srv, c = _grace0(start_server, *flags)
    assert c.s_get(0, ["b", "c"]) == [6, 5]
    if redis:
        assert c.s_reserve(0, ["e", "f", "g"]) == [(False, 4), (False, 7), (False, 3)]
        assert c.v_alloc(1, ["ve", "vf", "vg"]) == [4, 5, 6]
    else:
        assert c.s_reserve(0, ["e", "f", "g"]) == [(False, 7), (False, 4), (False, 3)]
        assert c.v_alloc(1, ["ve", "vf", "vg"]) == [1, 3, 4]
    invariants(srv.stats())
