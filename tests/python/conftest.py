"""Shared fixtures of the Python package's tests: `server`, a real
`kvpage serve` on a free loopback port (tests/integration/kvpserver.py starts
it and, at the end, checks its invariants and clean exit)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import kvpserver  # noqa: E402


@pytest.fixture
def server(tmp_path):
    srv = kvpserver.launch(tmp_path)
    yield srv
    kvpserver.finish(srv)
