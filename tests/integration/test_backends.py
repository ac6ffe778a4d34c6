"""The backends as the library lists them, and everything that asks it
instead of keeping a copy: `kvpage backends` (and its --names for scripts),
bash completion of --backend and --meta, the man page's BACKENDS; and
kvp_meta_info over a real Redis, whose promise follows its AOF settings."""
import ctypes
import json
import os
import re
import subprocess
import sys

import pytest

import redisfix
from kvpserver import require_bin

HERE = os.path.dirname(os.path.abspath(__file__))
COMPLETION = os.path.join(HERE, "..", "..", "contrib", "bash-completion", "kvpage")
SCHEMES = ["mem:", "file:", "http://", "redis://", "redis-sentinel://"]


def kvp(*args):
    p = subprocess.run([require_bin()] + list(args), capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def names(which):
    rc, out, err = kvp("backends", "--names", which)
    assert rc == 0 and err == "", err
    return out.split()


def lib():
    """libkvpage.so's declarations (python/kvpage/_lib.py), of $KVPAGE_LIB
    or the one beside the binary."""
    os.environ.setdefault("KVPAGE_LIB",
                          os.path.join(os.path.dirname(require_bin()), "libkvpage.so"))
    import sys
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    from kvpage import _lib
    return _lib


def lib_env():
    """The environment of a Python that loads the library: a sanitized
    build's libkvpage.so needs its sanitizer's runtime loaded first
    (LD_PRELOAD, as `make python-test` does); pytest here may run without."""
    env = dict(os.environ)
    path = os.environ.get("KVPAGE_LIB") or os.path.join(os.path.dirname(require_bin()),
                                                        "libkvpage.so")
    env["KVPAGE_LIB"] = path
    out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        name = line.strip().split(" ")[0]
        if name.startswith(("libasan.so", "libtsan.so")) and "=>" in line:
            env["LD_PRELOAD"] = line.split("=>")[1].split()[0]
            env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    return env


def in_child(name, *args):
    """Runs this file's function name(*args) in a new Python with the
    library loaded as lib_env says: its assertions fail the test here."""
    p = subprocess.run([sys.executable, os.path.abspath(__file__), name, json.dumps(args)],
                       capture_output=True, text=True, timeout=120, env=lib_env(), cwd=HERE)
    assert p.returncode == 0, p.stdout + p.stderr


def test_backends_lists_what_the_library_has():
    in_child("lists_what_the_library_has")


def lists_what_the_library_has():
    _lib = lib()
    io = [_lib.pagefile_backend_name(b).decode() for b in range(16)]
    assert names("io") == io[:io.index("?")]
    assert {"auto", "psync", "uring", "usrbio"} <= set(names("io"))
    assert names("meta") == SCHEMES
    assert names("remote") == ["http://", "redis://", "redis-sentinel://"]
    rc, out, err = kvp("backends")
    assert rc == 0, err
    for n in names("io") + SCHEMES:
        assert f"  {n}" in out, n
    # a line for people of each page-I/O backend, from the library, as the
    # metadata backends have theirs; bench io --help lists the same
    rc, bench, _ = kvp("bench", "io", "--help")
    assert rc == 0
    for b, n in enumerate(names("io")):
        d = _lib.pagefile_backend_description(b).decode()
        assert len(d) > 20 and f"  {n:<10} {d}\n" in out, (n, d, out)
        assert f"      {n:<7} {d}\n" in bench, (n, bench)
    # and bench io --help names no backend but in what the library gives
    generated = ("|".join(names("io")), " or ".join([", ".join(names("io")[1:-1]),
                                                      names("io")[-1]]))
    for line in bench.splitlines():
        if any(re.search(rf"\b{n}\b", line.lower()) for n in names("io")[1:]):
            assert any(g in line for g in generated) or \
                any(line.endswith(_lib.pagefile_backend_description(b).decode())
                    for b in range(len(names("io")))), line
    assert "(redis, remote)" in out and "(in-process)" in out, out
    rc, out, err = kvp("backends", "--names", "x")
    assert rc == 2 and "--names takes io, meta or remote" in err, err
    assert kvp("backends", "extra")[0] == 2
    rc, out, _ = kvp("backends", "--help")
    assert rc == 0 and out.startswith("usage: kvpage backends") and "example" in out
    assert kvp("help", "backends")[1] == out
    assert "  backends" in kvp("help")[1]


def complete(*words):
    line = " ".join(f"'{w}'" for w in (require_bin(),) + words)
    script = (f"source '{COMPLETION}'; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
              "_kvpage; printf '%s\\n' \"${COMPREPLY[@]}\"")
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)  # a sanitizer's runtime, for kvpage, not for bash
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                       cwd="/", env=env)
    assert p.returncode == 0, p.stderr
    return set(p.stdout.split())


