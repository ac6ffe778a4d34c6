"""One KV events subscriber for bench/meta/ab.sh (EVENTS=1): receives every
message of kvpage serve --kv-events at ENDPOINT, decodes its msgpack batch
as a router would, and prints at SIGINT how many batches and events it got
and how many sequence numbers it missed (the PUB socket's drops).

    python3 events_sub.py ENDPOINT
"""
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
    ts, evs, rank = msgpack.unpackb(payload, raw=False)
    batches += 1
    events += len(evs)
print(f"{batches} batches, {events} events, {gaps} sequence numbers missed")
