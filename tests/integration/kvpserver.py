"""Starting and stopping the real `kvpage serve` on a free loopback port.

`kvpage` is $KVPAGE_BIN (default /work/main/build/kvpage, `make test` passes
the ASan build). Each server gets its own port (picked by binding
127.0.0.1:0), `--data-dir none`, and its stderr in a file that is attached to
the report of a failing test. With KVPAGE_TEST_BACKEND=redis, servers keep
their state in a session-wide redis-server instead (tests/integration/
redisfix.py), and tests that name a data directory are skipped. A server is stopped with SIGTERM and must exit
0 without any sanitizer report; before that, the invariants of protocol.md §1
are checked on its /v1/stats.
"""
import os
import signal
import subprocess
import time

import pytest
import requests

import redisfix
from redisfix import free_port
from kvptest import Client, invariants, session, stats

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.path.normpath(os.path.join(_HERE, "..", "..", "build", "kvpage"))
BIN = os.environ.get("KVPAGE_BIN") or DEFAULT_BIN

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "SUMMARY: UndefinedBehaviorSanitizer", "ThreadSanitizer")

# Servers alive now, and servers stopped during the current test: their
# stderr is attached to a failing test's report.
_LIVE = []
_RECENT = []


def read_tail(path, limit=20000):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return text if len(text) <= limit else "...\n" + text[-limit:]


def require_bin():
    if not (os.path.isfile(BIN) and os.access(BIN, os.X_OK)):
        pytest.fail(f"kvpage binary not found at {BIN} (set KVPAGE_BIN or build it)", pytrace=False)
    return BIN


def sanitizer_report(text):
    return [m for m in SANITIZER_MARKERS if m in text]


def run_kvp(*args, input=None, cwd=None, env=None, timeout=120, preexec_fn=None, stdout="text",
            no_sanitizer_report=False):
    """Runs the kvpage binary with args; returns (exit status, stdout, stderr
    text). stdout: "text" (decoded; bytes that are not UTF-8 raise), "replace"
    (decoded, such bytes replaced) or "bytes". no_sanitizer_report: fail when
    stderr has one (the ASan build's binary runs these too)."""
    p = subprocess.run([require_bin(), *map(str, args)], input=input, capture_output=True,
                       cwd=cwd, env=env, timeout=timeout, preexec_fn=preexec_fn)
    err = p.stderr.decode(errors="replace")
    assert not (no_sanitizer_report and sanitizer_report(err)), err
    if stdout == "bytes":
        return p.returncode, p.stdout, err
    return p.returncode, p.stdout.decode(errors="replace" if stdout == "replace" else "strict"), err


