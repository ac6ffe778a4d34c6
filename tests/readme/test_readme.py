"""Every fenced block of README.md is run (or checked) here, as a new user
would run it, so that the README cannot drift from what works.

Each block is preceded by a marker line `<!-- readme-test: KIND -->` that
says how it is run; a block without one fails the test. KIND is one of:

  sh            bash -e in an empty directory, `kvpage` first on PATH
  sh-checkout   bash -e at the top of the source checkout (make, ./python)
  sh-servers    bash -e: the block starts servers in the background; then
                every `kvpage serve --listen` of it must answer /healthz,
                and a key put through the first exists through the others
  sh-sentinel   bash -e, the block's server started in the background over a
                master, a replica and three redis-sentinels (redisfix.py)
                that stand for the block's sentinel addresses; it must
                answer /healthz and take a put
  python        Debian's python3 with the source tree's package
  c             compiled (a fragment inside main()) against the build tree
  pkg-config    the build installed into a temporary prefix, the block run
                with app.c = the README's first C block
  cmake         the block appended to a CMakeLists.txt of app.c
  prometheus    promtool check config
  sglang        the extra-config JSON given to kvpage.sglang's backend
                (SGLang's own classes are stand-ins, tests/python)
  vllm          the kv-transfer-config JSON given to kvpage.vllm's
                connector (vLLM's classes are stand-ins, tests/python)
  vllm-stock    stock vLLM's JSON checked, the block's kvpage serve asked
                as vLLM's metadata client asks it
  sglang-stock  stock SGLang's JSON file checked, its metadata server asked
                as SGLang's metadata client asks it
  not run: WHY  not runnable in a test (WHY says what covers it instead)

Machine-specific names are replaced before a block runs, and nothing else:
/data/ and /mnt/3fs/ become directories under the test's temporary
directory, ~/kvpage-venv a venv there; every http://HOST:18000 (HOST:
127.0.0.1, localhost, HOST, kvpage-host, 10.0.0.5) becomes a kvpage serve the
test started on a free port; 6379 and 18001 free ports; /var/lib/redis a
temporary directory. The environment a block gets is the README's own plus
KVPAGE_LIB (the library under test) where the block does not install one.
"""
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
README = os.path.join(ROOT, "README.md")
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kvpserver  # noqa: E402

BIN = os.path.abspath(kvpserver.BIN)
BUILD = os.path.dirname(BIN)
LIB = os.environ.get("KVPAGE_LIB") or os.path.join(BUILD, "libkvpage.so")
PYTHON = "/usr/bin/python3"
KINDS = ("sh", "sh-checkout", "sh-servers", "sh-sentinel", "python", "c", "pkg-config", "cmake", "prometheus",
         "sglang", "vllm", "vllm-stock", "sglang-stock")
MARK = re.compile(r"^\s*<!-- readme-test: (.*?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def blocks():
    """[(line, kind, lang, text)] of README.md's fenced blocks."""
    out, lines, i = [], open(README, encoding="utf-8").read().split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln
                         for ln in lines[i + 1:j])
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = MARK.match(lines[k]) if k >= 0 else None
        out.append((start + 1, mark.group(1) if mark else None, lang, body + "\n"))
        i = j + 1
    return out


BLOCKS = blocks()


