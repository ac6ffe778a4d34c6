"""kvpage.vllm.KvpageTier, vLLM's secondary tier over kvpage's store, driven
as vLLM's tiering manager drives it, through the stand-ins of
vllm_tiering_standin.py (their docstring names the vLLM files and commits)."""
import mmap
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import vllm_tiering_standin as standin
from kvpage.errors import KvpageError

BS = 64 << 10   # bytes of a row (one block of every layer)
ROWS = 64


def view_over(mm):
    """primary_kv_view as vLLM makes it: int8 rows over shared memory."""
    return memoryview(mm).cast("b", (len(mm) // BS, BS))


@pytest.fixture
def primary():
    """(mmap, view, array over the same bytes), the rows random."""
    mm = mmap.mmap(-1, BS * ROWS)
    arr = np.frombuffer(mm, np.uint8).reshape(ROWS, BS)
    arr[:] = np.random.default_rng(7).integers(0, 256, arr.shape, np.uint8)
    v = view_over(mm)
    yield mm, v, arr


def okey(i, group=0):
    return bytes([i % 256]) * 28 + i.to_bytes(4, "big") + group.to_bytes(4, "big")


class Driver:
    """The tiering manager's side: job ids, jobs, waiting for results."""

    def __init__(self, vl, tier):
        self.vl, self.tier, self.next_id, self.seen = vl, tier, 1, {}

    def job(self, keys, rows, promotion=False):
        ctx = self.vl.base.ReqContext("req-1")
        jid, self.next_id = self.next_id, self.next_id + 1
        rows = np.asarray(rows, np.int64)
        tb = self.vl.tier_base
        if hasattr(tb, "JobMetadata"):
            return tb.JobMetadata(jid, list(keys), rows, promotion, ctx)
        return tb.TransferJob(jid, list(keys), rows, promotion, ctx)

    def wait(self, job_ids, timeout=60):
        """Polls get_finished_jobs until every id is in; each id comes once."""
        deadline = time.monotonic() + timeout
        while not set(job_ids) <= set(self.seen):
            assert time.monotonic() < deadline, f"jobs {job_ids} not finished: {self.seen}"
            for r in self.tier.get_finished_jobs():
                assert r.job_id not in self.seen, f"job {r.job_id} reported twice"
                self.seen[r.job_id] = r
            time.sleep(0.01)
        return [self.seen[j] for j in job_ids]

    def store(self, keys, rows):
        j = self.job(keys, rows)
        self.tier.submit_store(j)
        return self.wait([j.job_id])[0]

    def load(self, keys, rows):
        j = self.job(keys, rows, True)
        self.tier.submit_load(j)
        return self.wait([j.job_id])[0]

    def lookup(self, key, timeout=60):
        """A lookup as the scheduler repeats it: RETRY means ask next step."""
        ctx = self.vl.base.ReqContext("req-1")
        deadline = time.monotonic() + timeout
        while True:
            r = self.tier.lookup(key, ctx)
            if r is not self.vl.base.LookupResult.RETRY:
                return r
            assert time.monotonic() < deadline, "lookup never answered"
            self.tier.on_schedule_end(self.vl.base.ScheduleEndContext())
            time.sleep(0.01)


def make(vl, view, tmp_path, name="t", **cfg):
    conf = {"type": "KvpageTier", "module_path": "kvpage.vllm",
            "path": str(tmp_path / f"{name}.pages"), "file_size": 16 * BS}
    conf.update(cfg)
    return vl.factory.SecondaryTierFactory.create_secondary_tier(conf, view, standin.spec())


def stored(vl, view, tmp_path, n=4, **cfg):
    """A tier holding blocks okey(0..n) from rows 0..n: (tier, driver, keys)."""
    tier = make(vl, view, tmp_path, **cfg)
    d = Driver(vl, tier)
    keys = [okey(i) for i in range(n)]
    assert d.store(keys, range(n)).success
    return tier, d, keys


@pytest.fixture
def vl(monkeypatch):
    return standin.install(monkeypatch, "aug2026")


def test_store_lookup_load_through_module_path(vl, primary, tmp_path):
    mm, view, arr = primary
    tier = make(vl, view, tmp_path, enable_kv_events=True)
    assert isinstance(tier, vl.tier_base.SecondaryTierManager)
    assert type(tier).__name__ == "KvpageTier" and tier.tier_type == "KvpageTier"
    d = Driver(vl, tier)
    keys = [okey(i) for i in range(8)]
    t0 = time.monotonic()
    j = d.job(keys, range(8))
    tier.submit_store(j)
    assert time.monotonic() - t0 < 5  # returns at once (the I/O is on the tier's threads)
    (res,) = d.wait([j.job_id])
    assert res.success is True and type(res) is vl.tier_base.JobResult
    assert tier.get_finished_jobs() == []  # reported once
    LR = vl.base.LookupResult
    assert [d.lookup(k) for k in keys] == [LR.HIT] * 8
    assert d.lookup(okey(99)) is LR.MISS
    assert d.lookup(okey(3, group=1)) is LR.MISS  # another KV-cache group: another block
    assert d.load(keys, range(32, 40)).success is True
    assert np.array_equal(arr[32:40], arr[0:8])
    (ev,) = tier.take_events()
    assert ev.keys == keys and ev.removed is False and tier.take_events() == []
    st = tier.get_stats()
    assert st["store_blocks"] == 8 and st["load_bytes"] == 8 * BS
    tier.shutdown()


def test_a_job_of_keys_already_stored_succeeds_without_rewriting(vl, primary, tmp_path):
    mm, view, arr = primary
    tier = make(vl, view, tmp_path)
    d = Driver(vl, tier)
    assert d.store([okey(i) for i in range(4)], range(4)).success
    assert d.store([okey(i) for i in range(6)], range(6)).success
    assert tier.stats()["stored"] == 6
    tier.shutdown()


def test_restart_sees_the_blocks(vl, primary, tmp_path):
    mm, view, arr = primary
    keys = [okey(i) for i in range(6)]
    tier = make(vl, view, tmp_path)
    assert Driver(vl, tier).store(keys, range(6)).success
    tier.shutdown()
    tier = make(vl, view, tmp_path)  # a new vLLM over the same files
    d = Driver(vl, tier)
    assert all(d.lookup(k) is vl.base.LookupResult.HIT for k in keys)
    assert d.load(keys, range(40, 46)).success
    assert np.array_equal(arr[40:46], arr[0:6])
    tier.shutdown()


def test_another_model_does_not_see_them(vl, primary, tmp_path):
    mm, view, arr = primary
    tier = make(vl, view, tmp_path)
    assert Driver(vl, tier).store([okey(1)], [1]).success
    tier.shutdown()
    conf = {"type": "KvpageTier", "module_path": "kvpage.vllm",
            "path": str(tmp_path / "t.pages")}
    other = vl.factory.SecondaryTierFactory.create_secondary_tier(
        conf, view, standin.spec(model="meta-llama/Llama-3.1-8B"))
    assert Driver(vl, other).lookup(okey(1)) is vl.base.LookupResult.MISS
    other.shutdown()


def test_two_managers_of_one_process_share_embedded_metadata(vl, primary, tmp_path):
    mm, view, arr = primary
    meta = str(tmp_path / "index")
    a = make(vl, view, tmp_path, metadata=meta)
    b = make(vl, view, tmp_path, metadata="file:" + meta)
    assert Driver(vl, a).store([okey(i) for i in range(3)], range(3)).success
    db = Driver(vl, b)
    assert db.lookup(okey(2)) is vl.base.LookupResult.HIT
    a.shutdown()  # b keeps the store open
    assert db.load([okey(2)], [50]).success and np.array_equal(arr[50], arr[2])
    b.shutdown()


def _other_process(script, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "python")] + sys.path)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=120)


