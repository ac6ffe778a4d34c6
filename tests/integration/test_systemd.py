"""contrib/systemd: the unit passes systemd-analyze verify, and kvpage serve
speaks systemd's readiness protocol (Type=notify: READY=1 once it listens,
STOPPING=1 on SIGTERM)."""
import os
import shutil
import socket
import subprocess

import pytest

from kvpserver import require_bin

HERE = os.path.dirname(os.path.abspath(__file__))
UNIT = os.path.join(HERE, "..", "..", "contrib", "systemd", "kvpage.service")


def test_unit_passes_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    if not tool:
        pytest.fail("systemd-analyze not found (scripts/install-deps --test installs systemd)",
                    pytrace=False)
    text = open(UNIT).read()
    assert "ExecStart=/usr/local/bin/kvpage serve" in text
    # verify checks that ExecStart's program exists: point it at the build.
    unit = tmp_path / "kvpage.service"
    unit.write_text(text.replace("/usr/local/bin/kvpage", require_bin()))
    # --man=no: the man page is checked where it is built (test_docs.py).
    p = subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr
    # A typo is caught, so the check above can fail.
    bad = tmp_path / "bad.service"
    bad.write_text(unit.read_text().replace("Type=notify", "Type=notifyy"))
    p = subprocess.run([tool, "verify", "--man=no", str(bad)], capture_output=True, text=True,
                       timeout=60)
    assert "service type" in p.stdout + p.stderr, p.stdout + p.stderr


def test_ready_and_stopping_notifications(tmp_path, start_server):
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(30)
    try:
        srv = start_server(env={"NOTIFY_SOCKET": path})
        msg = s.recv(4096).decode()
        assert msg.startswith("READY=1\n"), msg
        assert f"STATUS=listening on http://127.0.0.1:{srv.port}" in msg, msg
        assert srv.stop() == 0
        assert s.recv(4096).decode() == "STOPPING=1"
    finally:
        s.close()
