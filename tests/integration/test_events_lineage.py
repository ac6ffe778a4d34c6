"""kvpage serve --kv-events: the parent and tokens a confirmation names are
kept with the page (protocol-notes, "Parents and token ids in
confirmations"), so that a replay from 0 (the inventory, which llm-d and
Dynamo ask for when they connect) and a restarted server's inventory carry
each page's parent_block_hash and token_ids as the live events did.

In-process backend only (mem: and --data-dir): there the latest
confirmation of a key that names a lineage wins on every rank, where Redis
keeps one per rank, the first (test_kv_events.py checks the inventory over
both).
"""
import signal

import pytest

import redisfix
from kvpserver import free_port, launch
from kvptest import vllm_hash
from test_kv_events import (Consumer, chains, consumers, hexkey, ports, start_events,  # noqa: F401
                            stored_events)

pytestmark = pytest.mark.skipif(redisfix.BACKEND == "redis",
                                reason="the in-process backend's rules (Redis keeps them per rank)")


def confirm(c, rank, keys, **extra):
    pages = c.v_alloc(rank, keys)
    r = c.post("/keys/confirm_write", {"rank": rank,
                                       "confirmations": list(map(list, zip(keys, pages))), **extra})
    assert r.status_code == 204, r.text


def write_lineages(c, base):
    """Pages with and without lineages on ranks 0 and 1; what a subscriber
    must know of each: {hash: (parent hash, tokens or None)}."""
    c.v_init(0, 32)
    c.v_init(1, 32)
    prefix = hexkey(base)
    chain = [hexkey(base + 0x100 + i) for i in range(4)]
    toks = [list(range(1000 * i, 1000 * i + 4)) for i in range(4)]
    confirm(c, 0, chain, prefix_key=prefix, token_ids=toks)
    other = [hexkey(base + 0x200 + i) for i in range(2)]
    confirm(c, 0, other, parent_keys=[chain[1], None])
    plain = [hexkey(base + 0x300 + i) for i in range(2)]
    c.v_write(0, plain)
    # Rank 1 confirms chain[0] with another lineage: the latest wins, for
    # the key on every rank.
    confirm(c, 1, chain[:1], parent_keys=[other[0]], token_ids=[[7, 7, 7, 7]])
    h = vllm_hash
    want = {h(k): (p, t) for k, p, t in zip(chain, [h(prefix)] + [h(k) for k in chain[:-1]], toks)}
    want[h(chain[0])] = (h(other[0]), [7, 7, 7, 7])
    want[h(other[0])] = (h(chain[1]), None)
    want[h(other[1])] = (None, None)
    for k in plain:
        want[h(k)] = (None, None)
    held = {0: {h(k) for k in chain + other + plain}, 1: {h(chain[0])}}
    return want, held


def inventory(rep):
    """A subscriber that connects late: replays from 0 (the inventory). The
    pages it holds, and the lineage of those that have one (a run of pages
    without one is one event, as a live confirmation of them is: a consumer
    reads each page after the first as the child of the one before)."""
    late = Consumer(f"tcp://127.0.0.1:{free_port()}", rep)
    try:
        late.replay(0)
        return {r: h for r, h in late.held.items() if h}, chains(stored_events(late))
    finally:
        late.close()


def check_lineages(got, want):
    assert set(got) == set(want)
    assert {h: v for h, v in got.items() if want[h] != (None, None)} == \
        {h: v for h, v in want.items() if v != (None, None)}
    for h, v in want.items():
        if v == (None, None):
            assert got[h][1] is None, (h, got[h])


def test_replay_from_zero_carries_lineage(start_server, consumers):  # noqa: F811
    srv, cons, c = start_events(start_server, consumers, "block_size=16")
    want, held = write_lineages(c, 0x5100)
    cons.wait_for(held)
    got_held, got = inventory(cons.replay_endpoint)
    assert got_held == held
    check_lineages(got, want)
    # A delete drops the lineage with the key: stored again without one, the
    # inventory has none for it.
    key = hexkey(0x5100 + 0x101)  # the chain's second, held on rank 0 only
    c.v_delete([key])
    c.v_write(0, [key])
    want[vllm_hash(key)] = (None, None)
    cons.wait_for(held)
    got_held, got = inventory(cons.replay_endpoint)
    check_lineages(got, want)
    assert got[vllm_hash(key)][0] != vllm_hash(hexkey(0x5200))  # not its old parent


@pytest.mark.parametrize("stop_sig", [signal.SIGTERM, signal.SIGKILL])
def test_lineage_survives_restart(tmp_path, stop_sig):
    """The same data directory, after a clean stop (the snapshot) or a
    crash (the log): the inventory's events carry the lineages."""
    data = tmp_path / "state"
    p1, p2 = ports()
    spec = f"endpoint=tcp://127.0.0.1:{p1},replay_endpoint=tcp://127.0.0.1:{p2}"
    srv = launch(tmp_path, ["--data-dir", str(data), "--kv-events", spec])
    c = srv.client()
    want, held = write_lineages(c, 0x5200)
    c.close()
    check_lineages(inventory(f"tcp://127.0.0.1:{p2}")[1], want)
    rc = srv.stop(stop_sig)
    if stop_sig == signal.SIGTERM:
        srv.assert_clean_exit(rc)
    srv = launch(tmp_path, ["--data-dir", str(data), "--kv-events", spec])
    try:
        got_held, got = inventory(f"tcp://127.0.0.1:{p2}")
        assert got_held == held
        check_lineages(got, want)
    finally:
        srv.assert_clean_exit(srv.stop(signal.SIGTERM))
