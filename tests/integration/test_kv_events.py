"""kvpage serve --kv-events: KV events in vLLM's wire format (protocol.md,
"KV events").

A subscriber built from Debian's python3-zmq and python3-msgpack reads them
as vLLM's consumers do (vLLM's examples/online_serving/kv_events_subscriber.py,
llm-d's indexer): a SUB socket taking (topic, 8-byte big-endian sequence
number, msgpack payload), a replay socket asked for the batches from a
sequence number on (from 0 when it connects) when it sees a gap. Its view of
what each rank holds is compared with what the server answers.
"""
import os
import signal
import subprocess
import time

import msgpack
import pytest
import zmq

import redisfix
from kvpserver import BIN, free_port, launch
from kvptest import sglang_hash, vllm_hash

END = (-1).to_bytes(8, "big", signed=True)


def hexkey(i, width=32):
    """A key as vLLM's connector makes them (hex), distinct per i."""
    return f"{i:0{width}x}"[-width:].rjust(width, "0")


class Consumer:
    """What a router keeps: the block hashes each rank holds."""

    def __init__(self, endpoint, replay_endpoint, topic="", bind=False):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        if bind:  # the server connects (vLLM's rule for an endpoint without '*')
            self.sub.bind(endpoint)
        else:
            self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.last_seq = -1
        self.held = {}  # rank -> set of block hashes
        self.events = []  # (seq, ts, event, rank), every one applied
        self.seqs = []  # live sequence numbers received
        self.replays = 0
        self.topics = set()  # the topics received (topic: a prefix, as ZeroMQ filters)

    def close(self):
        self.sub.close(0)
        self.ctx.term()

    def apply(self, seq, payload):
        batch = msgpack.unpackb(payload, raw=False)
        assert isinstance(batch, list) and len(batch) == 3, batch
        ts, events, rank = batch
        assert isinstance(ts, float) and abs(ts - time.time()) < 3600, ts
        held = self.held.setdefault(rank, set())
        for ev in events:
            self.events.append((seq, ts, ev, rank))
            kind = ev["type"] if isinstance(ev, dict) else ev[0]
            hashes = ev["block_hashes"] if isinstance(ev, dict) else ev[1]
            if kind == "BlockStored":
                held.update(hashes)
            elif kind == "BlockRemoved":
                held.difference_update(hashes)
            else:
                raise AssertionError(f"unexpected event {ev!r}")

    def replay(self, start):
        """Asks for the batches from start on; applies them up to (-1, b"")."""
        self.replays += 1
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(self.replay_endpoint)
        try:
            d.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                assert d.poll(30000), "no answer from the replay socket"
                empty, seq_b, payload = d.recv_multipart()
                assert empty == b""
                if seq_b == END:
                    assert payload == b""
                    return
                seq = int.from_bytes(seq_b, "big")
                self.apply(seq, payload)
                self.last_seq = max(self.last_seq, seq)
        finally:
            d.close(0)

    def pump(self, timeout=0.2):
        """Reads the live stream for up to timeout seconds of silence."""
        n = 0
        while self.sub.poll(int(timeout * 1000)):
            topic, seq_b, payload = self.sub.recv_multipart()
            assert topic.startswith(self.topic.encode()), topic
            self.topics.add(topic)
            assert len(seq_b) == 8
            seq = int.from_bytes(seq_b, "big")
            self.seqs.append(seq)
            if seq <= self.last_seq:
                continue  # known already, from a replay
            if self.last_seq >= 0 and seq > self.last_seq + 1:
                self.replay(self.last_seq + 1)  # a gap: as vLLM's consumers do
                if seq <= self.last_seq:
                    continue
            self.apply(seq, payload)
            self.last_seq = max(self.last_seq, seq)
            n += 1
            timeout = min(timeout, 0.2)
        return n

    def wait_for(self, want, timeout=30):
        """Pumps until held == want ({rank: set}); asserts it happens."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.2)
            got = {r: h for r, h in self.held.items() if h}
            if got == {r: h for r, h in want.items() if h}:
                return
        extra = {r: sorted(h - want.get(r, set()))[:5] for r, h in self.held.items()}
        missing = {r: sorted(h - self.held.get(r, set()))[:5] for r, h in want.items()}
        raise AssertionError(f"subscriber's view differs: extra {extra}, missing {missing} "
                             f"(first 5 of each), {self.replays} replays")


def ports():
    return free_port(), free_port()


def start_events(start_server, consumers, *fields, extra=()):
    """A server publishing to a subscriber that binds (the server connects),
    that subscriber, caught up from 0 as llm-d's indexer does, and a client."""
    p1, p2 = ports()
    ep, rep = f"tcp://127.0.0.1:{p1}", f"tcp://127.0.0.1:{p2}"
    cons = Consumer(ep, rep, topic="kv@kvpage@test", bind=True)
    spec = ",".join([f"endpoint={ep}", f"replay_endpoint={rep}", "topic=kv@kvpage@test"]
                    + list(fields))
    srv = start_server("--kv-events", spec, *extra)
    consumers.append(cons)
    cons.replay(0)
    sync(srv, cons)
    return srv, cons, srv.client()


