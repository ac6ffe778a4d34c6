"""Stand-ins of the engines' reference metadata servers, for the page-order
tests (test_page_order.py): what page numbers they hand out, and which pages
SGLang's evicts. Written from reading the references, not copied; only the
state the page numbers depend on is kept.

- SglangRank: one rank of SGLang's mini HF3FS metadata server, class
  RankMetadata of sgl-project/sglang
  python/sglang/srt/mem_cache/storage/hf3fs/mini_3fs_metadata_server.py at
  commit 20c02154ebef667e565158c5530f5458bdc2017f (the same methods at
  758b7eb90edac914af51374798f638f51f9e8f1f). Its free list starts as
  [0 .. num_pages-1]; an allocation pops from its back (the highest
  never-used page first, freed pages last-in first-out); a release or a
  delete appends at its back; with the list empty, the least recently used
  key (an OrderedDict, most recent at its end) loses its page to the new
  key. Hits, confirmations and get_page_indices move keys to the end, in
  input order; exists does not.
- VllmState: vLLM's HF3FS metadata server, classes RankFileMetadata and
  GlobalMetadataState of vllm-project/vllm
  vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_metadata_server.py
  at commit f2f5f881568445dd54f2e8fb5ee8fc4cbc73c509 (moved since to
  vllm/backends/..., the module at the old path being an alias). Its free
  list starts as [0 .. num_pages-1]; an allocation takes len(keys) pages
  from its front, all or nothing; a release appends at its back (so freed
  pages are reused last); no eviction, no delete route.
"""
from collections import OrderedDict


class SglangRank:
    def __init__(self, num_pages):
        self.free = list(range(num_pages))
        self.lru = OrderedDict()  # key -> page, least recent first

    def reserve(self, keys):
        out = [None] * len(keys)
        new = []
        for i, k in enumerate(keys):
            if k in self.lru:
                self.lru.move_to_end(k)
                out[i] = (True, self.lru[k])
            else:
                new.append(i)
        for i in new:
            if self.free:
                out[i] = (False, self.free.pop())
            else:
                out[i] = (False, self.lru.popitem(last=False)[1])
        return out

    def confirm(self, written, release=()):
        for k, p in written:
            self.lru[k] = p
            self.lru.move_to_end(k)
        for p in release:
            if p not in self.free:
                self.free.append(p)

    def delete(self, keys):
        for k in keys:
            if k in self.lru:
                p = self.lru.pop(k)
                if p not in self.free:
                    self.free.append(p)

    def get(self, keys):
        out = []
        for k in keys:
            if k in self.lru:
                self.lru.move_to_end(k)
                out.append(self.lru[k])
            else:
                out.append(None)
        return out

    def exists(self, keys):
        return [k in self.lru for k in keys]


class VllmState:
    def __init__(self):
        self.free = {}  # rank -> list of free pages
        self.keys = {}  # key -> {rank: page}

    def init(self, rank, num_pages):
        self.free.setdefault(rank, list(range(num_pages)))

    def _complete(self, key):
        return key in self.keys and len(self.keys[key]) == len(self.free)

    def alloc(self, rank, keys):
        free = self.free[rank]
        got = free[:len(keys)] if len(free) >= len(keys) else []
        del free[:len(got)]
        out = {}
        for i, k in enumerate(keys):
            if self._complete(k) and rank in self.keys[k]:
                if i < len(got):
                    self.release(rank, [got[i]])
                out[k] = self.keys[k][rank]
            else:
                out[k] = got[i] if i < len(got) else -1
        return [out[k] for k in keys]

    def confirm(self, rank, confirmations, release=()):
        for k, p in confirmations:
            self.keys.setdefault(k, {})[rank] = p
        self.release(rank, release)

    def release(self, rank, pages):
        free = self.free[rank]
        for p in pages:
            if p not in free:
                free.append(p)

    def locations(self, rank, keys):
        return [self.keys[k].get(rank) if self._complete(k) else None for k in keys]
