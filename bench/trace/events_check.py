#!/usr/bin/python3
"""Do a replay's KV events rebuild the server's inventory?

Subscribes to the KV events of `kvpage serve --kv-events` (vLLM's wire
format: a ZMQ PUB socket sending topic, the sequence number as 8 bytes big
endian, a msgpack payload [ts, [events], data_parallel_rank]; events as maps
tagged "type" or as positional arrays tagged by their first element, decoded
as vLLM's consumers do), runs `kvpage bench trace` with the flags given
after "--", waits until the events stop, and rebuilds the set of block
hashes the rank holds from them: BlockStored adds its hashes, BlockRemoved
takes them away. Then asks the server which of the trace's keys its rank
holds (SGLang's exists), turns those into block hashes as the events do
(SGLang keys: the first 16 hex digits as a signed int64), and compares.
What the live stream missed (a gap in the sequence numbers, the tail) is
asked from the replay socket when one is given, as a router does. Exit 0 when the two sets are equal, 1 when they are not.

The server must publish nothing else meanwhile: give it to this run alone.

The subscriber binds the endpoint unless the server binds it (vLLM's rule:
a wildcard, ipc:// or inproc:// endpoint): start the server with
--kv-events endpoint=tcp://127.0.0.1:PUB,replay_endpoint=tcp://127.0.0.1:REP.

usage: events_check.py --events tcp://127.0.0.1:PUB [--replay tcp://127.0.0.1:REP]
                       --url URL [--rank R] [--kvpage BIN] [--from-seq N] [--json]
                       TRACE -- REPLAY FLAGS...
"""
import argparse
import json
import os
import subprocess
import sys
import time

import msgpack
import requests
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lru_sim  # noqa: E402

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def sglang_hash(key):
    """SGLang's hash_str_to_int64 of a page key: its first 16 hex digits."""
    v = int(key[:16], 16)
    return v - (1 << 64) if v >= 1 << 63 else v


def decode_events(payload):
    """[(type, [hashes])] of one payload, either encoding."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    out = []
    for ev in batch[1]:
        if isinstance(ev, dict):
            out.append((ev["type"], list(ev.get("block_hashes") or [])))
        else:  # positional, tagged by the first element
            out.append((ev[0], list(ev[1]) if len(ev) > 1 and ev[0] != "AllBlocksCleared"
                        else []))
    return batch[2], out


class Inventory:
    def __init__(self):
        self.held = set()
        self.stored = self.removed = 0
        self.anomalies = []  # stored twice, removed while absent, AllBlocksCleared

    def apply(self, kind, hashes):
        if kind == "BlockStored":
            for h in hashes:
                if h in self.held:
                    self.anomalies.append(f"stored twice: {h}")
                self.held.add(h)
                self.stored += 1
        elif kind == "BlockRemoved":
            for h in hashes:
                if h not in self.held:
                    self.anomalies.append(f"removed while absent: {h}")
                self.held.discard(h)
                self.removed += 1
        elif kind == "AllBlocksCleared":
            self.anomalies.append("AllBlocksCleared")
            self.held.clear()


def replayed(replay_ep, start, ctx):
    """{seq: payload} of sequence numbers start on, from the replay socket
    (it answers up to its newest, then sequence -1)."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(replay_ep)
    s.send_multipart([b"", start.to_bytes(8, "big")])
    got = {}
    while s.poll(10000):
        frames = s.recv_multipart()
        if frames and frames[0] == b"":
            frames = frames[1:]
        if frames[0] == END_SEQ:
            break
        got[int.from_bytes(frames[0], "big")] = frames[1]
    s.close()
    return got


