"""`pip install ./python` works offline with Debian's Python (a venv with the
system's site packages: its own Python is externally managed) and with any
other CPython >= 3.9 (a plain venv): the in-tree build backend
(python/kvpage_build.py) needs nothing from a package index, builds
libkvpage.so from the tree and puts it into the package, which loads it
from anywhere with $KVPAGE_LIB unset. Release run only: pip and CMake under
a preloaded sanitizer runtime would test neither."""
import base64
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")

pytestmark = pytest.mark.skipif("san" in os.environ.get("LD_PRELOAD", ""),
                                reason="pip under a preloaded sanitizer runtime: the release run "
                                       "covers it")

# Run in the venv, cwd outside the tree: the package and its library come
# from the venv's site packages; a page file round trip without numpy.
CHECK = r"""
import os, sys, sysconfig, kvpage
site = os.path.realpath(sysconfig.get_paths()["platlib"]) + os.sep
where = sys.argv[1]
assert os.path.realpath(kvpage.__file__).startswith(site), (kvpage.__file__, site)
if where == "bundled":
    assert os.path.realpath(kvpage.library_path).startswith(site), (kvpage.library_path, site)
    assert os.path.basename(kvpage.library_path) == "libkvpage.so", kvpage.library_path
with kvpage.PageFile("rt.pages", 1 << 20, 4096, entries=2) as pf:
    a, b = bytearray(b"A" * 4096), bytearray(b"b" * 1000)
    assert pf.write([0, 8192], [a, b]) == [4096, 1000]
    c, d = bytearray(4096), bytearray(1000)
    assert pf.read([0, 8192], [c, d]) == [4096, 1000]
    assert c == a and d == b
print(kvpage.library_path)
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVPAGE_LIB", "KVPAGE_PREBUILT_LIB", "KVPAGE_SOURCE_DIR", "PYTHONPATH")}
    env.update(extra)
    return env


def _release_lib():
    return os.environ.get("KVPAGE_LIB") or os.path.join(ROOT, "build", "libkvpage.so")


def _venv(python, path, system_site):
    flags = ["--system-site-packages"] if system_site else []
    subprocess.run([python, "-m", "venv"] + flags + [str(path)], check=True, timeout=300,
                   env=_env())
    return str(path / "bin" / "python")


def _pip_install(py, args, env):
    p = subprocess.run([py, "-m", "pip", "install", "--no-index", "-q"] + args,
                       capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout + p.stderr


def _check(py, cwd, where="bundled", **env):
    p = subprocess.run([py, "-c", CHECK, where], capture_output=True, text=True, cwd=str(cwd),
                       env=_env(**env), timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def _second_python():
    """A CPython >= 3.9 with venv and pip that is not this one (Debian's):
    the first python3 on PATH, else pyenv's, newest first. None if none."""
    cands = [shutil.which("python3")]
    pyenv = os.path.join(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv")), "versions")
    cands += sorted(glob.glob(os.path.join(pyenv, "3.*", "bin", "python3")), reverse=True)
    mine = os.path.realpath(sys.executable)
    probe = ("import sys, ensurepip, venv; assert sys.version_info >= (3, 9); "
             "assert sys.implementation.name == 'cpython'; print(sys.executable)")
    for c in cands:
        if not c:
            continue
        p = subprocess.run([c, "-c", probe], capture_output=True, text=True, timeout=60,
                           env=_env())
        if p.returncode == 0 and os.path.realpath(p.stdout.strip()) != mine:
            return p.stdout.strip()
    return None


def test_pip_install_debian_python_builds_and_bundles_the_library(tmp_path):
    # The real build: default build isolation, CMake from the tree.
    py = _venv(sys.executable, tmp_path / "venv", system_site=True)
    _pip_install(py, [PYTHON_DIR], _env())
    bundled = _check(py, tmp_path)
    # its dependencies (liburing, libcurl, libcrypto, ...) from the system, no
    # run path into the temporary build directory
    ldd = subprocess.run(["ldd", bundled], capture_output=True, text=True, timeout=60).stdout
    assert "liburing" in ldd and "libcurl" in ldd and "not found" not in ldd, ldd
    dyn = subprocess.run(["readelf", "-d", bundled], capture_output=True, text=True,
                         timeout=60).stdout
    assert "SONAME" in dyn and "kvpage-build-" not in dyn, dyn
    # $KVPAGE_LIB still comes first
    lib = _release_lib()
    assert _check(py, tmp_path, "env", KVPAGE_LIB=lib) == lib
    # one that does not load: the next candidate, the package's own copy
    assert _check(py, tmp_path, "bundled", KVPAGE_LIB=str(tmp_path / "nowhere.so")) == bundled
    # --no-build-isolation works too (here with a prebuilt library: no second build)
    _pip_install(py, ["--no-build-isolation", "--force-reinstall", PYTHON_DIR],
                 _env(KVPAGE_PREBUILT_LIB=lib))
    assert _check(py, tmp_path) == bundled
    # without any library: an ImportError naming every path tried
    os.unlink(bundled)
    p = subprocess.run([py, "-c", "import kvpage"], capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=120,
                       env=_env(KVPAGE_LIB=str(tmp_path / "nowhere.so"), LD_LIBRARY_PATH=""))
    if p.returncode == 0:  # an installed copy was found (make install on this machine)
        return
    assert "cannot load libkvpage.so; tried:" in p.stderr, p.stderr
    assert "nowhere.so ($KVPAGE_LIB)" in p.stderr and bundled in p.stderr, p.stderr


def test_pip_install_with_a_second_interpreter(tmp_path):
    other = _second_python()
    if other is None:
        pytest.skip("no second CPython >= 3.9 with venv and pip (python3 on PATH, ~/.pyenv)")
    # A plain venv (no numpy: the check uses bytearrays), default build
    # isolation and no index: from the tree (the library the release
    # build's: the first test builds one from the tree) ...
    py = _venv(other, tmp_path / "venv", system_site=False)
    _pip_install(py, [PYTHON_DIR], _env(KVPAGE_PREBUILT_LIB=_release_lib()))
    _check(py, tmp_path)
    # ... and from an sdist, whose csrc/ has all that CMake needs (a real build)
    p, out = _hook(tmp_path, "build_sdist")
    assert p.returncode == 0, p.stderr
    _pip_install(py, ["--force-reinstall", str(out / p.stdout.strip())], _env())
    _check(py, tmp_path)


def test_editable_install_uses_the_source_and_its_library(tmp_path):
    src = tmp_path / "src"  # a copy: the editable build writes the library into it
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    py = _venv(sys.executable, tmp_path / "venv", system_site=False)
    _pip_install(py, ["-e", str(src)], _env(KVPAGE_PREBUILT_LIB=_release_lib()))
    code = "import kvpage; print(kvpage.__file__); print(kvpage.library_path)"
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                       env=_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(src / "kvpage" / "__init__.py"),
                                str(src / "kvpage" / "libkvpage.so")]


def _hook(tmp_path, hook, cwd=PYTHON_DIR, **env):
    code = f"import kvpage_build, sys; print(kvpage_build.{hook}(sys.argv[1]))"
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-B", "-c", code, str(out)], capture_output=True,
                          text=True, cwd=str(cwd), env=_env(**env), timeout=600), out


