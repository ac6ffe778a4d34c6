"""What a user reaches from the shell: `kvpage help COMMAND`, --help with
examples on every subcommand, the man page kvpage(1) (built beside the
binary from docs/kvpage.1.scd) and bash completion
(contrib/bash-completion/kvpage), each checked against the flags the
commands really take; and the README's lists of the Debian packages that
scripts/install-deps installs."""
import os
import re
import subprocess

import pytest

from kvpserver import require_bin

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.join(HERE, "..", "..")
COMPLETION = os.path.join(TOP, "contrib", "bash-completion", "kvpage")


def run(*args):
    return subprocess.run([require_bin()] + list(args), capture_output=True, text=True,
                          timeout=30)


def flags_of(help_text):
    return sorted(set(re.findall(r"^\s+(--[a-z][a-z-]*)", help_text, re.M)))


COMMANDS = [["serve"], ["put"], ["get"], ["exists"], ["delete"], ["bench"], ["bench", "store"],
            ["bench", "io"], ["bench", "meta"], ["bench", "trace"], ["inspect"], ["fsck"],
            ["version"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_of_every_command_has_examples(cmd):
    p = run(*cmd, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: kvpage " + " ".join(cmd)), p.stdout
    assert "example" in p.stdout, p.stdout
    h = run("help", *cmd)
    assert h.returncode == 0 and h.stdout == p.stdout, (h.stdout, h.stderr)


def test_top_level_help():
    p = run("help")
    assert p.returncode == 0
    for c in ("serve", "put", "get", "exists", "delete", "bench", "inspect", "fsck", "help",
              "version"):
        assert f"  {c}" in p.stdout, c
    assert run("nosuch").returncode == 2


def test_version_is_the_servers(start_server, tmp_path):
    """kvpage --version and kvpage version print what GET /v1/stats reports,
    the project's version (CMakeLists.txt, as libkvpage.so's)."""
    with open(os.path.join(HERE, "..", "..", "CMakeLists.txt")) as f:
        project = re.search(r"project\(kvpage VERSION (\S+)", f.read()).group(1)
    served = start_server("--data-dir", tmp_path / "d").stats()["server"]["version"]
    assert served == project
    for args in (["--version"], ["version"]):
        p = run(*args)
        assert (p.returncode, p.stdout, p.stderr) == (0, f"kvpage {project}\n", ""), args
    assert run("version", "extra").returncode == 2


@pytest.mark.parametrize("cmd", ["get", "exists", "delete"])
def test_store_commands_list_only_their_own_flags(cmd):
    common = ["--deployment", "--file", "--meta", "--no-tags", "--page-size", "--pool", "--rank",
              "--timeout"]
    assert flags_of(run(cmd, "--help").stdout) == common
    assert flags_of(run("put", "--help").stdout) == sorted(common + ["--file-size", "--mkdir",
                                                                     "--no-durable"])


def _install_deps(*flags):
    p = subprocess.run([os.path.join(TOP, "scripts", "install-deps"), "--print", *flags],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_readme_lists_what_install_deps_installs():
    """The README's "The two commands" names the packages of scripts/install-deps:
    what building and serving need (make run, build, install), then what the
    tests add (make test and each of its parts)."""
    with open(os.path.join(TOP, "README.md")) as f:
        readme = " ".join(f.read().split())
    build = re.search(r"installs what building and serving need: `([^`]*)`", readme)
    tests = re.search(r"also installs what the tests use \([^)]*\): `([^`]*)`", readme)
    assert build and tests, "the README's package lists moved"
    assert build[1].split() == _install_deps()
    assert build[1].split() + tests[1].split() == _install_deps("--test")
    assert set(_install_deps("--test")) < set(_install_deps("--bench"))
    with open(os.path.join(TOP, "Makefile")) as f:
        prereqs = dict(re.findall(r"^([a-z-]+):(.*)$", f.read(), re.M))
    for t in ("build", "run", "asan", "tsan", "install"):
        assert "test-deps" not in prereqs[t].split(), t
    for t in ("test", "unit", "install-test", "unit-asan", "unit-tsan", "integration",
              "integration-redis", "integration-tsan", "python-test", "python-tsan"):
        assert "test-deps" in prereqs[t].split(), t


def _man_page():
    page = os.path.join(os.path.dirname(require_bin()), "kvpage.1")
    if not os.path.isfile(page):
        pytest.fail(f"{page} not built (scdoc missing? scripts/install-deps)", pytrace=False)
    return page


def test_man_page_renders_without_warnings_and_names_every_flag():
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    p = subprocess.run(["man", "--nh", "--nj", "--warnings", "-l", _man_page()], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    text = p.stdout
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "ENVIRONMENT", "EXAMPLES"):
        assert section in text, section
    flags = []
    for cmd in (["serve"], ["put"], ["bench", "io"], ["bench", "meta"], ["bench", "store"],
                ["bench", "trace"]):
        flags += flags_of(run(*cmd, "--help").stdout)
    missing = sorted({f for f in flags if f not in text and f != "--help"})
    assert not missing, f"flags not in the man page: {missing}"
    # A line that starts with "." is a roff request: "./kvpage-data" once lost its "./".
    assert "(default ./kvpage-data)" in text


def _complete(*words):
    line = " ".join(f"'{w}'" for w in words)
    script = (f"source '{COMPLETION}'; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
              "_kvpage; printf '%s\\n' \"${COMPREPLY[@]}\"")
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return set(p.stdout.split())


def test_bash_completion_knows_every_command_and_flag():
    assert {"serve", "put", "get", "bench", "help"} <= _complete("kvpage", "")
    assert _complete("kvpage", "se") == {"serve"}
    assert _complete("kvpage", "serve", "--fsync", "") == {"always", "batch", "never"}
    assert _complete("kvpage", "bench", "") == {"io", "meta", "store", "trace"}
    for cmd, words in ((["serve"], ["kvpage", "serve"]), (["put"], ["kvpage", "put"]),
                       (["bench", "store"], ["kvpage", "bench", "store"]),
                       (["bench", "io"], ["kvpage", "bench", "io"]),
                       (["bench", "meta"], ["kvpage", "bench", "meta"]),
                       (["bench", "trace"], ["kvpage", "bench", "trace"])):
        offered = _complete(*words, "--")
        missing = set(flags_of(run(*cmd, "--help").stdout)) - offered
        assert not missing, f"kvpage {' '.join(cmd)}: flags not completed: {missing}"
