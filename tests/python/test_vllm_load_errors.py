"""kvpage.vllm never lets vLLM compute on a failed load, keeps pipeline
stages apart and clears its namespace on reset_cache: KvpageHF3FSConnector
over stand-ins of vLLM's KVConnectorBase_V1, HF3FS connector and scheduler
(tests/python/vllm_hf3fs_standin.py names the vLLM files and commits they
were written from), kvpage's client and a real kvpage serve.

A load fails per block: a page whose key is gone (null location), a short
read (the page file cut under a page), an error result of batch_read. The
failed blocks, exactly, come out of get_block_ids_with_load_errors in the
pass where get_finished reports the request; the good blocks hold their
pages; the failed ones are left as they were (never scattered)."""
import errno
import importlib
import os
import sys
import time
import types

import pytest
import torch

import vllm_hf3fs_standin as standin

BPP = 4096          # bytes of one page = one block (one uint8 layer)
NUM_BLOCKS = 48
FILE_PAGES = 64
DEADLINE = 120      # seconds: generous, only a bound on a hang (ASan, both cores busy)


def _fresh_kvpage_vllm():
    sys.modules.pop("kvpage.vllm", None)
    return importlib.import_module("kvpage.vllm")


@pytest.fixture
def vllm(monkeypatch):
    """(kvpage.vllm over the stand-ins, connector module, parallel_state, base)."""
    cm, ps, base = standin.install(monkeypatch)
    yield _fresh_kvpage_vllm(), cm, ps, base
    sys.modules.pop("kvpage.vllm", None)


def config(path, url, policy="fail", **extra):
    ktc = standin.KVTransferConfig(dict(hf3fs_storage_path=str(path), hf3fs_metadata_server_url=url,
                                        hf3fs_file_size=FILE_PAGES * BPP, hf3fs_client_numjobs=2,
                                        hf3fs_max_device_buffer_count=16, **extra),
                                   kv_load_failure_policy=policy)
    return types.SimpleNamespace(kv_transfer_config=ktc)


class Worker:
    """A worker connector with its KV cache (NUM_BLOCKS blocks of BPP bytes)."""

    def __init__(self, kv, base, cfg, seed=1):
        self.conn = kv.KvpageHF3FSConnector(cfg, base.KVConnectorRole.WORKER)
        g = torch.Generator().manual_seed(seed)
        self.cache = torch.randint(0, 256, (NUM_BLOCKS, BPP), dtype=torch.uint8, generator=g)
        self.conn.register_kv_caches({"layer.0": self.cache})
        self.errors_seen = []  # (pass, block ids) of every non-empty error report

    def step(self, requests=(), finished=()):
        """One forward pass as vLLM's model runner makes it: metadata bound,
        loads started, saves waited for, then get_finished and
        get_block_ids_with_load_errors into one output."""
        self.conn.bind_connector_metadata(list(requests))
        self.conn.start_load_kv(None)
        self.conn.wait_for_save()
        saved, loaded = self.conn.get_finished(set(finished))
        invalid = self.conn.get_block_ids_with_load_errors()
        self.conn.clear_connector_metadata()
        return set(saved or ()), set(loaded or ()), set(invalid)

    def save(self, rid, keys, block_ids):
        self.step([types.SimpleNamespace(request_id=rid, block_ids=list(block_ids),
                                         load_keys=None, save_keys=list(keys))], [rid])
        self._until(lambda saved, loaded: rid in saved, [rid])
        assert not [f for f in self.conn._async_manager.failed if f[1] == rid], \
            self.conn._async_manager.failed

    def load(self, rid, keys, block_ids):
        """Loads keys into block_ids; returns (finished_recving, invalid blocks)
        of the pass that reports rid, after checking that no error came later."""
        self.cache[list(block_ids)] = 0
        out = self.step([types.SimpleNamespace(request_id=rid, block_ids=list(block_ids),
                                               load_keys=list(keys), save_keys=None)])
        loaded, invalid = self._until(lambda saved, loaded: rid in loaded, (), first=out)
        assert self.step()[2] == set()  # nothing more afterwards: each block once
        return loaded, invalid

    def _until(self, done, finished, first=None):
        deadline = time.monotonic() + DEADLINE
        out = first if first is not None else self.step(finished=finished)
        invalid = set()
        while True:
            saved, loaded, inv = out
            invalid |= inv
            if done(saved, loaded):
                return loaded, invalid
            assert time.monotonic() < deadline, "the connector never reported the request"
            time.sleep(0.005)
            out = self.step(finished=finished)

    def close(self):
        self.conn.close()


def keys_of(prefix, n):
    return [f"{prefix}{i:030x}" for i in range(n)]


@pytest.fixture
def worker(vllm, server, tmp_path):
    kv, cm, ps, base = vllm
    w = Worker(kv, base, config(tmp_path / "kv", server.url("/ns/vfail")))
    yield w
    w.close()