OTHER = """
    import mmap, sys, time, types
    import numpy as np
    from kvpage.vllm_tier import KvpageTier
    BS, path, meta, seed = {BS}, {path!r}, {meta!r}, {seed}
    mm = mmap.mmap(-1, BS * 8)
    arr = np.frombuffer(mm, np.uint8).reshape(8, BS)
    arr[:] = np.random.default_rng(seed).integers(0, 256, arr.shape, np.uint8)
    tier = KvpageTier(None, memoryview(mm).cast("b", (8, BS)), "KvpageTier", path=path,
                      file_size=16 * BS, metadata=meta, identity="shared")
    keys = [bytes([100 + i]) * 36 for i in range(4)]
    tier.submit_store(types.SimpleNamespace(job_id=1, keys=keys, block_ids=np.arange(4)))
    tier.drain_jobs()
    (r,) = tier.get_finished_jobs()
    print("stored", r.success)
    tier.shutdown()
"""


@pytest.mark.parametrize("where", ["serve", "redis"])
def test_two_instances_share_one_index(vl, primary, tmp_path, start_server, where):
    """Another process (another vLLM instance) stores blocks; this one finds
    them through the same kvpage serve (or Redis) and loads them from the
    same file."""
    mm, view, arr = primary
    if where == "serve":
        url = start_server().url("/ns/qwen3")
    else:
        import redisfix
        url = redisfix.fresh_location()
    path = str(tmp_path / "shared.pages")
    out = _other_process(OTHER.format(BS=BS, path=path, meta=url, seed=11))
    assert out.returncode == 0 and "stored True" in out.stdout, out.stderr
    tier = make(vl, view, tmp_path, name="shared", metadata=url, identity="shared")
    assert tier.async_lookup  # remote metadata: answered on the tier's thread
    d = Driver(vl, tier)
    keys = [bytes([100 + i]) * 36 for i in range(4)]
    first = tier.lookup(keys[0], vl.base.ReqContext("req-1"))
    assert first is vl.base.LookupResult.RETRY  # never waits for the server
    assert all(d.lookup(k) is vl.base.LookupResult.HIT for k in keys)
    assert d.lookup(okey(5)) is vl.base.LookupResult.MISS
    assert d.load(keys, range(20, 24)).success
    theirs = np.random.default_rng(11).integers(0, 256, (8, BS), np.uint8)
    assert np.array_equal(arr[20:24], theirs[:4])
    tier.shutdown()