def sync(srv, cons):
    """Waits until the subscription reaches the publisher (ZeroMQ's PUB drops
    what it sends before): a probe page in a namespace of its own, stored
    until the subscriber hears of it, then deleted."""
    c = srv.client("/ns/probe")
    c.v_init(99, 4)
    # Heard of a probe: rank 99 holds a page in its view (empty before: the
    # last sync cleared it). Not "pump read something": what it read may be
    # older batches queued while it did not read, and the probe's own batch
    # dropped at the high-water mark (failed 1 in 8 over Redis).
    assert not cons.held.get(99), cons.held
    for i in range(300):
        c.v_write(99, [hexkey(0xfeed00 + i)])
        cons.pump(0.1)
        if cons.held.get(99):
            break
    else:
        raise AssertionError("the subscriber never heard of the probe")
    c.v_clear()
    deadline = time.monotonic() + 30
    while cons.held.get(99) and time.monotonic() < deadline:
        cons.pump(0.1)
    assert not cons.held.get(99), cons.held
    cons.events.clear()
    c.close()


@pytest.fixture
def consumers():
    made = []
    yield made
    for c in made:
        c.close()


def test_confirm_and_delete(start_server, consumers):
    srv, cons, c = start_events(start_server, consumers)
    c.v_init(0, 8)
    c.v_init(1, 8)
    keys = [hexkey(0x1234567890abcdef0011223344556600 + i) for i in range(4)]
    c.v_write(0, keys)
    c.v_write(1, keys[:2])
    cons.wait_for({0: {vllm_hash(k) for k in keys}, 1: {vllm_hash(k) for k in keys[:2]}})
    stored = [e for _, _, e, _ in cons.events if e["type"] == "BlockStored"]
    # A confirmation's pages in its order, in one event as an engine sends
    # the pages of one request (unless the publisher took the queue half-way).
    assert sum((e["block_hashes"] for e in stored), []) == [
        vllm_hash(k) for k in keys + keys[:2]]
    assert 2 <= len(stored) <= 6
    for e in stored:  # vLLM's BlockStored, as a map tagged "type"
        assert set(e) == {"type", "block_hashes", "parent_block_hash", "token_ids",
                          "block_size", "lora_id", "medium", "lora_name"}, e
        assert e["parent_block_hash"] is None
        assert e["token_ids"] == [] and e["block_size"] == 16 and e["medium"] == "STORAGE"
        assert e["lora_id"] is None and e["lora_name"] is None
    c.v_delete(keys[:1])  # every rank
    cons.wait_for({0: {vllm_hash(k) for k in keys[1:]}, 1: {vllm_hash(keys[1])}})
    removed = [e for _, _, e, _ in cons.events if e["type"] == "BlockRemoved"]
    assert removed and all(set(e) == {"type", "block_hashes", "medium"} for e in removed)
    # Confirming a key again changes nothing and says nothing.
    n = len(cons.events)
    c.v_confirm(0, [(keys[1], c.v_loc(0, [keys[1]])[0])])
    cons.pump(0.5)
    assert len(cons.events) == n
    assert cons.seqs == sorted(cons.seqs) and len(set(cons.seqs)) == len(cons.seqs)
    assert cons.topics == {b"kv@kvpage@test"}


def test_eviction_and_clear(start_server, consumers):
    srv, cons, c = start_events(start_server, consumers)
    c.v_init(0, 4)
    keys = [hexkey(0xa000 + i) for i in range(6)]
    c.v_write(0, keys[:4])
    cons.wait_for({0: {vllm_hash(k) for k in keys[:4]}})
    c.v_write(0, keys[4:])  # evicts the two least recently used
    held = [k for k, e in zip(keys, c.v_exists(keys)) if e]
    assert len(held) == 4
    cons.wait_for({0: {vllm_hash(k) for k in held}})
    c.v_clear()
    cons.wait_for({0: set()})
    # Dropping a namespace removes its pages too.
    team = srv.client("/ns/team")
    team.v_init(1, 8)
    team.v_write(1, keys[:3])
    cons.wait_for({1: {vllm_hash(k) for k in keys[:3]}})
    assert team.post("/drop", {}).status_code == 204
    cons.wait_for({})
    team.close()
    kinds = {e["type"] for _, _, e, _ in cons.events}
    assert kinds == {"BlockStored", "BlockRemoved"}  # never AllBlocksCleared


def test_sglang_keys_array_format(start_server, consumers):
    srv, cons, c = start_events(start_server, consumers, "format=array", "medium=EXTERNAL",
                                "block_size=64")
    c.s_init(2, 8)
    keys = ["f" * 16 + hexkey(i, 48) for i in range(2)] + [hexkey(7, 64) + "-k"]
    c.s_write(2, keys)
    cons.wait_for({2: {sglang_hash(k) for k in keys}})
    assert sglang_hash(keys[0]) < 0  # a signed int64, as SGLang sends it
    for _, _, e, rank in cons.events:  # vLLM's positional arrays, tag first
        assert rank == 2
        assert e[0] == "BlockStored" and len(e) == 8, e
        assert e[2] is None and e[3] == [] and e[4] == 64 and e[6] == "EXTERNAL", e
    c.s_clear(2)
    cons.wait_for({2: set()})
    assert [e[0] for _, _, e, _ in cons.events].count("BlockRemoved") >= 1
    assert all(len(e) == 3 and e[2] == "EXTERNAL" for _, _, e, _ in cons.events
               if e[0] == "BlockRemoved")