def test_every_block_says_how_it_is_run():
    bad = [f"README.md:{ln} ({lang or 'plain'}): marker {kind!r}" for ln, kind, lang, _ in BLOCKS
           if kind is None or not (kind in KINDS or re.match(r"not run: \S", kind))]
    assert not bad, "blocks without a known readme-test marker:\n" + "\n".join(bad)
    assert sum(1 for b in BLOCKS if b[1] in KINDS) >= 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Env:
    """A temporary world for one block: directories, a server, ports."""

    def __init__(self, tmp_path):
        self.tmp = str(tmp_path)
        self.servers = []
        self.port = None
        self.ports = {}

    def server(self):
        if self.port is None:
            srv = kvpserver.launch(self.tmp, (), None)
            self.servers.append(srv)
            self.port = srv.port
        return self.port

    def sub(self, text):
        t = self.tmp
        for d in ("data", "mnt/3fs"):
            if f"/{d}/" in text:
                os.makedirs(os.path.join(t, d), exist_ok=True)
                text = re.sub(rf"(?<![\w.~/-])/{d}/", f"{t}/{d}/", text)
        text = text.replace("~/kvpage-venv", f"{t}/kvpage-venv")
        text = text.replace("/var/lib/redis", f"{t}/redis")
        if "/var/lib/redis" in text or f"{t}/redis" in text:
            os.makedirs(os.path.join(t, "redis"), exist_ok=True)
        # Servers on loopback only: a block that starts its own servers
        # (--listen) gets free ports for them; one that talks to a server
        # gets the test's.
        text = text.replace("0.0.0.0:", "127.0.0.1:")
        hosts = r"(?:127\.0\.0\.1|localhost|HOST|kvpage-host|10\.0\.0\.5)"
        if "--listen" not in text and re.search(rf"{hosts}:18000", text):
            text = re.sub(rf"{hosts}:18000", f"127.0.0.1:{self.server()}", text)
        for fixed in ("6379", "18000", "18001"):
            if re.search(rf"\b{fixed}\b", text):
                self.ports.setdefault(fixed, free_port())
                text = re.sub(rf"\b{fixed}\b", str(self.ports[fixed]), text)
        return text

    def env(self):
        e = dict(os.environ)
        e["PATH"] = BUILD + os.pathsep + e.get("PATH", "")
        e["KVPAGE_LIB"] = LIB
        e["PYTHONPATH"] = os.path.join(ROOT, "python")
        e["HOME"] = self.tmp
        return e

    def close(self):
        for srv in self.servers:
            kvpserver.finish(srv)


@pytest.fixture
def world(tmp_path):
    w = Env(tmp_path)
    yield w
    w.close()