def test_install_rebinds_manager_and_rank(vllm, worker):
    kv, cm, ps, base = vllm
    assert isinstance(worker.conn._async_manager, kv._LoadErrors)
    assert cm.get_tensor_model_parallel_rank is kv.stage_rank
    assert cm.AsyncOperationManager.__bases__[-1].__module__ == cm.__name__
    # a second connector rewraps vLLM's manager, not the wrapper
    kv.install(cm)
    assert cm.AsyncOperationManager.__bases__ == (kv._LoadErrors, cm.AsyncOperationManager.__bases__[-1])
    assert not issubclass(cm.AsyncOperationManager.__bases__[-1], kv._LoadErrors)


def test_all_blocks_good(worker):
    keys = keys_of("a", 6)
    worker.save("w", keys, range(6))
    want = worker.cache[:6].clone()
    loaded, invalid = worker.load("r", keys, range(10, 16))
    assert loaded == {"r"} and invalid == set()
    assert torch.equal(worker.cache[10:16], want)


def test_missing_short_and_error_reads_report_exactly_those_blocks(worker, server):
    keys = keys_of("b", 8)
    worker.save("w", keys, range(8))  # pages 0..7: never-used pages go lowest first
    want = worker.cache[:8].clone()
    # block 12's key is gone: its location is null
    c = server.client("/ns/vfail")
    assert c.post("/keys/delete", {"keys": [keys[2]]}).status_code == 204
    # blocks 16 and 17: the page file cut in the middle of page 6 (a short read, then nothing)
    path = worker.conn._clients[0].path
    os.truncate(path, 6 * BPP + 100)
    # block 14: batch_read answers an error for page 4
    for cl in worker.conn._clients:
        real = cl.batch_read

        def faulty(offsets, tensors, real=real, **kw):
            res = real(offsets, tensors, **kw)
            return [-errno.EIO if off == 4 * BPP else r for off, r in zip(offsets, res)]
        cl.batch_read = faulty
    loaded, invalid = worker.load("r", keys, range(10, 18))
    assert loaded == {"r"}
    assert invalid == {12, 14, 16, 17}
    for i in (0, 1, 3, 5):
        assert torch.equal(worker.cache[10 + i], want[i]), i
    for b in (12, 14, 16, 17):  # never scattered: the block stays as it was
        assert int(worker.cache[b].count_nonzero()) == 0, b
    failed = worker.conn._async_manager.failed
    assert [f[:2] for f in failed] == [("Loaded", "r")]  # vLLM's stats see a failed load


def test_failure_in_an_earlier_chunk_is_reported_with_the_request(worker):
    """vLLM keeps a request's last chunk's future only: a failure in the first
    of two chunks (16 blocks a chunk here) must still come with the request."""
    keys = keys_of("c", 20)
    worker.save("w", keys, range(20))
    want = worker.cache[:20].clone()
    dead = set()
    for cl in worker.conn._clients:
        real = cl.batch_read

        def faulty(offsets, tensors, real=real, **kw):
            res = real(offsets, tensors, **kw)
            return [r - 1 if off == 3 * BPP else r for off, r in zip(offsets, res)]
        cl.batch_read = faulty
    dead.add(20 + 3)
    loaded, invalid = worker.load("r", keys, range(20, 40))
    assert loaded == {"r"} and invalid == dead
    for i in range(20):
        if 20 + i not in dead:
            assert torch.equal(worker.cache[20 + i], want[i]), i


def test_unreachable_metadata_fails_every_block(worker):
    keys = keys_of("d", 3)
    worker.save("w", keys, range(3))
    worker.conn._metadata_client.base_url = "http://127.0.0.1:1"
    loaded, invalid = worker.load("r", keys, range(5, 8))
    assert loaded == {"r"} and invalid == {5, 6, 7}
    assert worker.cache[5:8].count_nonzero() == 0


def test_a_batch_that_raises_fails_its_pages_only(worker):
    keys = keys_of("e", 12)  # two batches of 8 and 4 pages
    worker.save("w", keys, range(12))
    want = worker.cache[:12].clone()
    for cl in worker.conn._clients:
        real = cl.batch_read

        def faulty(offsets, tensors, real=real, **kw):
            if 8 * BPP in offsets:
                raise ValueError("Hf3fsClient.check Failed: injected")
            return real(offsets, tensors, **kw)
        cl.batch_read = faulty
    loaded, invalid = worker.load("r", keys, range(20, 32))
    assert loaded == {"r"} and invalid == set(range(28, 32))
    assert torch.equal(worker.cache[20:28], want[:8])


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_scheduler_applies_the_policy_to_what_the_connector_reports(vllm, server, tmp_path,
                                                                   policy):
    """One scheduler step on the worker's output, as vLLM's scheduler takes
    it: invalid blocks first (recompute: the request's computed tokens end
    at its first failed block; fail: the request fails), then the request's
    finished load."""
    kv, cm, ps, base = vllm
    cfg = config(tmp_path / "kv", server.url("/ns/pol"), policy=policy)
    w = Worker(kv, base, cfg)
    try:
        keys = keys_of("f", 5)
        w.save("w", keys, range(5))
        server.client("/ns/pol").post("/keys/delete", {"keys": [keys[3]]})
        block_size = 16
        req = standin.Request("r", range(30, 35), block_size)
        loaded, invalid = w.load("r", keys, req.block_ids)
        failed_recving = set()
        failing = standin.handle_invalid_blocks(
            [req], invalid, cfg.kv_transfer_config.kv_load_failure_policy, failed_recving)
        assert loaded == {"r"} and invalid == {33}
        if policy == "recompute":
            assert failing == set() and failed_recving == {"r"}
            assert req.num_computed_tokens == 3 * block_size  # blocks 30..32 are good
            assert req.num_external_computed_tokens == 3 * block_size
        else:
            assert failing == {"r"} and failed_recving == set()
    finally:
        w.close()


