"""kvpage serve names no metadata backend: what it says of the state's
durability (kvp_meta_info) and the status page's card for the connection
to a remote store (any kvp_meta_values section with nodes and failures)
come from the library, so they fit every backend, not only Redis."""
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from test_status_page import browse


def test_a_server_over_another_server_says_nothing_of_redis(start_server):
    """--meta http://: the other server keeps its own --fsync, so nothing is
    asked of it and nothing is said of Redis."""
    first = start_server()
    second = start_server("--meta", first.url())
    second.client().v_init(0, 8)
    err = second.stderr()
    assert "Redis" not in err and "can be lost" not in err and "appendfsync" not in err, err


def serve_page(page, stats):
    """A loopback HTTP server answering GET / with page and /v1/stats with stats."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/v1/stats"):
                body, ctype = json.dumps(stats).encode(), "application/json"
            else:
                body, ctype = page, "text/html; charset=utf-8"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_status_page_has_a_card_for_any_remote_stores_connection(tmp_path, start_server):
    """The page draws the connection card of whichever section /v1/stats has
    with nodes and failures (Redis's "redis" today, another backend's
    tomorrow), named by the section; other sections get none."""
    page = requests.get(start_server().url("/"), timeout=10).content
    stats = {"server": {"version": "0.1.0", "uptime_seconds": 5, "state": "somewhere"},
             "namespaces": [], "requests": {"by_route": {}, "total": 0},
             "connections": {"open": 1, "accepted": 1},
             "redis": {"nodes": 2, "failures": 0}, "etcd": {"nodes": 3, "failures": 1},
             "http_client": {"requests": 5, "retries": 0}}
    httpd = serve_page(page, stats)
    try:
        dom = browse(f"http://127.0.0.1:{httpd.server_address[1]}/", tmp_path)
    finally:
        httpd.shutdown()
    cards = re.findall(r'<div class="card"><b>([^<]*)</b><span([^>]*)>([^<]*)</span></div>', dom)
    shown = {title: (cls, text) for title, cls, text in cards}
    assert shown["redis"] == (' class="ok"', "2 node(s), 0 connection failures"), cards
    assert shown["etcd"] == (' class="bad"', "3 node(s), 1 connection failures"), cards
    assert "http_client" not in shown and "state" in shown, cards