def main(argv):
    if "--" in argv:
        i = argv.index("--")
        argv, flags = argv[:i], argv[i + 1:]
    else:
        flags = []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--events", required=True)
    ap.add_argument("--replay")
    ap.add_argument("--url", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--kvpage", default=os.path.join(HERE, "..", "..", "build", "kvpage"))
    ap.add_argument("--quiet-s", type=float, default=2.0,
                    help="the events have stopped after this long without one")
    ap.add_argument("--from-seq", type=int, default=0,
                    help="the first sequence number of the run (0: a fresh server)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)  # keep everything: the check must not drop
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    # vLLM's rule: the publisher binds a wildcard, ipc:// or inproc://
    # endpoint and connects to any other, where the subscriber binds
    if "*" in a.events or "::" in a.events or a.events.startswith(("ipc://", "inproc://")):
        sub.connect(a.events)
    else:
        sub.bind(a.events)
    time.sleep(0.5)  # the subscription reaches the publisher (ZMQ's slow joiner)

    replay = subprocess.Popen([a.kvpage, "bench", "trace", a.trace, "--url", a.url, "--rank",
                               str(a.rank), "--json", *flags], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    payloads, last = {}, time.monotonic()
    while True:
        if sub.poll(100):
            frames = sub.recv_multipart()
            payloads[int.from_bytes(frames[1], "big")] = frames[2]
            last = time.monotonic()
        elif replay.poll() is not None and time.monotonic() - last > a.quiet_s:
            break
    out, err = replay.communicate()
    if replay.returncode:
        sys.stderr.write(err.decode(errors="replace"))
        print(f"events_check.py: the replay failed (exit {replay.returncode})", file=sys.stderr)
        return 2
    doc = json.loads(out)

    live = len(payloads)
    if a.replay:  # what the live stream missed (a gap, the tail), as a router would ask
        start = a.from_seq
        while start in payloads:
            start += 1
        for seq, p in replayed(a.replay, start, ctx).items():
            payloads.setdefault(seq, p)
    seqs = sorted(payloads)
    gaps = [s for s in range(a.from_seq, seqs[-1] + 1) if s not in payloads] if seqs else []
    inv, other_ranks = Inventory(), 0
    for s in sorted(payloads):
        dp_rank, events = decode_events(payloads[s])
        if dp_rank != a.rank:
            other_ranks += 1
            continue
        for kind, hashes in events:
            inv.apply(kind, hashes)

    reqs = lru_sim.load(a.trace)
    keys = sorted({lru_sim.block_key(i) for r in reqs for i in r})
    held = set()
    with requests.Session() as s:
        s.trust_env = False
        for i in range(0, len(keys), 50000):
            part = keys[i:i + 50000]
            r = s.post(f"{a.url.rstrip('/')}/{a.rank}/exists", json={"keys": part}, timeout=60)
            r.raise_for_status()
            held |= {sglang_hash(k) for k, e in zip(part, r.json()["exists"]) if e}
    ok = inv.held == held and not gaps and not inv.anomalies
    res = {"messages": len(payloads), "live_messages": live, "first_seq": seqs[0] if seqs else None,
           "last_seq": seqs[-1] if seqs else None, "gaps": len(gaps),
           "stored_events": inv.stored, "removed_events": inv.removed,
           "rebuilt_blocks": len(inv.held), "server_blocks": len(held),
           "missing_from_events": len(held - inv.held),
           "extra_in_events": len(inv.held - held), "anomalies": inv.anomalies[:5],
           "other_ranks": other_ranks, "equal": ok, "replay": doc}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"events: {res['messages']} messages ({live} live, the rest replayed; seq "
              f"{res['first_seq']}..{res['last_seq']}, {res['gaps']} missing), {inv.stored} "
              f"stored, {inv.removed} removed")
        print(f"rebuilt inventory {len(inv.held)} blocks; the server holds {len(held)}: "
              f"{'EQUAL' if ok else 'DIFFERENT'} ({res['missing_from_events']} missing from the "
              f"events, {res['extra_in_events']} extra{'; ' + ', '.join(inv.anomalies[:3]) if inv.anomalies else ''})")
        sched = ""
        if doc["schedule_held"] is not None:
            sched = (f", schedule {'held' if doc['schedule_held'] else 'NOT held'} (lag p99 "
                     f"{doc['lag_p99_ms']:.1f} ms)")
        print(f"replay: hit rate {doc['hit_rate']:.2f}%, {doc['requests_s']:.0f} requests/s"
              f"{sched}, errors {doc['errors']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
