"""Fixtures for the integration tests (see kvpserver.py for the machinery).

start_server(*flags, env=None) starts `kvpage serve` ($KVPAGE_BIN, default
build/kvpage) on a free loopback port with `--data-dir none` and the extra
flags; after the test every server it started is checked (invariants on
/v1/stats), stopped with SIGTERM and must exit 0 with no sanitizer report.
The stderr of the servers is attached to a failing test's report.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvpserver  # noqa: E402
from kvptest import invariants, session, stats  # noqa: E402,F401


@pytest.fixture
def start_server(tmp_path):
    """Factory: start_server(*flags, env=None) -> Server. Every server is
    stopped with SIGTERM after the test and must exit 0."""
    yield from kvpserver.started_servers(tmp_path)


@pytest.fixture
def server(start_server):
    """A server with default flags."""
    return start_server()


@pytest.fixture
def client(server):
    c = server.client()
    yield c
    c.close()


@pytest.fixture(autouse=True)
def _reset_recent():
    kvpserver._RECENT.clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for srv in list(kvpserver._LIVE) + list(kvpserver._RECENT):
            rep.sections.append((f"kvpage serve :{srv.port} {' '.join(srv.flags)} stderr",
                                 srv.stderr() or "(empty)"))
