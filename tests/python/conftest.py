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


def usrbio_lib():
    """tests/usrbio_emu's stand-in for 3FS's USRBIO library, built beside
    the libkvpage under test (the hf3fs_emu target)."""
    lib = os.environ.get("KVPAGE_LIB") or os.path.join(ROOT, "build", "libkvpage.so")
    emu = os.path.join(os.path.dirname(os.path.realpath(lib)), "libhf3fs_emu.so")
    assert os.path.exists(emu), f"{emu} is missing: build the tree (cmake --build build)"
    return emu


@pytest.fixture(autouse=True)
def _on_emulated_3fs(request, monkeypatch):
    """KVPAGE_TEST_USRBIO=1 (make python-usrbio): every test's tmp_path is
    an emulated 3FS mount, so the page files the tests make there use the
    USRBIO backend through tests/usrbio_emu."""
    if os.environ.get("KVPAGE_TEST_USRBIO") != "1" or "tmp_path" not in request.fixturenames:
        return
    tmp = request.getfixturevalue("tmp_path")
    monkeypatch.setenv("KVPAGE_USRBIO_LIB", usrbio_lib())
    monkeypatch.setenv("KVPAGE_USRBIO_EMU_MOUNT", str(tmp))
    monkeypatch.setenv("KVPAGE_USRBIO_EMU_REG_RESULT", "dup")


@pytest.fixture
def start_server(tmp_path):
    """start_server(*flags) -> a running kvpage serve on a free loopback port
    (tests/integration/kvpserver.py), stopped and checked after the test."""
    import kvpserver
    yield from kvpserver.started_servers(tmp_path)


@pytest.fixture
def server(tmp_path):
    """One kvpage serve with default flags (in memory)."""
    import kvpserver
    srv = kvpserver.launch(tmp_path)
    yield srv
    kvpserver.finish(srv)