def test_serve_help_lists_the_remote_backends():
    """serve --help's --meta and its refusal name the library's remote
    backends, not a list of its own."""
    rc, out, _ = kvp("serve", "--help")
    assert rc == 0
    flag = out[out.index("  --meta LOCATION"):out.index("  --fsync")]
    listed = [line.split()[0] for line in flag.splitlines()[3:]]
    assert listed == names("remote"), flag
    assert "Redis instead" not in flag
    rc, _, err = kvp("serve", "--listen", "127.0.0.1:0", "--meta", "mem:")
    assert rc == 2 and ", ".join(n + "..." for n in names("remote")[:-1]) in err, err


def test_completion_asks_kvpage_backends():
    assert complete("bench", "io", "--backend", "") == set(names("io"))
    assert complete("put", "--meta", "re") == {"redis://", "redis-sentinel://"}
    assert set(SCHEMES) <= complete("clear", "--meta", "")
    # serve --meta takes a remote location only
    assert set(names("remote")) <= complete("serve", "--meta", "")
    assert not {"mem:", "file:"} & complete("serve", "--meta", "")
    assert "backends" in complete("")
    assert complete("backends", "--names", "") == {"io", "meta", "remote"}


def test_man_page_names_every_backend():
    page = os.path.join(os.path.dirname(require_bin()), "kvpage.1")
    if not os.path.isfile(page):
        pytest.fail(f"{page} not built (scdoc missing? scripts/install-deps)", pytrace=False)
    env = dict(os.environ, MANWIDTH="200", LC_ALL="C.UTF-8")
    env.pop("LD_PRELOAD", None)  # a sanitizer's runtime, for kvpage, not for man
    text = subprocess.run(["man", "--nh", "--nj", "-l", page], capture_output=True, text=True,
                          env=env, timeout=60).stdout
    section = text[text.index("\nBACKENDS"):text.index("\nINTEGRITY TAGS")]
    for n in names("io") + SCHEMES:
        assert n in section, n
    assert "kvpage backends" in text


@pytest.mark.parametrize("aof, level, text, loss", [
    (["--appendonly", "no"], 0, "appendonly no, appendfsync everysec",
     "everything since its last snapshot"),
    (["--appendonly", "yes", "--appendfsync", "everysec"], 1,
     "appendonly yes, appendfsync everysec", "up to about a second of changes"),
    (["--appendonly", "yes", "--appendfsync", "always"], 2, "appendonly yes, appendfsync always",
     None),
])
def test_meta_info_of_redis(aof, level, text, loss):
    in_child("meta_info_of_redis", aof, level, text, loss)


def meta_info_of_redis(aof, level, text, loss):
    _lib = lib()
    r = redisfix.Redis(aof).start()
    m = ctypes.c_void_p()
    try:
        err = _lib.Error()
        rc = _lib.meta_open_at(r.url(prefix="info").encode(), None, ctypes.byref(m),
                               ctypes.byref(err))
        assert rc == 0, err.msg
        i = _lib.MetaInfo(info_size=ctypes.sizeof(_lib.MetaInfo))
        assert _lib.meta_info(m, ctypes.byref(i)) == 0
        assert (i.name, i.scheme, i.remote, i.holder) == (b"redis", b"redis", 1, b"Redis")
        assert (i.durability, i.durability_text.decode()) == (level, text)
        assert i.durability_loss == (loss.encode() if loss else None)
        assert i.durability_wanted == b"appendonly yes and appendfsync always"
        # CONFIG GET refused: unknown, and why
        r.cli("CONFIG", "SET", "appendonly", "no")
        r.cli("ACL", "SETUSER", "default", "-config")
        assert _lib.meta_info(m, ctypes.byref(i)) == 0
        assert i.durability == -1 and i.durability_text.startswith(b"unknown"), i.durability_text
    finally:
        _lib.meta_close(m)
        r.close()


if __name__ == "__main__":  # in_child's new Python
    globals()[sys.argv[1]](*json.loads(sys.argv[2]))