@pytest.mark.parametrize("mode", ["auto", "vllm"])
def test_block_hash_rules(start_server, consumers, mode):
    srv, cons, c = start_events(start_server, consumers, f"hash={mode}")
    c.v_init(0, 16)
    sha = "9" + hexkey(0x5eed, 63)  # 64 digits: SGLang's page hash, or vLLM's block hash
    keys = {hexkey(0xabc, 32): vllm_hash(hexkey(0xabc, 32)),  # stock vLLM's md5 keys
            sha: sglang_hash(sha) if mode == "auto" else vllm_hash(sha),
            "tier0:" + hexkey(0xdef, 40): 0xdef,  # kvpage's vLLM tier: IDENTITY:HEX
            "plain key": None}  # XXH3-64 of the bytes
    c.v_write(0, list(keys))
    deadline = time.monotonic() + 30
    while len(cons.held.get(0, ())) < 4 and time.monotonic() < deadline:
        cons.pump(0.1)
    got = cons.held[0]
    want = {h for h in keys.values() if h is not None}
    assert want <= got and len(got) == 4, (got, want)
    other = (got - want).pop()
    assert 0 <= other < 2**64  # the plain key's XXH3-64, unsigned
    late = Consumer(f"tcp://127.0.0.1:{free_port()}", cons.replay_endpoint)
    consumers.append(late)
    late.replay(0)  # the inventory hashes the same way
    assert late.held[0] == got


def test_replay_from_zero_is_the_inventory(start_server, consumers):
    srv, cons, c = start_events(start_server, consumers, "buffer_steps=2")
    c.v_init(0, 64)
    keys = [hexkey(0xbeef00 + i) for i in range(40)]
    for i in range(0, 40, 4):  # ten batches, more than buffer_steps keeps
        c.v_write(0, keys[i:i + 4])
    c.v_delete(keys[:10])
    want = {0: {vllm_hash(k) for k in keys[10:]}}
    cons.wait_for(want)
    late = Consumer(f"tcp://127.0.0.1:{free_port()}", cons.replay_endpoint)
    consumers.append(late)
    late.replay(0)
    assert late.held == want
    assert {e["type"] for _, _, e, _ in late.events} == {"BlockStored"}
    # A start older than the batches kept is answered with the inventory too.
    again = Consumer(f"tcp://127.0.0.1:{free_port()}", cons.replay_endpoint)
    consumers.append(again)
    again.replay(1)
    assert again.held == want
    # A start within them: those batches, as vLLM answers.
    last = max(cons.seqs)
    tail = Consumer(f"tcp://127.0.0.1:{free_port()}", cons.replay_endpoint)
    consumers.append(tail)
    tail.replay(last)
    assert [s for s, _, _, _ in tail.events] and all(s == last for s, _, _, _ in tail.events)


def stop_run(srv, stop_sig, cons, consumers):
    """Stops a restart test's server (SIGTERM: a clean exit; else no
    sanitizer report) and its subscriber; the sequence numbers it heard."""
    rc = srv.stop(stop_sig)
    if stop_sig == signal.SIGTERM:
        srv.assert_clean_exit(rc)
    else:
        srv.assert_no_sanitizer_report()
    cons.close()
    consumers.remove(cons)
    return cons.seqs


def test_sequence_survives_restart(tmp_path, consumers):
    data = tmp_path / "state"
    p1, p2 = ports()
    ep, rep = f"tcp://127.0.0.1:{p1}", f"tcp://127.0.0.1:{p2}"
    spec = f"endpoint={ep},replay_endpoint={rep}"
    keys = [hexkey(0xc0de00 + i) for i in range(8)]

    def run(i, stop_sig, first=None):
        cons = Consumer(ep, rep, bind=True)
        consumers.append(cons)
        # launch, not start_server: a server killed on purpose is not a failure.
        srv = launch(tmp_path, ["--data-dir", str(data), "--kv-events", spec])
        cons.replay(0)
        sync(srv, cons)
        c = srv.client()
        c.v_init(0, 16)
        c.v_write(0, keys[2 * i:2 * i + 2])
        cons.wait_for({0: {vllm_hash(k) for k in keys[:2 * i + 2]}})
        if first is not None:  # the batches this server published, from its first on
            tail = Consumer(f"tcp://127.0.0.1:{free_port()}", rep)
            consumers.append(tail)
            tail.replay(first)
            assert tail.events and tail.events[0][0] == first, (first, tail.events[:1])
        c.close()
        return stop_run(srv, stop_sig, cons, consumers)

    s1 = run(0, signal.SIGTERM)
    # A clean stop: the numbers go on from the next one.
    assert (data / "kv-events.seq").read_text().strip() == str(max(s1) + 1)
    s2 = run(1, signal.SIGTERM, first=max(s1) + 1)
    s3 = run(2, signal.SIGKILL)
    s4 = run(3, signal.SIGTERM)  # after a crash: later, never reused
    assert min(s2) > max(s1) and min(s3) > max(s2) and min(s4) > max(s3), (s2, s3, s4)
    assert (data / "kv-events.seq").read_text().strip() == str(max(s4) + 1)


