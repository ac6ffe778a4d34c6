"""The build backend of the kvpage Python package (PEP 517, PEP 660), in the
tree so that `pip install ./python` needs nothing from a package index: no
setuptools, no wheel, only the standard library.

A wheel holds the package kvpage/ and libkvpage.so, built from the source
tree (python/.., or csrc/ in an sdist) with CMake (only the shared
library's target) in a temporary directory. An sdist holds this directory
and, in csrc/, the source tree without its build directories, bench/ and
dot files. Environment:
  KVPAGE_PREBUILT_LIB  put this libkvpage.so into the wheel instead of
                       building one (it must be this tree's version)
  KVPAGE_SOURCE_DIR    the source tree, when pip copied python/ away from
                       its checkout (pip older than 21.3 builds in a copy)
  KVPAGE_DEBUG_DIR     keep the built library's debug info there, as
                       libkvpage.so.debug, which the wheel's library names
                       (.gnu_debuglink): gdb finds it beside the installed
                       library or under its debug-file-directory
The library the backend builds goes into the wheel stripped (about a third
of its size); a KVPAGE_PREBUILT_LIB goes in as it is.
The package's metadata is pyproject.toml's [project] table (its simple
form: strings, lists of strings and license = {text = ...}).
"""
import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "kvpage"
LIBRARY = "libkvpage.so"

# pkg-config modules and programs of CMakeLists.txt -> Debian's package.
DEBIAN = {"liburing": "liburing-dev", "libxxhash": "libxxhash-dev", "libcrypto": "libssl-dev",
          "libmicrohttpd": "libmicrohttpd-dev", "jansson": "libjansson-dev",
          "libcurl": "libcurl4-openssl-dev", "hiredis": "libhiredis-dev", "jsmn": "libjsmn-dev",
          "PkgConfig": "pkg-config", "compiler": "build-essential"}


def _fail(msg):
    # The message on stderr and exit status 1, without a traceback: pip shows it.
    raise SystemExit("kvpage build: " + msg)


