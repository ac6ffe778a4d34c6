"""Keep-alive concurrency: 8 threads, each with its own connection, send a
few hundred mixed requests of both dialects on two ranks, with shared keys
(racing writers) and private keys. Afterwards the invariants hold, nothing
is left RESERVED, and every confirmed key is found on its rank. Run in memory
with 1 and 4 HTTP threads, and with a data directory and group commit (the
replies that change state park until the log's flusher has synced them)."""
import random
import threading

import pytest

from kvptest import Client, counts, invariants

THREADS = 8
ROUNDS = 40  # each round is ~8 requests: ~2600 requests in all
NUM_PAGES = 1024  # more than all keys (8*40*2 + 10): no eviction, every key must stay


def worker(base, tid, confirmed, errors, barrier):
    rnd = random.Random(tid)
    c = Client(base)
    try:
        barrier.wait()
        for i in range(ROUNDS):
            # a batch of 2 private keys and 2 shared keys (raced by all threads)
            keys = [f"t{tid}-{i}-a", f"t{tid}-{i}-b", f"shared-{i % 10}", f"shared-{(i * 7) % 10}"]
            rnd.shuffle(keys)
            for rank in (0, 1):
                if rnd.random() < 0.5:
                    r = c.post("/keys/batch_allocate", {"rank": rank, "keys": [[k, ""] for k in keys]})
                    assert r.status_code == 200, r.text
                    res = r.json()["results"]
                    assert [k for k, _ in res] == keys
                    pages = [p for _, p in res]
                else:
                    r = c.post(f"/{rank}/reserve_and_allocate_page_indices", {"keys": keys})
                    assert r.status_code == 200, r.text
                    pages = [p for _, p in r.json()["indices"]]
                assert all(0 <= p < NUM_PAGES for p in pages), pages
                # the same key in one batch gets the same page
                by_key = {}
                for k, p in zip(keys, pages):
                    assert by_key.setdefault(k, p) == p, (keys, pages)
                # sometimes a write fails: release instead of confirming
                if rnd.random() < 0.15:
                    victim = keys[0]
                    conf = [[k, p] for k, p in by_key.items() if k != victim]
                    rel = [by_key[victim]]
                else:
                    conf = [[k, p] for k, p in by_key.items()]
                    rel = []
                if rnd.random() < 0.5:
                    r = c.post("/keys/confirm_write", {"rank": rank, "confirmations": conf, "pages_to_release": rel})
                else:
                    r = c.post(f"/{rank}/confirm_write", {"written_keys_to_confirm": conf, "pages_to_release": rel})
                assert r.status_code == 204, r.text
                for k, _ in conf:
                    confirmed[rank].add(k)
            r = c.post("/keys/batch_exists", {"keys": keys})
            assert r.status_code == 200, r.text
            r = c.post("/keys/get_locations", {"rank": rnd.choice((0, 1)), "keys": keys})
            assert r.status_code == 200, r.text
            r = c.post(f"/{rnd.choice((0, 1))}/get_page_indices", {"keys": keys})
            assert r.status_code == 200, r.text
            # an error now and then must not disturb anything
            if i % 9 == 0:
                r = c.post("/keys/confirm_write", {"rank": 0, "confirmations": [["x", NUM_PAGES]]})
                assert r.status_code == 400, r.text
                r = c.post("/keys/batch_allocate", {"rank": 5, "keys": ["x"]})
                assert r.status_code == 404, r.text
            if i % 5 == 0:
                r = c.get("/v1/stats")
                assert r.status_code == 200
                invariants(r.json())
    except BaseException as e:  # reported by the main thread
        errors.append(f"thread {tid}: {e!r}")
    finally:
        c.close()


@pytest.mark.parametrize("server_flags", [
    ("--threads", "1"),
    ("--threads", "4"),
    # Replies parked until the log is durable, resumed from its flusher
    # thread, while 4 HTTP threads serve (test_crash.py covers snapshots).
    ("--threads", "4", "--fsync", "batch"),
], ids=["1", "4", "4-batch"])
def test_keepalive_concurrency(start_server, tmp_path, server_flags):
    flags = list(server_flags)
    if "--fsync" in flags:
        flags += ["--data-dir", str(tmp_path / "data")]
    server = start_server(*flags)
    c = server.client()
    c.v_init(0, NUM_PAGES)
    c.s_init(1, NUM_PAGES)
    confirmed = {0: set(), 1: set()}
    errors = []
    barrier = threading.Barrier(THREADS)
    threads = [threading.Thread(target=worker, args=(server.base, t, confirmed, errors, barrier))
               for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert not errors, "\n".join(errors)

    st = invariants(server.stats())
    if "--fsync" in flags:
        assert st["wal"]["fsyncs"] > 0 and st["wal"]["snapshot_failures"] == 0, st["wal"]
    # every reservation was confirmed or released; every confirmed key holds
    # exactly one page per rank (racing writers left no leaked page)
    for rank in (0, 1):
        n, free, reserved, held = counts(st, rank)
        assert reserved == 0, (rank, counts(st, rank))
        assert held == len(confirmed[rank]), (rank, held, len(confirmed[rank]))
        assert free == NUM_PAGES - held
    # every key confirmed on both ranks is complete and found on each rank
    both = sorted(confirmed[0] & confirmed[1])
    assert both
    assert c.v_exists(both) == [True] * len(both)
    for rank in (0, 1):
        locs = c.v_loc(rank, both)
        assert None not in locs
        assert len(set(locs)) == len(locs), "two keys share a page"
        keys = sorted(confirmed[rank])
        idx = c.s_get(rank, keys)
        assert None not in idx
        assert len(set(idx)) == len(idx)
    c.close()