def test_slow_subscriber_does_not_block(start_server, consumers):
    # hwm=4: a subscriber that reads nothing fills its queue at once, and
    # the PUB socket drops the rest for it; the publisher's queue is small
    # too (a change waits for room, never for the subscriber). The
    # subscriber is caught up at the start, then reads nothing for a while.
    srv, cons, c = start_events(start_server, consumers, "hwm=4", "max_queue_size=64")
    c.v_init(0, 4096)
    keys = [hexkey(0xd00000 + i) for i in range(2000)]
    t0 = time.monotonic()
    slowest = 0
    for i in range(0, len(keys), 100):
        t = time.monotonic()
        c.v_write(0, keys[i:i + 100])
        slowest = max(slowest, time.monotonic() - t)
    total = time.monotonic() - t0
    assert slowest < 5 and total < 60, (slowest, total)
    c.v_delete(keys[:500])
    want = {vllm_hash(k) for k in keys[500:]}
    # The subscriber that fell behind recovers by replay, from the gaps it
    # sees once it reads again; a later batch shows the last gap (as it does
    # to vLLM's consumers: a gap is seen when the next number arrives). The
    # later batch is of the same rank: over Redis the ranks' changes are
    # published in no set order between them (a probe in another namespace
    # went out before this rank's last batches, which the high-water mark
    # then dropped, and nothing came after them). A marker at a time, since
    # a marker's batch may be dropped too.
    for i in range(300):
        marker = hexkey(0xd10000 + i)
        c.v_write(0, [marker])
        want.add(vllm_hash(marker))
        cons.pump(0.2)
        if cons.held.get(0) == want:
            break
    cons.wait_for({0: want}, timeout=120)
    # The server still answers, and the stats say nothing went wrong.
    assert srv.stats()["server"] is not None


def test_absent_subscriber_and_bind_rule(tmp_path, start_server, consumers):
    # ipc://: bound by the server (vLLM's rule), with nobody reading.
    ep = f"ipc://{tmp_path}/events"
    rep = f"ipc://{tmp_path}/replay"
    srv = start_server("--kv-events", f"endpoint={ep},replay_endpoint={rep}")
    c = srv.client()
    c.v_init(0, 4096)
    keys = [hexkey(0xe000 + i) for i in range(2500)]  # an inventory of several batches
    for i in range(0, 2500, 250):
        c.v_write(0, keys[i:i + 250])
    cons = Consumer(ep, rep)  # connects: the server bound
    consumers.append(cons)
    cons.replay(0)
    assert cons.held == {0: {vllm_hash(k) for k in keys}}
    sync(srv, cons)
    c.v_delete(keys[:1])
    cons.wait_for({0: {vllm_hash(k) for k in keys[1:]}})


def test_topic_per_namespace(tmp_path, start_server, consumers):
    # topic= naming {deployment} and {pool}: each namespace's batches go out
    # under its own topic (llm-d reads kv@POD@MODEL, and routers subscribe
    # by prefix), so a subscriber can take one namespace by its topic.
    ep, rep = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay"
    srv = start_server("--kv-events",
                       f"endpoint={ep},replay_endpoint={rep},topic=kv@kvpage@{{deployment}}.{{pool}}")
    ctx = zmq.Context()
    only = ctx.socket(zmq.SUB)  # the namespace "team" only, by its topic's prefix
    only.setsockopt(zmq.LINGER, 0)
    only.connect(ep)
    only.setsockopt(zmq.SUBSCRIBE, b"kv@kvpage@team.")
    allc = Consumer(ep, rep, topic="kv@kvpage@")  # every namespace: the common prefix
    consumers.append(allc)
    got = {}  # topic -> block hashes stored, as the filtering subscriber saw them

    def read_only(timeout=0.2):
        n = 0
        while only.poll(int(timeout * 1000)):
            topic, seq_b, payload = only.recv_multipart()
            assert len(seq_b) == 8
            _, events, _ = msgpack.unpackb(payload, raw=False)
            for e in events:
                if e["type"] == "BlockStored":
                    got.setdefault(topic, set()).update(e["block_hashes"])
            n += 1
        return n

    try:
        team = srv.client("/ns/team")
        team.v_init(3, 64)
        for i in range(300):  # until the filtering subscription reaches the publisher
            team.v_write(3, [hexkey(0xfade00 + i)])
            if read_only(0.1):
                break
        else:
            raise AssertionError("the filtering subscriber never heard of the team")
        team.v_clear()
        allc.replay(0)
        sync(srv, allc)
        read_only()
        got.clear()
        c = srv.client()
        c.v_init(0, 16)
        mine = [hexkey(0x7ea0 + i) for i in range(4)]
        theirs = [hexkey(0xd0d0 + i) for i in range(3)]
        team.v_write(3, mine)
        c.v_write(0, theirs)
        allc.wait_for({0: {vllm_hash(k) for k in theirs}, 3: {vllm_hash(k) for k in mine}})
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            read_only()
        read_only()
        assert list(got) and all(t.startswith(b"kv@kvpage@team.") for t in got), got
        assert set().union(*got.values()) == {vllm_hash(k) for k in mine}, got
        # Every namespace's topic is its own, the template filled in.
        team_topics = {t for t in allc.topics if t.startswith(b"kv@kvpage@team.")}
        default_topics = {t for t in allc.topics if t.startswith(b"kv@kvpage@default.")}
        assert team_topics == set(got) and len(default_topics) == 1, allc.topics
        assert not any(b"{" in t for t in allc.topics), allc.topics
        team.close()
        c.close()
    finally:
        only.close(0)
        ctx.term()