def run(cmd, world, timeout=300, **kw):
    cwd, env = kw.pop("cwd", None) or world.tmp, kw.pop("env", None) or world.env()
    p = subprocess.run(cmd, cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def c_program(text):
    """A C block as a whole program: a fragment goes inside main()."""
    if re.search(r"\bint\s+main\s*\(", text):
        return text
    inc = [ln for ln in text.split("\n") if ln.startswith("#include")]
    body = [ln for ln in text.split("\n") if not ln.startswith("#include")]
    return ("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n" + "\n".join(inc) +
            "\nint main(void)\n{\n" + "\n".join(body) + "\nreturn 0;\n}\n")


def first_c_block():
    return next(b[3] for b in BLOCKS if b[1] == "c")


def compile_and_run(world, text, name="app"):
    src = os.path.join(world.tmp, name + ".c")
    with open(src, "w") as f:
        f.write(c_program(text))
    exe = os.path.join(world.tmp, name)
    run(["cc", "-std=c11", "-Wall", "-Werror", "-o", exe, src, "-I", os.path.join(ROOT, "include"),
         "-L", os.path.dirname(LIB), "-l:" + os.path.basename(LIB),
         "-Wl,-rpath," + os.path.dirname(LIB)], world)
    return run([exe], world)


def run_sh(world, text, cwd=None):
    script = os.path.join(world.tmp, "block.sh")
    with open(script, "w") as f:
        f.write("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + text)
    return run(["bash", script], world, timeout=600, cwd=cwd or world.tmp)


# vLLM's batch_exists through another server: the key put through the first.
EXISTS_VIA = """import json, sys, urllib.request as u
r = u.urlopen(u.Request(sys.argv[1] + "/keys/batch_exists", json.dumps({"keys": ["K"]}).encode(),
                        {"Content-Type": "application/json"}), timeout=10)
assert json.load(r)["exists"] == [True], "K put through the first server is not there"
"""
WAIT_READY = """wait_ready() {
  for _ in $(seq 300); do
    /usr/bin/python3 -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=1)' \\
      "$1/healthz" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$1 did not answer /healthz within 30 s" >&2; return 1
}
"""


def install_prefix(world):
    prefix = os.path.join(world.tmp, "prefix")
    run(["cmake", "--install", BUILD, "--prefix", prefix], world)
    return prefix


def check_block(world, kind, text):
    if kind == "sh":
        run_sh(world, world.sub(text))
    elif kind == "sh-servers":
        text = world.sub(text)
        urls = ["http://" + a for a in re.findall(r"kvpage serve --listen (\S+)", text)]
        assert len(urls) >= 2, "the block starts no kvpage serve"
        check = "\n".join(
            [f"wait_ready {u}" for u in urls] +
            ["head -c 1000 /dev/urandom > p.bin",
             f"kvpage put --file a.pages --file-size 1M --page-size 4K --meta {urls[0]} K p.bin"] +
            [f"/usr/bin/python3 -c {shlex.quote(EXISTS_VIA)} {u}" for u in urls[1:]])
        run_sh(world, WAIT_READY + text + check + "\n")
    elif kind == "sh-sentinel":
        import redisfix
        found = re.search(r"redis-sentinel://([\d.:,]+)/(\w+)", text)
        assert found, "the block names no redis-sentinel:// location"
        st = redisfix.Sentinels(name=found.group(2)).start()
        try:
            text = text.replace(found.group(1), ",".join(f"127.0.0.1:{p}" for _, p in st.sentinels))
            text = world.sub(text)
            url = "http://" + re.search(r"kvpage serve --listen (\S+)", text).group(1)
            run_sh(world, WAIT_READY + text.rstrip() + " &\n" + f"wait_ready {url}\n" +
                   "head -c 1000 /dev/urandom > p.bin\n"
                   f"kvpage put --file a.pages --file-size 1M --page-size 4K --meta {url} K p.bin\n"
                   f"/usr/bin/python3 -c {shlex.quote(EXISTS_VIA)} {url}\n")
        finally:
            st.close()
    elif kind == "sh-checkout":
        run_sh(world, world.sub(text), cwd=ROOT)
    elif kind == "python":
        run([PYTHON, "-c", world.sub(text)], world)
    elif kind == "c":
        compile_and_run(world, world.sub(text))
    elif kind == "pkg-config":
        prefix = install_prefix(world)
        with open(os.path.join(world.tmp, "app.c"), "w") as f:
            f.write(c_program(first_c_block()))
        e = world.env()
        e["PKG_CONFIG_PATH"] = os.path.join(prefix, "lib", "pkgconfig")
        e["LD_LIBRARY_PATH"] = os.path.join(prefix, "lib")
        run(["bash", "-euc", text + "./app\n"], world, env=e)
    elif kind == "cmake":
        prefix = install_prefix(world)
        with open(os.path.join(world.tmp, "app.c"), "w") as f:
            f.write(c_program(first_c_block()))
        with open(os.path.join(world.tmp, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.16)\nproject(app C)\n"
                    "add_executable(app app.c)\n" + text)
        run(["cmake", "-S", ".", "-B", "b", "-DCMAKE_PREFIX_PATH=" + prefix], world)
        run(["cmake", "--build", "b"], world)
        e = world.env()
        e["LD_LIBRARY_PATH"] = os.path.join(prefix, "lib")
        run(["b/app"], world, env=e)
    elif kind == "prometheus":
        if not shutil.which("promtool"):
            pytest.fail("promtool not installed (scripts/install-deps --test)", pytrace=False)
        cfg = os.path.join(world.tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(text)
        run(["promtool", "check", "config", cfg], world)
    elif kind in ("sglang", "vllm", "vllm-stock", "sglang-stock"):
        import readme_engines
        getattr(readme_engines, kind.replace("-", "_"))(world, text)
    else:
        raise AssertionError(f"unknown kind {kind}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] in KINDS],
                         ids=lambda b: f"L{b[0]}-{b[1]}")
def test_block(block, world):
    line, kind, lang, text = block
    check_block(world, kind, text)