def test_embedded_metadata_is_one_process_at_a_time(vl, primary, tmp_path):
    mm, view, arr = primary
    path, meta = str(tmp_path / "solo.pages"), str(tmp_path / "solo.index")
    tier = make(vl, view, tmp_path, name="solo", metadata=meta)
    out = _other_process(OTHER.format(BS=BS, path=path, meta=meta, seed=1))
    assert out.returncode != 0 and "busy" in out.stderr.lower(), out.stderr
    tier.shutdown()
    out = _other_process(OTHER.format(BS=BS, path=path, meta=meta, seed=1))
    assert out.returncode == 0 and "stored True" in out.stdout, out.stderr


def test_eviction_at_capacity_least_recently_used_first(vl, primary, tmp_path):
    mm, view, arr = primary
    tier = make(vl, view, tmp_path, file_size=8 * BS, enable_kv_events=True)
    d = Driver(vl, tier)
    old, new = [okey(i) for i in range(8)], [okey(i) for i in range(8, 12)]
    assert d.store(old[:4], range(4)).success
    assert d.store(old[4:], range(4, 8)).success
    assert d.store(new, range(8, 12)).success  # the file is full: the 4 oldest go
    LR = vl.base.LookupResult
    assert [d.lookup(k) for k in old] == [LR.MISS] * 4 + [LR.HIT] * 4
    assert all(d.lookup(k) is LR.HIT for k in new)
    events = tier.take_events()
    removed = [k for e in events if e.removed for k in e.keys]
    assert sorted(removed) == sorted(old[:4])
    assert tier.stats()["evictions"] == 4
    assert d.load(new + old[4:], range(40, 48)).success
    assert np.array_equal(arr[40:44], arr[8:12]) and np.array_equal(arr[44:48], arr[4:8])
    tier.shutdown()


def test_touch_keeps_blocks(vl, primary, tmp_path):
    mm, view, arr = primary
    tier = make(vl, view, tmp_path, file_size=8 * BS)
    d = Driver(vl, tier)
    old = [okey(i) for i in range(8)]
    assert d.store(old, range(8)).success
    tier.touch(old[:4], vl.base.ReqContext("req-1"))  # the oldest become the youngest
    tier.drain_jobs()
    assert d.store([okey(i) for i in range(8, 12)], range(8, 12)).success
    LR = vl.base.LookupResult
    assert [d.lookup(k) for k in old] == [LR.HIT] * 4 + [LR.MISS] * 4
    tier.shutdown()


def _page_offset(path, row):
    """Where in the page file the bytes of row are."""
    data = np.fromfile(path, np.uint8).reshape(-1, BS)
    (hit,) = [i for i in range(len(data)) if np.array_equal(data[i], row)]
    return hit * BS