def test_reset_cache_clears_the_namespace(vllm, server, tmp_path):
    kv, cm, ps, base = vllm
    cfg = config(tmp_path / "kv", server.url("/ns/rc"))
    w = Worker(kv, base, cfg)
    sched = kv.KvpageHF3FSConnector(cfg, base.KVConnectorRole.SCHEDULER)
    other = server.client("/ns/other")
    other.post("/rank/0/initialize", {"num_pages": 4})
    other.post("/keys/confirm_write", {"rank": 0, "confirmations": [["k", 0]]})
    try:
        keys = keys_of("g", 4)
        w.save("w", keys, range(4))
        assert sched._metadata_client.batch_key_exists(keys) == [True] * 4
        assert sched.reset_cache() is True
        assert sched._metadata_client.batch_key_exists(keys) == [False] * 4
        # another namespace keeps its keys
        assert other.post("/keys/batch_exists", {"keys": ["k"]}).json()["exists"] == [True]
        # the ranks stay initialized: the worker saves and loads again
        w.save("w2", keys[:2], range(2))
        want = w.cache[:2].clone()
        loaded, invalid = w.load("r", keys[:2], (7, 8))
        assert invalid == set() and torch.equal(w.cache[7:9], want)
        # the worker's connector clears the same namespace
        assert w.conn.reset_cache() is True
        assert sched._metadata_client.batch_key_exists(keys[:2]) == [False, False]
    finally:
        w.close()


def test_reset_cache_without_the_server_says_false(vllm, tmp_path):
    kv, cm, ps, base = vllm
    sched = kv.KvpageHF3FSConnector.__new__(kv.KvpageHF3FSConnector)
    sched._vllm_config = config(tmp_path, "http://127.0.0.1:1")
    assert sched.reset_cache() is False


def test_pipeline_stages_have_their_own_rank_file_and_pages(vllm, server, tmp_path):
    """TP 2 x PP 2: the process at TP rank 1 of stage 1 is rank 3, of stage 0
    rank 1; the same key saved by both stages keeps each stage's bytes."""
    kv, cm, ps, base = vllm
    url = server.url("/ns/pp")
    cfg = config(tmp_path / "kv", url)
    ps.set_ranks(tp_rank=1, tp_size=2, pp_rank=1, pp_size=2)
    assert kv.stage_rank() == 3
    late = Worker(kv, base, cfg, seed=2)
    ps.set_ranks(tp_rank=1, tp_size=2, pp_rank=0, pp_size=2)
    early = Worker(kv, base, cfg, seed=3)
    try:
        assert (late.conn._rank, early.conn._rank) == (3, 1)
        assert os.path.basename(late.conn._clients[0].path) == "hf3fs_vllm_data_file_3"
        assert os.path.basename(early.conn._clients[0].path) == "hf3fs_vllm_data_file_1"
        owner = (tmp_path / "kv" / "hf3fs_vllm_data_file_3.owner").read_text()
        assert f"location {url}\ndeployment pp\npool kv\nrank 3\n" in owner
        keys = keys_of("h", 3)
        late.save("w", keys, range(3))
        early.save("w", keys, range(3))
        want_late, want_early = late.cache[:3].clone(), early.cache[:3].clone()
        assert not torch.equal(want_late, want_early)
        for w, want in ((late, want_late), (early, want_early)):
            loaded, invalid = w.load("r", keys, (9, 10, 11))
            assert invalid == set() and torch.equal(w.cache[9:12], want)
        # complete only when every initialized rank (both stages) holds the key
        sched = kv.KvpageHF3FSConnector(cfg, base.KVConnectorRole.SCHEDULER)
        assert sched._metadata_client.batch_key_exists(keys) == [True] * 3
        more = keys_of("i", 1)
        late.save("w2", more, (20,))
        assert sched._metadata_client.batch_key_exists(more) == [False]
    finally:
        late.close()
        early.close()


def test_one_stage_keeps_vllms_rank(vllm):
    kv, cm, ps, base = vllm
    ps.set_ranks(tp_rank=1, tp_size=4)  # no pipeline group
    assert kv.stage_rank() == 1
    ps.set_ranks(tp_rank=2, tp_size=4, pp_rank=0, pp_size=1)
    assert kv.stage_rank() == 2
    ps.set_ranks(tp_rank=2, tp_size=4, pp_rank=2, pp_size=3)
    assert kv.stage_rank() == 10
    assert kv._rank_of("/x/hf3fs_vllm_data_file_7") == 7
    assert kv._rank_of("/x/elsewhere") == 10
