#!/usr/bin/python3
"""The prefix hit rate of a Mooncake trace for an engine in front of one rank
of kvpage serve with C pages, simulated: what `kvpage bench trace` should
measure when it replays the trace on one connection against a server run
with --read-grace-ms 0.

Each request, in timestamp order (a stable sort, as the replay does), does
what the replay sends, with the server's rules (src/meta/local/local.c):

1. exists of its blocks: the hit prefix is the leading run of blocks held;
   exists does not change recency.
2. get_page_indices of the prefix: each hit is touched, last to first, so
   that the earlier blocks end up the most recent.
3. reserve_and_allocate_page_indices of the blocks after the prefix: the
   ones held are touched (last to first) and marked; each one not held (a
   block repeated within the request gets the page of its first occurrence)
   takes a free page, or else evicts the least recently used page that is
   not marked; none left: the block gets no page (-1) and is not stored.
4. confirm_write of the new blocks that got a page, in order: each becomes
   the most recent.

usage: lru_sim.py TRACE [--capacity C ...] [--json]
  --capacity C   pages of the rank; 0 or "inf" for no limit; may repeat
                 (default: inf)
"""
import argparse
import hashlib
import json
import sys
from collections import OrderedDict


class TraceError(Exception):
    pass


def load(path):
    """The trace's requests as lists of block ids, in timestamp order."""
    reqs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as e:
                raise TraceError(f"{path}:{n}: not JSON: {e}") from None
            ids = doc.get("hash_ids") if isinstance(doc, dict) else None
            ts = doc.get("timestamp", 0) if isinstance(doc, dict) else None
            if not isinstance(ids, list) or not all(
                    type(i) is int and 0 <= i < 2**63 for i in ids):
                raise TraceError(f"{path}:{n}: 'hash_ids' must be a list of block ids "
                                 "(integers >= 0)")
            if type(ts) not in (int, float) or ts < 0:
                raise TraceError(f"{path}:{n}: 'timestamp' must be a number >= 0 (ms)")
            reqs.append((ts, len(reqs), ids))
    reqs.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in reqs]


def block_key(block_id):
    """The page key kvpage bench trace sends for a block id."""
    return hashlib.sha256(b"kvpage-trace-block:%d" % block_id).hexdigest()


def reuse_ceiling(reqs):
    """Share of block references whose block came before (infinite cache,
    any position): the most any cache can hit."""
    seen, again, total = set(), 0, 0
    for ids in reqs:
        for i in ids:
            again += i in seen
            seen.add(i)
        total += len(ids)
    return again, total, len(seen)


def simulate(reqs, capacity):
    """(prefix-hit blocks, all blocks, blocks that got no page, evictions,
    the blocks held at the end from the least recent on)."""
    lru = OrderedDict()  # block id -> None, least recent first
    hits = total = unstored = evictions = 0
    for ids in reqs:
        total += len(ids)
        n = 0
        while n < len(ids) and ids[n] in lru:
            n += 1
        hits += n
        for i in reversed(range(n)):  # get_page_indices of the prefix
            lru.move_to_end(ids[i])
        rest = ids[n:]
        marked = set()
        for i in reversed(rest):  # allocate: the hits first, last to first
            if i in lru:
                lru.move_to_end(i)
                marked.add(i)
        new, got = [], {}
        reserved = 0
        for i in rest:
            if i in lru:
                continue
            if i in got:  # repeated: the page of its first occurrence, or none
                unstored += not got[i]
                continue
            if capacity is None or len(lru) + reserved < capacity:
                reserved += 1
                got[i] = True
            else:
                oldest = next(iter(lru), None)
                if oldest is None or oldest in marked:
                    got[i] = False
                    unstored += 1
                    continue
                del lru[oldest]
                evictions += 1
                reserved += 1
                got[i] = True
            new.append(i)
        for i in new:  # confirm_write, in order
            if got[i]:
                lru[i] = None
    return hits, total, unstored, evictions, list(lru)


def parse_capacity(s):
    if s in ("0", "inf"):
        return None
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a page count or inf") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"'{s}' is not a page count or inf")
    return v or None


def main(argv):
    ap = argparse.ArgumentParser(description="LRU simulation of kvpage bench trace")
    ap.add_argument("trace")
    ap.add_argument("--capacity", type=parse_capacity, action="append")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        reqs = load(a.trace)
    except (TraceError, OSError) as e:
        print(f"lru_sim.py: {e}", file=sys.stderr)
        return 2
    again, total, unique = reuse_ceiling(reqs)
    rows = []
    for cap in a.capacity or [None]:
        hits, blocks, unstored, evictions, _ = simulate(reqs, cap)
        rows.append({"capacity": cap, "requests": len(reqs), "blocks": blocks,
                     "prefix_hit_blocks": hits,
                     "hit_rate": 100.0 * hits / blocks if blocks else 0.0,
                     "unstored_blocks": unstored, "evictions": evictions})
    ceiling = 100.0 * again / total if total else 0.0
    if a.json:
        print(json.dumps({"trace": a.trace, "blocks": total, "unique_blocks": unique,
                          "reuse_ceiling": ceiling, "runs": rows}))
    else:
        print(f"{a.trace}: {len(reqs)} requests, {total} blocks, {unique} unique; "
              f"reuse ceiling {ceiling:.2f}%")
        for r in rows:
            cap = "inf" if r["capacity"] is None else r["capacity"]
            print(f"  capacity {cap:>8}: prefix hit rate {r['hit_rate']:6.2f}% "
                  f"({r['prefix_hit_blocks']} blocks), evictions {r['evictions']}, "
                  f"unstored {r['unstored_blocks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