def test_changed_bytes_on_disk_are_a_failed_load(vl, primary, tmp_path):
    mm, view, arr = primary
    tier, d, keys = stored(vl, view, tmp_path)
    path = str(tmp_path / "t.pages")
    off = _page_offset(path, arr[2]) + 1000
    with open(path, "r+b") as f:  # one byte of block 2 rots
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    arr[20:24] = 0
    res = d.load(keys, range(20, 24))
    assert res.success is False
    LR = vl.base.LookupResult
    assert d.lookup(keys[2]) is LR.MISS  # never loaded again
    assert d.lookup(keys[1]) is LR.HIT
    tier.shutdown()


def test_integrity_is_the_blocks_tags(vl, primary, tmp_path):
    """A tier made with tags checks its blocks with them (the rot test above
    runs on them): no second store of checksums; integrity=False turns the
    tags off."""
    mm, view, arr = primary
    tier, d, keys = stored(vl, view, tmp_path)
    assert tier._sums is None and not os.path.exists(str(tmp_path / "t.pages.sums"))
    assert tier._data.info()["tags"] == "on"
    tier.shutdown()
    tier = make(vl, view, tmp_path, name="u", integrity=False)
    assert tier._sums is None and tier._data.info()["tags"] == "off"
    tier.shutdown()


def test_a_tier_made_before_tags_keeps_its_checksums(vl, primary, tmp_path):
    """Blocks written before tags (a file that held data when its tags were
    made: legacy, served unverified) stay checked by the checksums' store."""
    mm, view, arr = primary
    from kvpage import Store
    old = Store(str(tmp_path / "t.pages"), 16 * BS, BS, tags=False)  # yesterday's file
    old.put(["x"], [np.ones(BS, np.uint8)])
    old.close()
    os.remove(str(tmp_path / "t.pages.owner"))  # another owner than the tier's
    tier, d, keys = stored(vl, view, tmp_path)
    assert tier._data.info()["tags"] == "legacy" and tier._sums is not None
    path = str(tmp_path / "t.pages")
    with open(path, "r+b") as f:  # rot: seen (by the tag and the checksum)
        f.seek(_page_offset(path, arr[1]) + 5)
        f.write(b"\x99")
    arr[20:24] = 0
    assert d.load(keys, range(20, 24)).success is False
    tier.shutdown()


def test_a_truncated_file_is_a_failed_load(vl, primary, tmp_path):
    mm, view, arr = primary
    tier, d, keys = stored(vl, view, tmp_path)
    os.truncate(str(tmp_path / "t.pages"), 0)
    assert d.load(keys, range(20, 24)).success is False
    tier.shutdown()


def test_without_integrity_the_bytes_are_not_checked(vl, primary, tmp_path):
    """What integrity adds: the same rot, unchecked, loads as data."""
    mm, view, arr = primary
    tier = make(vl, view, tmp_path, integrity=False)
    d = Driver(vl, tier)
    assert d.store([okey(1)], [1]).success
    path = str(tmp_path / "t.pages")
    with open(path, "r+b") as f:
        f.seek(_page_offset(path, arr[1]))
        f.write(b"\0" * 16)
    assert d.load([okey(1)], [30]).success is True
    assert not np.array_equal(arr[30], arr[1])
    tier.shutdown()


def test_later_main_transfer_jobs_and_partial_success(monkeypatch, primary, tmp_path):
    vl = standin.install(monkeypatch, "later")
    mm, view, arr = primary
    tier, d, keys = stored(vl, view, tmp_path)
    res = d.load(keys[:2] + [okey(77)] + keys[2:], range(30, 35))
    assert res.success is False and type(res) is vl.tier_base.JobResult
    assert list(res.successful_keys) == keys  # the loaded ones, for vLLM to keep
    assert np.array_equal(arr[30:32], arr[0:2]) and np.array_equal(arr[33:35], arr[2:4])
    assert res.transfer_time is not None
    tier.shutdown()


