"""The status page (GET /, GET /ns/NAME/) in a real browser: Debian's headless
Chromium loads it from a server with two deployments and a few ranks, runs
its script, and the rendered DOM must show each rank's figures as
/v1/stats gives them. Screenshots (1280x800 and a phone's 390x844) are saved
in the test's directory. With --token, no figure is shown until the token is
given (here in the link's fragment, as a user can)."""
import os
import re
import shutil
import subprocess

import pytest


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    pytest.fail("chromium not found (scripts/install-deps --test installs it)", pytrace=False)


def browse(url, tmp_path, screenshot=None, size="1280,800"):
    """The DOM after the page's script ran (or a screenshot)."""
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--virtual-time-budget=4000", f"--window-size={size}"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    p = subprocess.run(args + [url], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def sections(dom):
    """{(deployment, pool): {rank: {column: text}}} from the rendered page."""
    out = {}
    for m in re.finditer(r'<section class="ns" data-deployment="([^"]*)" data-pool="([^"]*)">'
                         r'(.*?)</section>', dom, re.S):
        ranks = {}
        for row in re.finditer(r'<tr data-rank="(\d+)">(.*?)</tr>', m.group(3), re.S):
            cells = dict(re.findall(r'<td data-col="([^"]+)">(.*?)</td>', row.group(2), re.S))
            ranks[int(row.group(1))] = cells
        out[(m.group(1), m.group(2))] = ranks
    return out


def populate(c, alpha):
    c.v_init(0, 1000)
    c.v_init(1, 500)
    c.v_write(0, [f"k{i}" for i in range(37)])
    c.v_alloc(1, ["r1", "r2", "r3"])  # reserved, not confirmed
    alpha.s_init(0, 64, ns="kv")
    alpha.s_write(0, ["a", "b", "c"], ns="kv")
    alpha.s_init(2, 2048, ns="mamba")
    alpha.s_get(0, ["a", "zz"], ns="kv")  # a hit and a miss


def fmt(n):
    return f"{n:,}"


def test_status_page_shows_what_stats_says(tmp_path, start_server):
    srv = start_server()
    populate(srv.client(), srv.client("/ns/alpha"))
    dom = browse(srv.url("/"), tmp_path)
    shown = sections(dom)
    st = srv.stats()
    assert {(n["deployment"], n["pool"]) for n in st["namespaces"]} == set(shown)
    assert len(shown) == 3
    for ns in st["namespaces"]:
        rows = shown[(ns["deployment"], ns["pool"])]
        assert set(rows) == {r["rank"] for r in ns["ranks"]}
        for r in ns["ranks"]:
            cells = rows[r["rank"]]
            for col, field in (("pages", "num_pages"), ("free", "free"), ("reserved", "reserved"),
                               ("held", "held"), ("keys", "keys"), ("evictions", "evictions"),
                               ("expired reservations", "expired_reservations")):
                assert cells[col] == fmt(r[field]), (ns["deployment"], r["rank"], col, cells)
            look = r["hits"] + r["misses"]
            rate = f"{100 * r['hits'] / look:.1f}%" if look else "\u2013"
            assert cells["hit rate"] == rate, cells
            assert f"{fmt(r['held'])} held, {fmt(r['reserved'])} reserved" in cells["used"]
    assert st["server"]["state"] and st["server"]["state"] in dom and "version 0.1" in dom
    # One deployment's page shows only it.
    only = sections(browse(srv.url("/ns/alpha/"), tmp_path))
    assert set(only) == {("alpha", "kv"), ("alpha", "mamba")}
    for name, size in (("status-1280x800.png", "1280,800"), ("status-phone.png", "390,844")):
        shot = tmp_path / name
        browse(srv.url("/"), tmp_path, screenshot=shot, size=size)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


def test_status_page_asks_for_the_token(tmp_path, start_server):
    srv = start_server("--token", "s3cret")
    populate(srv.client(), srv.client("/ns/alpha"))
    dom = browse(srv.url("/"), tmp_path)
    assert re.search(r'<form id="login">', dom), "the token form is not shown"
    assert not sections(dom) and 'data-rank=' not in dom
    assert "k0" not in dom and "alpha" not in dom  # no figure, no name
    wrong = browse(srv.url("/#token=nope"), tmp_path)
    assert "That token was refused." in wrong and not sections(wrong)
    right = browse(srv.url("/#token=s3cret"), tmp_path)
    assert len(sections(right)) == 3 and '<form id="login" hidden=""' in right