# ---------------------------------------------------------------- over Redis
# (whatever KVPAGE_TEST_BACKEND says: these start servers with --meta on the
# session's Redis themselves)

def redis_server(tmp_path, loc, spec, start_server=None):
    flags = ["--meta", loc, "--kv-events", spec]
    return start_server(*flags) if start_server else launch(tmp_path, flags)


def test_two_servers_over_one_redis(tmp_path, start_server, consumers):
    """Every server of one state publishes every change of it once, whichever
    server made it: a router subscribed to any of them sees the same pages."""
    loc = redisfix.fresh_location()
    servers, conss = [], []
    for _ in range(2):
        p1, p2 = ports()
        ep, rep = f"tcp://127.0.0.1:{p1}", f"tcp://127.0.0.1:{p2}"
        cons = Consumer(ep, rep, bind=True)
        consumers.append(cons)
        servers.append(redis_server(tmp_path, loc, f"endpoint={ep},replay_endpoint={rep}",
                                    start_server))
        cons.replay(0)
        conss.append(cons)
    for srv, cons in zip(servers, conss):
        sync(srv, cons)
    a, b = servers[0].client(), servers[1].client()
    a.v_init(0, 4)
    a.v_init(1, 8)
    keys = [hexkey(0xab0000 + i) for i in range(6)]
    a.v_write(0, keys[:4])
    b.v_write(1, keys[4:])  # through the other server
    want = {0: {vllm_hash(k) for k in keys[:4]}, 1: {vllm_hash(k) for k in keys[4:]}}
    for cons in conss:
        cons.wait_for(want)
    a.v_write(0, keys[4:])  # evicts two on rank 0
    a.v_delete(keys[2:3])  # every rank
    assert a.v_exists(keys)[:3] == [False] * 3  # the least recent two evicted, one deleted
    want = {0: {vllm_hash(k) for k in keys[3:]}, 1: {vllm_hash(k) for k in keys[4:]}}
    for cons in conss:
        cons.wait_for(want)
    b.v_clear()  # every rank of the namespace
    for cons in conss:
        cons.wait_for({})
    mine = {vllm_hash(k) for k in keys}
    for cons in conss:
        # Once each: every page stored was stored once and removed once (a
        # rank's changes in their order), none told twice.
        told = [(e["type"], h, rank) for _, _, e, rank in cons.events
                for h in e["block_hashes"] if h in mine]
        assert len(told) == len(set(told)), told
        stored = sorted((h, r) for t, h, r in told if t == "BlockStored")
        removed = sorted((h, r) for t, h, r in told if t == "BlockRemoved")
        assert stored == removed and len(stored) == 8, told
        assert cons.replays == 1  # no gap in the numbers
    # A replay from 0 on either is the inventory (here: nothing but the probe's namespace).
    b.v_write(1, keys[:2])
    for cons in conss:
        cons.wait_for({1: {vllm_hash(k) for k in keys[:2]}})
    late = Consumer(f"tcp://127.0.0.1:{free_port()}", conss[1].replay_endpoint)
    consumers.append(late)
    late.replay(0)
    assert {r: h for r, h in late.held.items() if h} == {1: {vllm_hash(k) for k in keys[:2]}}
    a.close()
    b.close()


def test_redis_lost_changes_resync_from_the_inventory(tmp_path, start_server, consumers):
    """A server held up (SIGSTOP) while another stores more than its rank's
    stream keeps (?events_max=100): the changes trimmed unread are lost to
    it, so it skips a sequence number at once; its subscriber sees the gap,
    asks for a replay, and gets the inventory: every page again."""
    loc = redisfix.fresh_location() + "&events_max=100"
    p1, p2 = ports()
    ep, rep = f"tcp://127.0.0.1:{p1}", f"tcp://127.0.0.1:{p2}"
    cons = Consumer(ep, rep, bind=True)
    consumers.append(cons)
    a = redis_server(tmp_path, loc, f"endpoint={ep},replay_endpoint={rep}", start_server)
    b = start_server("--meta", loc)
    cons.replay(0)
    sync(a, cons)
    cb = b.client()
    cb.v_init(0, 4096)
    first = [hexkey(0x1057000 + i) for i in range(2)]
    cb.v_write(0, first)
    cons.wait_for({0: {vllm_hash(k) for k in first}})
    replays = cons.replays
    keys = [hexkey(0x1058000 + i) for i in range(1200)]
    a.proc.send_signal(signal.SIGSTOP)
    try:
        for k in keys:  # an entry of the rank's stream each
            cb.v_write(0, [k])
    finally:
        a.proc.send_signal(signal.SIGCONT)
    cons.wait_for({0: {vllm_hash(k) for k in first + keys}})
    assert cons.replays > replays  # the gap was seen and filled by a replay
    assert "skipped, a replay gives the inventory" in a.stderr(), a.stderr()
    cb.close()


