"""What operators' tools see: /metrics passes Prometheus's own checker
(promtool check metrics) after traffic on every route, with HELP and TYPE on
every series and latency histograms per route; --log-format json gives one
JSON object per line."""
import json
import shutil
import socket
import subprocess
import time

import pytest

from kvpserver import require_bin
from kvptest import Raw, expect


def _traffic(srv):
    c = srv.client()
    c.v_init(0, 8)
    c.v_write(0, ["a", "b"])
    c.v_exists(["a", "zz"])
    c.v_loc(0, ["a"])
    c.v_delete(["b"])
    c.v_clear()
    c.s_init(1, 8)
    c.s_write(1, ["s"])
    c.s_exists(1, ["s"])
    c.s_get(1, ["s"])
    c.s_delete(1, ["s"])
    c.s_clear(1)
    expect(c.post("/keys/batch_exists", Raw(b"not json")), 400)
    expect(c.post("/nope", {}), 404)
    c.get("/healthz")
    c.get("/v1/stats")
    c.get("/metrics")


def test_metrics_pass_promtool(start_server):
    tool = shutil.which("promtool")
    if not tool:
        pytest.fail("promtool not found (scripts/install-deps --test installs prometheus)",
                    pytrace=False)
    srv = start_server()
    _traffic(srv)
    text = srv.client().get("/metrics").text
    p = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), p.stdout + p.stderr
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    assert names == helps, names ^ helps
    assert "kvpage_http_request_duration_seconds" in names
    for route in ("/keys/batch_allocate", "/keys/confirm_write", "/keys/get_locations",
                  "/{rank}/reserve_and_allocate_page_indices", "/{rank}/get_page_indices"):
        assert f'kvpage_http_request_duration_seconds_bucket{{route="{route}"' in text, route
    # ... and the checker does fail on a broken exposition.
    bad = text.replace("# TYPE kvpage_http_requests_total counter\n", "")
    bad += "kvpage_bad_total{a=\"1\"} 1\nkvpage_bad_total{a=\"1\"} 2\n"
    p = subprocess.run([tool, "check", "metrics"], input=bad, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 or (p.stdout + p.stderr).strip()


def test_log_format_json(start_server):
    srv = start_server("--log-format", "json", "--log-level", "debug")
    _traffic(srv)
    srv.stop()
    lines = [l for l in srv.stderr().splitlines() if l.strip()]
    assert len(lines) >= 3, lines
    for line in lines:
        obj = json.loads(line)  # every line is one object
        assert set(obj) == {"time", "level", "msg"}, obj
        assert obj["level"] in ("error", "warn", "info", "debug"), obj
        assert obj["time"].endswith("Z"), obj
    assert any("listening" in json.loads(l)["msg"] or "shutting down" in json.loads(l)["msg"]
               for l in lines)


def test_log_format_bad_value(start_server):
    from kvpserver import require_bin
    p = subprocess.run([require_bin(), "serve", "--log-format", "xml"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2 and "--log-format" in p.stderr and "text or json" in p.stderr


def test_banner_names_the_data_directory(tmp_path, start_server):
    """The in-process backend's banner names its data directory and fsync
    mode (and /v1/stats the same); memory only says so."""
    d = tmp_path / "state"
    srv = start_server("--data-dir", d, "--fsync", "always")
    want = f"state in data directory {d} (write-ahead log, fsync always)"
    assert want in srv.stderr(), srv.stderr()
    assert srv.stats()["server"]["state"] == want[len("state in "):]
    srv = start_server("--data-dir", "none")
    assert "--data-dir none: state is in memory only" in srv.stderr(), srv.stderr()
    assert srv.stats()["server"]["state"] == "memory only (--data-dir none)"


def _banner(text_of, deadline_s=30):
    """The banner's lines (from "kvpage serve: listening" to the SGLang
    line) once the server has printed them."""
    end = time.monotonic() + deadline_s
    while True:
        text = text_of()
        if "  SGLang:" in text or time.monotonic() > end:
            start = text.find("kvpage serve: listening")
            return text[start:text.find("\n", text.find("  SGLang:")) + 1]
        time.sleep(0.05)


def test_banner_vllm_line_off_port_18000(start_server):
    """Stock vLLM ignores hf3fs_metadata_server_url (its client always asks
    localhost:18000): on another port the banner says so and names
    kvpage.vllm, instead of a setting stock vLLM would not follow."""
    srv = start_server()
    assert srv.port != 18000
    banner = _banner(srv.stderr)
    url = f"http://127.0.0.1:{srv.port}"
    vllm = banner[banner.index("  vLLM:"):banner.index("  SGLang:")]
    assert "stock vLLM ignores hf3fs_metadata_server_url" in vllm, banner
    assert "localhost:18000 only" in vllm and "never to this server" in vllm, banner
    assert '"kv_connector_module_path": "kvpage.vllm"' in vllm, banner
    assert '"kv_connector": "KvpageHF3FSConnector"' in vllm, banner
    assert f'"hf3fs_metadata_server_url": "{url}"' in vllm, banner
    assert f'"metadata_server_url": "{url}"' in banner[banner.index("  SGLang:"):], banner


def test_banner_vllm_line_on_port_18000(tmp_path):
    """On loopback port 18000 stock vLLM does reach the server: the plain
    setting, no warning (skipped when something else holds the port)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 18000))
        except OSError:
            pytest.skip("127.0.0.1:18000 is in use")
    out = tmp_path / "out"
    with open(out, "wb") as f:
        p = subprocess.Popen([require_bin(), "serve", "--listen", "127.0.0.1:18000", "--data-dir",
                              "none"], stdout=f, stderr=f, stdin=subprocess.DEVNULL)
    try:
        banner = _banner(out.read_text)
    finally:
        p.terminate()
        rc = p.wait(timeout=30)
    if "address is already in use" in out.read_text():
        pytest.skip("127.0.0.1:18000 was taken meanwhile")
    assert rc == 0, out.read_text()
    assert ('  vLLM:   "hf3fs_metadata_server_url": "http://127.0.0.1:18000" in '
            'kv_connector_extra_config\n') in banner, banner
    assert "stock vLLM ignores" not in banner and "kvpage.vllm" not in banner, banner
