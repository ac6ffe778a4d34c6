"""The store (kvpage/store.h) over a remote kvpage serve: the C test program
test_store (built beside the kvpage binary) runs its whole suite with
KVP_TEST_META=http://127.0.0.1:PORT, so every store keeps its metadata on
this server (each test in its own pool). The server's invariants on
/v1/stats are checked when the fixture stops it."""
import os
import subprocess

import pytest

from kvpserver import require_bin
from kvptest import invariants


def test_store_suite_on_a_remote_server(tmp_path, start_server):
    prog = os.path.join(os.path.dirname(require_bin()), "test_store")
    if not os.path.isfile(prog):
        pytest.fail(f"{prog} not built (it is built beside the kvpage binary)", pytrace=False)
    # --read-grace-ms 0: the eviction test evicts pages it has just read,
    # as the embedded run sets in its own metadata options.
    srv = start_server("--data-dir", tmp_path / "srv", "--read-grace-ms", "0")
    env = dict(os.environ, KVP_TEST_META=srv.url())
    p = subprocess.run([prog], env=env, capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert " 0 failed" in p.stdout
    st = srv.stats()
    pools = {n["pool"] for n in st["namespaces"]}
    # every test's stores were on this server
    assert {"rt_a", "hits", "fail", "miss", "evict", "tp", "reopen", "threads"} <= pools, pools
    invariants(st)