def test_the_wheel_is_complete_and_its_record_true(tmp_path):
    p, out = _hook(tmp_path, "build_wheel", KVPAGE_PREBUILT_LIB=_release_lib())
    assert p.returncode == 0, p.stderr
    name = p.stdout.strip()
    assert name.startswith("kvpage-0.1.0-py3-none-linux_") and name.endswith(".whl"), name
    with zipfile.ZipFile(out / name) as z:
        names = z.namelist()
        record = z.read("kvpage-0.1.0.dist-info/RECORD").decode().splitlines()
        assert sorted(r.split(",")[0] for r in record) == sorted(names)
        for r in record:
            path, digest, size = r.split(",")
            if path.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == ("sha256=" + want, len(data)), path
        wheel = z.read("kvpage-0.1.0.dist-info/WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel and f"Tag: {name[13:-4]}" in wheel
        meta = z.read("kvpage-0.1.0.dist-info/METADATA").decode()
        assert "Name: kvpage\nVersion: 0.1.0\n" in meta and "Requires-Python: >=3.9" in meta
        with open(_release_lib(), "rb") as f:
            assert z.read("kvpage/libkvpage.so") == f.read()
        assert (z.getinfo("kvpage/libkvpage.so").external_attr >> 16) & 0o111
        assert "kvpage/__init__.py" in names and "kvpage/compat.py" in names
        assert not [n for n in names if "kvpage_build" in n or n.endswith(".pyc")]
    # prepare_metadata_for_build_wheel gives the same METADATA without a build
    p, out = _hook(tmp_path, "prepare_metadata_for_build_wheel", PATH="/nonexistent")
    assert p.returncode == 0 and p.stdout.strip() == "kvpage-0.1.0.dist-info", p.stderr
    assert (out / "kvpage-0.1.0.dist-info" / "METADATA").read_text() == meta


def test_build_errors_say_what_is_missing(tmp_path):
    # no cmake on PATH
    p, _ = _hook(tmp_path, "build_wheel", PATH="/nonexistent")
    assert p.returncode == 1 and "cmake is not on PATH" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    # a -dev library pkg-config cannot find (CMake stops at the first: liburing)
    p, _ = _hook(tmp_path, "build_wheel", PKG_CONFIG_LIBDIR=str(tmp_path / "nothing"),
                 PKG_CONFIG_PATH="")
    assert p.returncode == 1, p.stderr
    assert "missing: liburing (Debian: apt-get install liburing-dev)" in p.stderr, p.stderr
    # no C compiler
    p, _ = _hook(tmp_path, "build_wheel", CC=str(tmp_path / "no-cc"))
    assert p.returncode == 1 and "missing: a C compiler" in p.stderr, p.stderr
    # python/ copied away from its checkout (what pip < 21.3 does): say so
    src = tmp_path / "copy"
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    p, _ = _hook(tmp_path, "build_wheel", cwd=src)
    assert p.returncode == 1 and "KVPAGE_SOURCE_DIR" in p.stderr, p.stderr
    assert f"from a copy of python/ ({src})" in p.stderr, p.stderr


def _sections(path):
    out = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return set(re.findall(r"\]\s+(\.\S+)", out))


def _exports(path):
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return sorted(line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip())


def test_the_built_library_is_stripped_and_its_debug_info_kept_apart(tmp_path):
    """The wheel's libkvpage.so, built by the backend, has no symbol table or
    debug info (a third of the release build's size) and the same exports;
    with KVPAGE_DEBUG_DIR the debug info is there and the library names it."""
    debug = tmp_path / "debug"
    p, out = _hook(tmp_path, "build_wheel", KVPAGE_DEBUG_DIR=str(debug))
    assert p.returncode == 0, p.stderr
    with zipfile.ZipFile(out / p.stdout.strip()) as z:
        lib = tmp_path / "libkvpage.so"
        lib.write_bytes(z.read("kvpage/libkvpage.so"))
    release = _release_lib()
    secs = _sections(lib)
    assert ".symtab" not in secs and not [s for s in secs if s.startswith(".debug")], secs
    assert ".gnu_debuglink" in secs, secs
    assert "stripped" in subprocess.run(["file", "-L", str(lib)], capture_output=True, text=True,
                                        timeout=60).stdout
    assert os.path.getsize(lib) * 2 < os.path.getsize(release)
    assert _exports(lib) == _exports(release) and "kvp_store_open" in _exports(lib)
    assert ".debug_info" in _sections(debug / "libkvpage.so.debug")
    # the section ends with a CRC of 4 bytes, which are not always UTF-8
    link = subprocess.run(["readelf", "--string-dump=.gnu_debuglink", str(lib)],
                          capture_output=True, text=True, errors="replace", timeout=60).stdout
    assert "libkvpage.so.debug" in link, link
    # it loads and works
    py = subprocess.run([sys.executable, "-c", "import kvpage; print(kvpage.library_path)"],
                        capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                        env=_env(KVPAGE_LIB=str(lib), PYTHONPATH=PYTHON_DIR))
    assert py.returncode == 0 and py.stdout.strip() == str(lib), py.stderr