def _project():
    """pyproject.toml's [project] table (the subset this package uses)."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, inside = {}, False
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            inside = line == "[project]"
            continue
        if not inside:
            continue
        m = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*(.+)', line)
        table = m and re.fullmatch(r'\{\s*text\s*=\s*(".*")\s*\}', m.group(2))
        try:
            if not m:
                raise ValueError(line)
            out[m.group(1)] = json.loads(table.group(1) if table else m.group(2))
        except ValueError:
            _fail(f"pyproject.toml line {n}: [project] takes only key = \"string\", "
                  f"key = [\"list\", ...] and license = {{text = \"...\"}} here: {line}")
    for key in ("name", "version"):
        if key not in out:
            _fail(f"pyproject.toml: [project] has no {key}")
    return out


def _dist_info(p):
    return f"{p['name']}-{p['version']}.dist-info"


def _metadata(p):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    if "license" in p:
        lines.append(f"License: {p['license']}")
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _tag():
    plat = sysconfig.get_platform()
    if not plat.startswith("linux"):
        _fail(f"libkvpage is Linux only (this platform: {plat})")
    return "py3-none-" + re.sub(r"[-.]", "_", plat)


def _wheel_file(tag):
    return f"Wheel-Version: 1.0\nGenerator: kvpage_build\nRoot-Is-Purelib: false\nTag: {tag}\n"


def _source_tree():
    env = os.environ.get("KVPAGE_SOURCE_DIR")
    sdist = os.path.join(HERE, "csrc")
    root = os.path.abspath(env) if env else sdist if os.path.isdir(sdist) else os.path.dirname(HERE)
    try:
        with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
            if "project(kvpage " in f.read():
                return root
    except OSError:
        pass
    where = "$KVPAGE_SOURCE_DIR" if env else "python/.."
    _fail(f"the kvpage source tree (its CMakeLists.txt) is not at {root} ({where}): pip built "
          f"from a copy of python/ ({HERE}). Install with pip 21.3 or newer (it builds a local "
          f"directory in place), or set KVPAGE_SOURCE_DIR to the checkout, or "
          f"KVPAGE_PREBUILT_LIB to a libkvpage.so built from it (make build: build/{LIBRARY}).")


def _run(cmd, what):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
    except OSError as e:
        _fail(f"{what}: cannot run {cmd[0]}: {e}")
    if p.returncode == 0:
        return
    out = p.stdout
    missing = re.findall(r"(?:No package '|Package ')([A-Za-z0-9_.+-]+)", out)
    missing += ["jsmn"] * ("JSMN_INCLUDE_DIR" in out)
    missing += ["PkgConfig"] * ("Could NOT find PkgConfig" in out)
    missing += ["compiler"] * bool(re.search(r"CMAKE_C_COMPILER|Could not find compiler|C compiler "
                                             r"identification is unknown|is not able to compile",
                                             out))
    names = sorted(set(m for m in missing if m in DEBIAN))
    hint = ""
    if names:
        hint = ("missing: " + ", ".join(n if n != "compiler" else "a C compiler" for n in names) +
                " (Debian: apt-get install " + " ".join(DEBIAN[n] for n in names) + "). ")
    tail = "\n".join(out.splitlines()[-40:])
    _fail(f"{what} failed (exit {p.returncode}): {hint}Its output ends:\n{tail}")


def _build_library(tmp):
    """The path of a libkvpage.so for the wheel: $KVPAGE_PREBUILT_LIB or one built now."""
    pre = os.environ.get("KVPAGE_PREBUILT_LIB")
    if pre:
        if not os.path.isfile(pre):
            _fail(f"$KVPAGE_PREBUILT_LIB is {pre}, which is not a file")
        return pre
    root = _source_tree()
    cmake = shutil.which("cmake")
    if not cmake:
        _fail("cmake is not on PATH: install CMake 3.25 or newer (Debian: apt-get install cmake "
              "build-essential pkg-config), or set KVPAGE_PREBUILT_LIB to a built libkvpage.so")
    build = os.path.join(tmp, "cmake")
    _run([cmake, "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
         f"configuring libkvpage (cmake -S {root} -B {build})")
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(len(os.sched_getaffinity(0)))
    _run([cmake, "--build", build, "--target", "kvpage", "-j", jobs],
         f"building libkvpage (cmake --build {build} --target kvpage)")
    return os.path.join(build, LIBRARY)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(directory, files, tag):
    """files: (name in the wheel, bytes, mode); adds the dist-info and RECORD."""
    p = _project()
    di = _dist_info(p)
    files = list(files) + [(f"{di}/METADATA", _metadata(p).encode(), 0o644),
                           (f"{di}/WHEEL", _wheel_file(tag).encode(), 0o644)]
    record = [_record_line(n, d) for n, d, _ in files] + [f"{di}/RECORD,,"]
    files.append((f"{di}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    name = f"{p['name']}-{p['version']}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, data, mode in files:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name


def _package_files():
    src = os.path.join(HERE, PACKAGE)
    for f in sorted(os.listdir(src)):
        if f.endswith(".py"):
            with open(os.path.join(src, f), "rb") as fh:
                yield f"{PACKAGE}/{f}", fh.read(), 0o644


def _strip(lib, tmp):
    """A stripped copy of the built library (its symbol table and debug info
    gone, its exported symbols kept); with $KVPAGE_DEBUG_DIR the debug info
    is kept there and the copy names it."""
    out = os.path.join(tmp, LIBRARY + ".stripped")
    debug_dir = os.environ.get("KVPAGE_DEBUG_DIR")
    tool = shutil.which("objcopy") and shutil.which("strip")
    if not tool:
        _fail("strip and objcopy are not on PATH: install binutils (Debian: apt-get install "
              "binutils), or set KVPAGE_PREBUILT_LIB to a built libkvpage.so")
    if debug_dir:
        os.makedirs(debug_dir, exist_ok=True)
        debug = os.path.join(os.path.abspath(debug_dir), LIBRARY + ".debug")
        _run(["objcopy", "--only-keep-debug", lib, debug], f"keeping the debug info in {debug}")
    _run(["strip", "--strip-unneeded", "-o", out, lib], f"stripping {lib}")
    if debug_dir:
        _run(["objcopy", f"--add-gnu-debuglink={debug}", out], f"naming {debug} in the library")
    return out


def _library_bytes():
    with tempfile.TemporaryDirectory(prefix="kvpage-build-") as tmp:
        lib = _build_library(tmp)
        if not os.environ.get("KVPAGE_PREBUILT_LIB"):
            lib = _strip(lib, tmp)
        with open(lib, "rb") as f:  # follows the SONAME links
            return f.read()


# PEP 517 hooks

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p = _project()
    di = os.path.join(metadata_directory, _dist_info(p))
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(p))
    with open(os.path.join(di, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file(_tag()))
    return _dist_info(p)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = _tag()
    lib = (f"{PACKAGE}/{LIBRARY}", _library_bytes(), 0o755)
    return _write_wheel(wheel_directory, list(_package_files()) + [lib], tag)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A .pth file naming python/, and the library built into python/kvpage/
    (where the package finds its own copy); rerun after changing the C code."""
    tag = _tag()
    data = _library_bytes()
    target = os.path.join(HERE, PACKAGE, LIBRARY)
    with open(target + ".tmp", "wb") as f:
        f.write(data)
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
    pth = (f"{PACKAGE}.pth", (HERE + "\n").encode(), 0o644)
    return _write_wheel(wheel_directory, [pth], tag)


def get_requires_for_build_sdist(config_settings=None):
    return []


# Not in an sdist's csrc/: what building leaves, the benchmarks, this package.
_SKIP_TOP = {"bench", "python", "kvpage-data"}
_SKIP = {"__pycache__", ".pytest_cache"}


def _sdist_members(root):
    """(path on disk, name in the sdist) for the package and the C tree."""
    for f in ("pyproject.toml", "kvpage_build.py"):
        yield os.path.join(HERE, f), f
    for name, _, _ in _package_files():
        yield os.path.join(HERE, name), name
    for top in sorted(os.listdir(root)):
        if top.startswith(".") or top in _SKIP_TOP or top == "build" or top.startswith("build-"):
            continue
        path = os.path.join(root, top)
        if os.path.isfile(path):
            yield path, "csrc/" + top
            continue
        for d, dirs, files in os.walk(path):
            dirs[:] = sorted(x for x in dirs if x not in _SKIP)
            for f in sorted(files):
                if not f.endswith(".pyc"):
                    full = os.path.join(d, f)
                    yield full, "csrc/" + os.path.relpath(full, root)


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{p['name']}-{p['version']}"
    root = _source_tree()
    pkg_info = _metadata(p).encode()
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        def reset(info):
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            return info
        for path, arc in _sdist_members(root):
            t.add(path, f"{base}/{arc}", recursive=False, filter=reset)
        info = reset(tarfile.TarInfo(f"{base}/PKG-INFO"))
        info.size, info.mode = len(pkg_info), 0o644
        t.addfile(info, io.BytesIO(pkg_info))
    return name