def test_shutdown_drops_the_view(vl, tmp_path):
    mm = mmap.mmap(-1, BS * 8)
    view = view_over(mm)
    tier = make(vl, view, tmp_path)
    d = Driver(vl, tier)
    assert d.store([okey(1)], [1]).success
    assert d.load([okey(1)], [2]).success
    tier.touch([okey(1)], None)
    tier.shutdown()
    tier.shutdown()  # idempotent
    assert tier._primary_kv_view is None and tier._flat is None
    view.release()
    mm.close()  # BufferError if anything still held the rows
    j = d.job([okey(1)], [0])
    tier.submit_load(j)  # after shutdown: reported failed, never raised
    assert d.wait([j.job_id])[0].success is False


def test_drain_jobs_waits_for_every_job(vl, primary, tmp_path):
    mm, view, arr = primary
    tier = make(vl, view, tmp_path, file_size=64 * BS)
    d = Driver(vl, tier)
    jobs = [d.job([okey(10 * n + i) for i in range(4)], range(4 * n, 4 * n + 4))
            for n in range(8)]
    for j in jobs:
        tier.submit_store(j)
    tier.drain_jobs()  # then every result is there, without waiting
    done = tier.get_finished_jobs()
    assert sorted(r.job_id for r in done) == [j.job_id for j in jobs]
    assert all(r.success for r in done) and not tier.has_pending_work()
    tier.shutdown()


def test_register_for_factories_without_module_paths(monkeypatch, primary, tmp_path):
    vl = standin.install(monkeypatch, "aug2026", module_paths=False)
    mm, view, arr = primary
    F = vl.factory.SecondaryTierFactory
    conf = {"type": "KvpageTier", "path": str(tmp_path / "r.pages"), "file_size": 8 * BS}
    with pytest.raises(ValueError, match="Unknown secondary tier type"):
        F.create_secondary_tier(conf, view, standin.spec())
    vl.vllm.register()
    vl.vllm.register()  # idempotent
    tier = F.create_secondary_tier(conf, view, standin.spec())
    assert isinstance(tier, vl.vllm.KvpageTier)
    tier.shutdown()


def test_bad_config_is_refused_and_changes_nothing(vl, primary, tmp_path):
    mm, view, arr = primary
    F = vl.factory.SecondaryTierFactory
    with pytest.raises(ValueError, match="'path'"):
        F.create_secondary_tier({"type": "KvpageTier", "module_path": "kvpage.vllm"},
                                view, standin.spec())
    with pytest.raises(TypeError, match="bogus"):
        make(vl, view, tmp_path, bogus=1)
    with pytest.raises(ValueError, match="rows"):
        make(vl, memoryview(mm), tmp_path)  # flat bytes: no rows
    tier = make(vl, view, tmp_path)
    assert Driver(vl, tier).store([okey(1)], [1]).success
    tier.shutdown()
    small = memoryview(mm).cast("b", (ROWS * 2, BS // 2))
    with pytest.raises(KvpageError, match="holds data"):  # another page count
        make(vl, small, tmp_path)
    other = make(vl, small, tmp_path, file_size=8 * BS)  # the same count, other rows
    assert Driver(vl, other).lookup(okey(1)) is vl.base.LookupResult.MISS  # not their bytes
    other.shutdown()
    small.release()
    tier = make(vl, view, tmp_path)
    assert Driver(vl, tier).load([okey(1)], [9]).success and np.array_equal(arr[9], arr[1])
    tier.shutdown()


def test_register_without_vllm_says_so():
    import kvpage.vllm_tier as vt
    if vt._vllm(vt._TIER_FACTORY, "SecondaryTierFactory") is not None:
        pytest.skip("vLLM is installed")
    with pytest.raises(ImportError, match="SecondaryTierFactory"):
        vt.register()
    assert vt.KvpageTier.__mro__[1] is object


def test_o_direct_and_preallocation(vl, primary, tmp_path):
    """direct: the blocks move past the page cache (as the fs tier's); the
    page file's blocks are reserved when the tier opens it."""
    mm, view, arr = primary
    tier, d, keys = stored(vl, view, tmp_path, direct=True)
    st = os.stat(str(tmp_path / "t.pages"))
    assert st.st_blocks * 512 >= 16 * BS  # preallocated, not sparse
    assert d.load(keys, range(20, 24)).success
    assert np.array_equal(arr[20:24], arr[0:4])
    tier.shutdown()
    tier = make(vl, view, tmp_path, name="sparse", preallocate=False)
    assert os.stat(str(tmp_path / "sparse.pages")).st_blocks * 512 < 16 * BS
    tier.shutdown()