class Server:
    """One running `kvpage serve`."""

    def __init__(self, proc, port, flags, stderr_path, token):
        self.proc = proc
        self.port = port
        self.flags = flags
        self.stderr_path = stderr_path
        self.token = token
        self.base = f"http://127.0.0.1:{port}"
        self.returncode = None
        self.check_on_stop = True

    def url(self, path=""):
        return self.base + path

    def client(self, prefix="", token="__server__"):
        """A keep-alive client; prefix is e.g. '/ns/alpha'. By default it
        sends the server's --token if it has one."""
        tok = self.token if token == "__server__" else token
        return Client(self.base + prefix, tok)

    def stats(self):
        return stats(self.base, self.token)

    def stderr(self):
        return read_tail(self.stderr_path)

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends sig, waits, returns the exit status (also kept in returncode)."""
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = "hung"
        if self in _LIVE:
            _LIVE.remove(self)
        _RECENT.append(self)
        return self.returncode

    def assert_no_sanitizer_report(self):
        """For a server stopped without a clean exit (SIGKILL): a sanitizer
        that stopped it early left its report in stderr."""
        err = self.stderr()
        bad = sanitizer_report(err)
        assert not bad, f"sanitizer report in stderr ({bad})\n--- stderr ---\n{err}"

    def assert_clean_exit(self, rc):
        err = self.stderr()
        assert rc == 0, f"kvpage serve exited with {rc!r} (expected 0)\n--- stderr ---\n{err}"
        bad = sanitizer_report(err)
        assert not bad, f"sanitizer report in stderr ({bad})\n--- stderr ---\n{err}"


def _wait_ready(proc, base, deadline):
    """True once the server answers HTTP (any status: --allow may refuse
    us); False if the process exited first."""
    s = session()
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                s.get(base + "/healthz", timeout=2)
                return True
            except requests.RequestException:
                time.sleep(0.02)
    finally:
        s.close()
    return False


def launch(tmp_path, flags=(), env=None, tries=5, in_process=False):
    """Starts `kvpage serve` on a free loopback port with extra flags
    (`--data-dir none` unless the flags name a data directory; in_process:
    in memory even with KVPAGE_TEST_BACKEND=redis)."""
    binary = require_bin()
    flags = [str(f) for f in flags]
    if redisfix.BACKEND == "redis" and "--data-dir" in flags:
        # What such a test checks is the in-process backend's log and
        # snapshots; with Redis the state is not in a data directory.
        pytest.skip("KVPAGE_TEST_BACKEND=redis: this test is about the in-process backend's "
                    "data directory")
    token = None
    if "--token" in flags:
        token = flags[flags.index("--token") + 1]
    elif env and env.get("KVPAGE_TOKEN"):
        token = env["KVPAGE_TOKEN"]
    full_env = dict(os.environ)
    full_env.pop("KVPAGE_TOKEN", None)
    # allocator_may_return_null: a huge allocation fails as malloc does in
    # production (the server must answer 500), instead of aborting.
    full_env.setdefault("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1:allocator_may_return_null=1")
    full_env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    # A ThreadSanitizer build stops at its first report (status 66).
    full_env.setdefault("TSAN_OPTIONS", "halt_on_error=1:exitcode=66:second_deadlock_stack=1")
    if env:
        full_env.update(env)
    last_err = ""
    for attempt in range(tries):
        port = free_port()
        stderr_path = os.path.join(str(tmp_path), f"kvpage-{port}-{attempt}.stderr")
        if "--data-dir" in flags or "--meta" in flags:
            data_dir = []
        elif redisfix.BACKEND == "redis" and not in_process:
            data_dir = ["--meta", redisfix.fresh_location()]
        else:
            data_dir = ["--data-dir", "none"]
        cmd = [binary, "serve", "--listen", f"127.0.0.1:{port}"] + data_dir + flags
        with open(stderr_path, "wb") as errf:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf,
                                    env=full_env, cwd=str(tmp_path))
        srv = Server(proc, port, flags, stderr_path, token)
        if _wait_ready(proc, srv.base, time.monotonic() + 30):
            _LIVE.append(srv)
            return srv
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        last_err = read_tail(stderr_path)
        # Retry: another process may have taken the port in between.
    pytest.fail(f"kvpage serve did not start ({' '.join(cmd)})\n--- stderr ---\n{last_err}",
                pytrace=False)


def finish(srv):
    """Checks invariants, stops with SIGTERM, asserts a clean exit."""
    problems = []
    if srv.returncode is None and srv.alive() and srv.check_on_stop:
        try:
            r = session(srv.token).get(srv.base + "/v1/stats", timeout=20)
            if r.status_code == 200:
                invariants(r.json())
        except AssertionError as e:
            problems.append(f"invariant violated at the end of the test: {e}")
        except requests.RequestException as e:
            problems.append(f"/v1/stats failed at the end of the test: {e}")
    rc = srv.stop()
    srv.assert_clean_exit(rc)
    assert not problems, "\n".join(problems) + "\n--- stderr ---\n" + srv.stderr()


def started_servers(tmp_path):
    """The body of the start_server fixtures (integration and Python tests):
    yields start(*flags, env=None) -> Server; after the test, finishes every
    server started, then fails with all of their problems, if any."""
    started = []

    def start(*flags, env=None):
        srv = launch(tmp_path, flags, env)
        started.append(srv)
        return srv

    yield start
    errors = []
    for srv in started:
        try:
            finish(srv)
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "\n\n".join(errors)