def test_redis_sequence_survives_restart(tmp_path, consumers):
    """With no data directory the next number is kept in Redis: a restarted
    server (clean stop or killed) numbers on above the numbers it used."""
    loc = redisfix.fresh_location()
    p1, p2 = ports()
    ep, rep = f"tcp://127.0.0.1:{p1}", f"tcp://127.0.0.1:{p2}"
    keys = [hexkey(0xc1de00 + i) for i in range(8)]

    def run(i, stop_sig):
        cons = Consumer(ep, rep, bind=True)
        consumers.append(cons)
        srv = redis_server(tmp_path, loc, f"endpoint={ep},replay_endpoint={rep}")
        cons.replay(0)
        sync(srv, cons)
        c = srv.client()
        c.v_init(0, 16)
        c.v_write(0, keys[2 * i:2 * i + 2])
        cons.wait_for({0: {vllm_hash(k) for k in keys[:2 * i + 2]}})
        c.close()
        return stop_run(srv, stop_sig, cons, consumers)

    s1 = run(0, signal.SIGTERM)
    s2 = run(1, signal.SIGTERM)
    assert min(s2) == max(s1) + 1, (s1, s2)  # a clean stop: no gap
    s3 = run(2, signal.SIGKILL)
    s4 = run(3, signal.SIGTERM)  # after a crash: later, never reused
    assert min(s3) > max(s2) and min(s4) > max(s3), (s2, s3, s4)


@pytest.mark.parametrize("where", ["sentinel", "cluster"])
def test_events_over_sentinel_and_cluster(start_server, consumers, where):
    """The streams are read through the connection layer: a master named by
    Redis Sentinel, and ranks on the shards of a Redis Cluster."""
    if where == "sentinel" and not os.path.exists(redisfix.REDIS_SENTINEL):
        pytest.skip("redis-sentinel is not installed")
    fix = (redisfix.Sentinels(name="kvev", replicas=0) if where == "sentinel"
           else redisfix.Cluster(masters=3))
    fix.start()
    try:
        loc = fix.url("prefix=ev") if where == "sentinel" else fix.url(prefix="ev")
        p1, p2 = ports()
        ep, rep = f"tcp://127.0.0.1:{p1}", f"tcp://127.0.0.1:{p2}"
        cons = Consumer(ep, rep, bind=True)
        consumers.append(cons)
        srv = redis_server(None, loc, f"endpoint={ep},replay_endpoint={rep}", start_server)
        cons.replay(0)
        sync(srv, cons)
        c = srv.client()
        keys = [hexkey(0x5e0000 + i) for i in range(8)]
        for r in range(4):  # ranks on several shards of a cluster
            c.v_init(r, 16)
            c.v_write(r, keys[2 * r:2 * r + 2])
        want = {r: {vllm_hash(k) for k in keys[2 * r:2 * r + 2]} for r in range(4)}
        cons.wait_for(want)
        c.v_delete(keys[::2])
        want = {r: {vllm_hash(keys[2 * r + 1])} for r in range(4)}
        cons.wait_for(want)
        late = Consumer(f"tcp://127.0.0.1:{free_port()}", rep)
        consumers.append(late)
        late.replay(0)
        assert {r: h for r, h in late.held.items() if h} == want
        c.close()
        srv.stop()
    finally:
        fix.close()


@pytest.mark.parametrize("spec, why", [
    ("endpoint", "expected name=value"),
    ("colour=red", "unknown field 'colour'"),
    ("medium=GPU", "expected STORAGE, EXTERNAL or DISK"),
    ("format=json", "expected map or array"),
    ("hwm=lots", "hwm=lots: expected an integer"),
    ("buffer_steps=0", "buffer_steps=0: expected an integer from 1"),
    ("hash=md5", "expected auto, sglang, vllm or xxh3"),
    ("endpoint=", "endpoint must not be empty"),
    ("topic=kv@{model}", "expected {deployment} or {pool}"),
])
def test_bad_option(tmp_path, spec, why):
    r = subprocess.run([BIN, "serve", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
                        "none", "--kv-events", spec],
                       capture_output=True, text=True, timeout=30, cwd=str(tmp_path))
    assert r.returncode == 2, r
    assert "--kv-events" in r.stderr and why in r.stderr, r.stderr


def test_endpoint_in_use_fails_to_start(tmp_path):
    p = free_port()
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUB)
    s.bind(f"tcp://127.0.0.1:{p}")
    try:
        r = subprocess.run([BIN, "serve", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
                            str(tmp_path / "d"), "--kv-events",
                            f"endpoint=tcp://127.0.0.1:{free_port()},"
                            f"replay_endpoint=tcp://127.0.0.1:{p}"],
                           capture_output=True, text=True, timeout=30, cwd=str(tmp_path))
    finally:
        s.close(0)
        ctx.term()
    assert r.returncode == 1, r
    assert f"cannot bind replay_endpoint tcp://127.0.0.1:{p}" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "d")  # a refused start leaves no state


