"""The Python package's tests run against the source tree's python/kvpage
(put first on sys.path) and the library $KVPAGE_LIB (default: the build
tree's, which the package finds by itself)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))  # kvpserver: start kvpage serve

import pytest  # noqa: E402


@pytest.fixture
def start_server(tmp_path):
    """start_server(*flags) -> a running kvpage serve on a free loopback port
    (tests/integration/kvpserver.py), stopped and checked after the test."""
    import kvpserver
    started = []

    def start(*flags):
        srv = kvpserver.launch(tmp_path, flags, None)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        kvpserver.finish(srv)


@pytest.fixture
def server(tmp_path):
    """One kvpage serve with default flags (in memory)."""
    import kvpserver
    srv = kvpserver.launch(tmp_path)
    yield srv
    kvpserver.finish(srv)
