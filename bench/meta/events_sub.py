"""One KV events subscriber for bench/meta/ab.sh (EVENTS=1): receives every
message of kvpage serve --kv-events at ENDPOINT, decodes its msgpack batch
as a router would, and prints at SIGINT how many batches and events it got
and how many sequence numbers it missed (the PUB socket's drops).

    python3 events_sub.py ENDPOINT

SUB_DECODE=0 receives every message and checks its sequence number but does
not decode the batch: the subscriber of a router runs on the router's host,
and on a 2-core machine its decoding (about half the publishing side's CPU,
bench/README.md) would be charged to the server.
"""
import os
import signal
import sys

import msgpack
import zmq

ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(sys.argv[1])
sub.setsockopt(zmq.SUBSCRIBE, b"")
batches = events = gaps = 0
last = -1
stop = False
decode = os.environ.get("SUB_DECODE", "1") != "0"


def on_int(*_):
    global stop
    stop = True


signal.signal(signal.SIGINT, on_int)
while not stop:
    if not sub.poll(200):
        continue
    _, seq_b, payload = sub.recv_multipart()
    seq = int.from_bytes(seq_b, "big")
    if last >= 0 and seq > last + 1:
        gaps += seq - last - 1
    last = seq
    batches += 1
    if decode:
        ts, evs, rank = msgpack.unpackb(payload, raw=False)
        events += len(evs)
shown = f"{events} events" if decode else "events not decoded (SUB_DECODE=0)"
print(f"{batches} batches, {shown}, {gaps} sequence numbers missed")