def confirm_ex(c, keys, pages, fields):
    """vLLM's confirm_write of keys on pages (rank 0) with more fields."""
    return c.post("/keys/confirm_write",
                  {"rank": 0, "confirmations": list(map(list, zip(keys, pages))), **fields})


def store_told(c, cons, keys, fields):
    """Allocates and confirms keys on rank 0 with fields, waits until cons
    holds them; their block hashes and the BlockStored events received."""
    r = confirm_ex(c, keys, c.v_alloc(0, keys), fields)
    assert r.status_code == 204, r.text
    hashes = [vllm_hash(k) for k in keys]
    cons.wait_for({0: set(hashes)})
    return hashes, stored_events(cons)


def stored_events(cons):
    """The BlockStored events received, as maps (the array format's fields
    named as vLLM's BlockStored has them)."""
    names = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
             "medium", "lora_name"]
    out = []
    for _, _, e, _ in cons.events:
        e = e if isinstance(e, dict) else dict(zip(names, e))
        if e["type"] == "BlockStored":
            out.append(e)
    return out


def chains(events):
    """Each page's (parent, tokens) as the events say them: the first of an
    event has the event's parent_block_hash, each next one the page before
    it; the event's token_ids are its pages' block_size tokens each."""
    got = {}
    for e in events:
        bs, toks = e["block_size"], e["token_ids"]
        assert toks == [] or len(toks) == bs * len(e["block_hashes"]), e
        parent = e["parent_block_hash"]
        for i, h in enumerate(e["block_hashes"]):
            got[h] = (parent, toks[i * bs:(i + 1) * bs] if toks else None)
            parent = h
    return got


def test_parents_and_tokens_vllm(start_server, consumers):
    """prefix_key: the confirmations are a chain from it; token_ids: each
    page's tokens. One BlockStored carries the run, as vLLM sends one."""
    srv, cons, c = start_events(start_server, consumers, "block_size=16")
    c.v_init(0, 16)
    prefix = hexkey(0x70)
    keys = [hexkey(0x7100 + i) for i in range(5)]
    toks = [list(range(100 * i, 100 * i + 4)) for i in range(5)]
    hashes, ev = store_told(c, cons, keys, {"prefix_key": prefix, "token_ids": toks})
    assert sum((e["block_hashes"] for e in ev), []) == hashes
    assert ev[0]["parent_block_hash"] == vllm_hash(prefix)
    assert ev[0]["token_ids"][:8] == toks[0] + toks[1] and ev[0]["block_size"] == 4
    want = {h: (p, t) for h, p, t in zip(hashes, [vllm_hash(prefix)] + hashes[:-1], toks)}
    assert chains(ev) == want
    # Explicit parents: a page whose parent is not the page before it starts
    # an event of its own; null is no parent; without tokens, the namespace's
    # block_size and no token_ids.
    cons.events.clear()
    more = [hexkey(0x7200 + i) for i in range(4)]
    other = hexkey(0x7300)
    pages = c.v_alloc(0, more)
    r = confirm_ex(c, more, pages, {"parent_keys": [None, more[0], other, more[2]]})
    assert r.status_code == 204, r.text
    h2 = [vllm_hash(k) for k in more]
    cons.wait_for({0: set(hashes + h2)})
    ev = stored_events(cons)
    assert [(e["block_hashes"], e["parent_block_hash"]) for e in ev] == [
        (h2[:2], None), (h2[2:], vllm_hash(other))]
    assert all(e["token_ids"] == [] and e["block_size"] == 16 for e in ev)
    # A confirmation without them is as before: one event, no parent.
    cons.events.clear()
    plain = [hexkey(0x7400 + i) for i in range(3)]
    c.v_write(0, plain)
    cons.wait_for({0: set(hashes + h2 + [vllm_hash(k) for k in plain])})
    ev = stored_events(cons)
    assert [(e["block_hashes"], e["parent_block_hash"], e["token_ids"]) for e in ev] == [
        ([vllm_hash(k) for k in plain], None, [])]
    # The inventory: a late subscriber gets the pages, and their parents and
    # tokens as kept, in process and in Redis (test_events_lineage.py has
    # more of it).
    late = Consumer(f"tcp://127.0.0.1:{free_port()}", cons.replay_endpoint)
    consumers.append(late)
    late.replay(0)
    assert late.held[0] == cons.held[0]
    got = chains(stored_events(late))
    assert {h: got[h] for h in want} == want


def test_tokens_of_a_large_page(start_server, consumers):
    """A page's tokens are told up to 2,552 of them (the records one
    operation stages); past that its BlockStored carries none, and the
    page itself is still told, in its place among its confirmation's."""
    srv, cons, c = start_events(start_server, consumers)
    c.v_init(0, 8)
    keys = [hexkey(0x7500 + i) for i in range(3)]
    toks = [list(range(2552)), list(range(1, 2554)), [5, 6]]
    hashes, ev = store_told(c, cons, keys, {"prefix_key": None, "token_ids": toks})
    assert [(e["block_hashes"], e["token_ids"], e["block_size"]) for e in ev] == [
        ([hashes[0]], toks[0], 2552), ([hashes[1]], [], 16), ([hashes[2]], [5, 6], 2)]


