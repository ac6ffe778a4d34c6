"""`make run` and `make install` as a new user sees them: one line that says
what the wait is before the (up to a minute, silent) build, then no build
output on success. Run against the release build directory that
$KVPAGE_BIN is in, which is up to date: the build step only checks it (the
sanitizer builds are skipped: the Makefile's CMAKE_FLAGS would reconfigure
them)."""
import os
import re
import subprocess

import pytest

from kvpserver import require_bin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOISE = re.compile(r"^\[ *\d+%\]|Building C|Linking C|Built target|Entering directory|"
                   r"Scanning dependencies", re.M)


def _release_build():
    build = os.path.dirname(os.path.realpath(require_bin()))
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            cache = f.read()
    except OSError:
        pytest.skip(f"{build} is not a CMake build directory")
    want = ("CMAKE_BUILD_TYPE:STRING=RelWithDebInfo", "KVP_SANITIZE:BOOL=OFF",
            "KVP_TSAN:BOOL=OFF", f"CMAKE_HOME_DIRECTORY:INTERNAL={ROOT}")
    if not all(line in cache.splitlines() for line in want):
        pytest.skip(f"{build} is not this tree's release build")
    return build


def _make(target, build, *args):
    p = subprocess.run(["make", "--no-print-directory", target, f"BUILD={build}", "JOBS=1",
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    return p.returncode, p.stdout, p.stderr


def test_make_run_says_what_it_does(tmp_path):
    build = _release_build()
    rc, out, err = _make("run", build, "ARGS=--help")
    assert rc == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith(f"make run: building kvpage in {build}/ (a minute or more the "
                               f"first time; its output: {build}/build.log)"), out
    assert lines[1] == f"make run: starting {build}/kvpage serve --help", out
    assert "usage: kvpage serve" in out
    assert not NOISE.search(out + err), out + err


def test_make_install_prints_no_build_noise(tmp_path):
    build = _release_build()
    rc, out, err = _make("install", build, f"PREFIX={tmp_path}")
    assert rc == 0, out + err
    assert out.splitlines()[0].startswith(f"make install: building kvpage in {build}/"), out
    assert not NOISE.search(out + err), out + err
    assert "Installing:" in out or "Up-to-date:" in out, out
    assert os.access(tmp_path / "bin" / "kvpage", os.X_OK)
    assert (tmp_path / "include" / "kvpage.h").is_file()