def test_parents_sglang_array_format(start_server, consumers):
    """SGLang's dialect, the positional format: parents hashed as the blocks
    are (signed int64 of the first 16 hex digits)."""
    srv, cons, c = start_events(start_server, consumers, "format=array", "block_size=64")
    c.s_init(1, 8)
    prefix = "e" * 16 + hexkey(1, 48)
    keys = ["f" * 16 + hexkey(0x10 + i, 48) for i in range(3)]
    idx = c.s_reserve(1, keys)
    toks = [[7] * 2, [8] * 2, [9] * 2]
    r = c.post("/1/confirm_write", {"written_keys_to_confirm": [[k, p] for k, (_, p) in
                                                                 zip(keys, idx)],
                                    "prefix_key": prefix, "token_ids": toks})
    assert r.status_code == 204, r.text
    hashes = [sglang_hash(k) for k in keys]
    cons.wait_for({1: set(hashes)})
    ev = stored_events(cons)
    assert all(len(e) == 8 for _, _, e, _ in cons.events)  # arrays, tag first
    assert ev[0]["parent_block_hash"] == sglang_hash(prefix) < 0
    assert chains(ev) == {h: (p, t) for h, p, t in zip(hashes, [sglang_hash(prefix)] + hashes[:-1],
                                                        toks)}


BAD_PARENTS = [
    ({"parent_keys": ["a"]}, "parent_keys must be a list of 2 keys (or nulls), one per confirmation"),
    ({"parent_keys": "a"}, "parent_keys must be a list of 2 keys"),
    ({"parent_keys": [None, 5]}, "parent_keys[1] must be a key or null"),
    ({"parent_keys": ["", None]}, "parent_keys[0] key is empty"),
    ({"prefix_key": 3}, "prefix_key must be a key or null"),
    ({"prefix_key": "x" * 1025}, "prefix_key key is longer than 1024 bytes"),
    ({"prefix_key": "a", "parent_keys": [None, None]}, "give parent_keys or prefix_key, not both"),
    ({"token_ids": [[1]]}, "token_ids must be a list of 2 token lists (or nulls)"),
    ({"token_ids": [[1], "x"]}, "token_ids[1] must be a list of at most 65536 tokens, or null"),
    ({"token_ids": [[1], [2, -1]]}, "token_ids[1][1] must be a token id"),
    ({"token_ids": [[1], [2**32]]}, "token_ids[1][0] must be a token id"),
    ({"token_ids": [[1.5], None]}, "token_ids[0][0] must be a token id"),
]


@pytest.mark.parametrize("extra, why", BAD_PARENTS)
def test_bad_parents_refused(start_server, extra, why):
    """Bad parent or token fields: 400, and nothing confirmed (both
    dialects, every backend: the route checks them)."""
    srv = start_server()
    c = srv.client()
    c.v_init(0, 8)
    keys = [hexkey(0x9900), hexkey(0x9901)]
    pages = c.v_alloc(0, keys)
    body = {"rank": 0, "confirmations": [[k, p] for k, p in zip(keys, pages)], **extra}
    r = c.post("/keys/confirm_write", body)
    assert r.status_code == 400, r.text
    assert why in r.json()["detail"], r.json()
    assert r.json()["detail"].startswith("Confirmation failed: ")
    assert c.v_exists(keys) == [False, False]
    c.s_init(3, 8)
    idx = c.s_reserve(3, keys)
    r = c.post("/3/confirm_write", {"written_keys_to_confirm": [[k, p] for k, (_, p) in
                                                                zip(keys, idx)], **extra})
    assert r.status_code == 400 and why in r.json()["detail"], r.text
    assert c.s_exists(3, keys) == [False, False]
    c.close()


def test_parents_accepted_by_every_backend(start_server):
    """Valid parents and tokens confirm as usual (a backend without them
    passes them over)."""
    srv = start_server()
    c = srv.client()
    c.v_init(0, 8)
    keys = [hexkey(0x9a00), hexkey(0x9a01)]
    pages = c.v_alloc(0, keys)
    r = c.post("/keys/confirm_write", {"rank": 0, "confirmations": [[k, p] for k, p in
                                                                    zip(keys, pages)],
                                       "prefix_key": None, "token_ids": [[1, 2], None]})
    assert r.status_code == 204, r.text
    assert c.v_exists(keys) == [True, True]
    c.close()


def test_parents_in_a_small_queue(start_server, consumers):
    """A change's records are queued whole: with max_queue_size 2 a page's
    parent still fits beside it (a chain), its 40 tokens (10 more records)
    do not and are left out; nothing waits forever."""
    srv, cons, c = start_events(start_server, consumers, "max_queue_size=2")
    c.v_init(0, 16)
    keys = [hexkey(0x7a00 + i) for i in range(3)]
    pages = c.v_alloc(0, keys)
    r = confirm_ex(c, keys, pages, {"prefix_key": None, "token_ids": [list(range(40))] * 3})
    assert r.status_code == 204, r.text
    hashes = [vllm_hash(k) for k in keys]
    cons.wait_for({0: set(hashes)})
    assert chains(stored_events(cons)) == {
        h: (p, None) for h, p in zip(hashes, [None] + hashes[:-1])}
