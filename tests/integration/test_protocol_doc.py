"""docs/protocol.md, sent: every example in it goes to a real `kvpage serve`
and must get the status, headers and body the document shows.

The document declares its servers (`<!-- server: NAME FLAGS -->`; a later
`<!-- server: NAME -->` goes back to one) and its examples
(`<!-- example: NAME -->` then a fenced block: the request, then the line
`HTTP/1.1 STATUS` and the answer). Examples run in document order, each on
the server declared last before it, so an example may rely on the state the
earlier ones left (the document says so where it does). Requests go out
byte for byte over http.client (paths keep their %-escapes, bodies their
spelling); no Content-Type is sent unless the example has one.

The document must also cover the server: every route of the routing table
in src/server/routes.c has an example, and every error text the server can
send (each `kvp__reply_error` format in src/server/*.c) is written in it.
A route or a message added without its documentation fails here.
"""
import http.client
import json
import os
import re

import pytest

from kvpserver import finish, launch

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
DOC = os.path.join(TOP, "docs", "protocol.md")
SERVER_SRC = os.path.join(TOP, "src", "server")

EXAMPLE_RE = re.compile(r"<!-- example: ([\w.-]+) -->\n```[\w-]*\n(.*?)\n```", re.S)
SERVER_RE = re.compile(r"<!-- server: ([\w-]+)((?: [^>]*?)?) -->")
STATUS_RE = re.compile(r"HTTP/1\.1 (\d{3})(?: .*)?$")
HEADER_RE = re.compile(r"([A-Z][A-Za-z]*(?:-[A-Z][A-Za-z]*)*): (.*)$")

# Placeholders where a value varies between runs (doc: "How the examples read").
JSON_HOLES = {
    "<int>": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "<number>": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "<string>": lambda v: isinstance(v, str),
    "<bool>": lambda v: isinstance(v, bool),
    "<any>": lambda v: True,
}
TEXT_HOLES = {"<int>": r"-?\d+", "<number>": r"[-+0-9.eE]+|NaN|[+-]Inf", "<text>": r".*"}
MORE = "..."
# A server declared `<!-- server: NAME in-process FLAGS -->` keeps its state
# in memory even with KVPAGE_TEST_BACKEND=redis (what Redis lacks so far).
IN_PROCESS = "in-process"


def read_doc():
    with open(DOC, encoding="utf-8") as f:
        return f.read()


class Example:
    """One example: its request and the answer it expects."""

    def __init__(self, name, server, text):
        self.name = name
        self.server = server
        lines = text.split("\n")
        cut = next((i for i, ln in enumerate(lines) if STATUS_RE.match(ln)), None)
        assert cut, f"example {name}: no 'HTTP/1.1 STATUS' line after a request"
        self.method, self.path = lines[0].split(" ", 1)
        self.headers, body = self._split(lines[1:cut])
        self.body = body.encode() if body else None
        self.status = int(STATUS_RE.match(lines[cut]).group(1))
        self.want_headers, self.want_body = self._split(lines[cut + 1:])

    @staticmethod
    def _split(lines):
        """Header lines, then (after an optional blank line) the body."""
        headers = {}
        i = 0
        while i < len(lines) and HEADER_RE.match(lines[i]):
            k, v = HEADER_RE.match(lines[i]).groups()
            headers[k] = v
            i += 1
        return headers, "\n".join(lines[i:]).strip("\n")


def parse(doc):
    """The examples in document order, each with the server it runs on, and
    the servers' flags."""
    events = sorted([(m.start(), "server", m) for m in SERVER_RE.finditer(doc)] +
                    [(m.start(), "example", m) for m in EXAMPLE_RE.finditer(doc)],
                    key=lambda e: e[0])
    servers, examples, current = {}, [], None
    for _, kind, m in events:
        if kind == "server":
            current = m.group(1)
            flags = m.group(2).split()
            if current not in servers:
                servers[current] = flags
            else:
                assert not flags, f"server {current} declared twice with flags"
        else:
            assert current, f"example {m.group(1)} comes before any server"
            examples.append(Example(m.group(1), current, m.group(2)))
    names = [e.name for e in examples]
    dups = sorted({n for n in names if names.count(n) > 1})
    assert not dups, f"example names used twice: {dups}"
    return servers, examples


def hole_json(text):
    """The expected JSON with its placeholders made strings, parsed."""
    for hole in JSON_HOLES:
        text = text.replace(hole, json.dumps(hole))
    return json.loads(text)


def json_match(want, got, where="body"):
    """Asserts got matches want: equal, but a placeholder string matches its
    kind, an object with the member "...": "..." may have more members, and
    a list ending with "..." may have more elements."""
    if isinstance(want, str) and want in JSON_HOLES:
        assert JSON_HOLES[want](got), f"{where}: {got!r} is not {want}"
    elif isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: {got!r} is not an object"
        open_ = want.get(MORE) == MORE
        keys = [k for k in want if not (open_ and k == MORE)]
        missing = [k for k in keys if k not in got]
        assert not missing, f"{where}: members {missing} missing from {got!r}"
        extra = [k for k in got if k not in want]
        assert open_ or not extra, f"{where}: members {extra} not in the document"
        for k in keys:
            json_match(want[k], got[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list), f"{where}: {got!r} is not a list"
        open_ = bool(want) and want[-1] == MORE
        items = want[:-1] if open_ else want
        assert len(got) >= len(items) if open_ else len(got) == len(items), (
            f"{where}: {len(got)} elements, the document has {len(items)}: {got!r}")
        for i, w in enumerate(items):
            json_match(w, got[i], f"{where}[{i}]")
    else:
        assert type(want) is type(got) and want == got, f"{where}: {got!r} != {want!r}"


def text_pattern(want):
    """A regex of the expected text: each line as it is but its
    placeholders, a line "..." for any number of lines."""
    parts = []
    for line in want.split("\n"):
        if line == MORE:
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = re.split("(" + "|".join(map(re.escape, TEXT_HOLES)) + ")", line)
        parts.append("".join(TEXT_HOLES.get(p, re.escape(p)) for p in pieces) + r"\n")
    return re.compile("".join(parts), re.S)


def check(ex, status, headers, body):
    """Asserts the answer is the one the example shows."""
    where = f"example {ex.name} ({ex.method} {ex.path})"
    assert status == ex.status, f"{where}: status {status}, body {body[:300]!r}"
    for k, v in ex.want_headers.items():
        assert headers.get(k.lower()) == v, f"{where}: header {k}: {headers.get(k.lower())!r}"
    text = body.decode("utf-8", "replace")
    want = ex.want_body
    if not want:
        assert body == b"", f"{where}: expected no body, got {body[:300]!r}"
    elif want[0] in "{[":
        if "Content-Type" not in ex.want_headers:
            assert headers.get("content-type") == "application/json", f"{where}: {headers}"
        json_match(hole_json(want), json.loads(text), where)
    else:
        got = text if text.endswith("\n") else text + "\n"
        assert text_pattern(want).fullmatch(got), f"{where}: body\n{text[:2000]}"


def send(conn, ex):
    conn.request(ex.method, ex.path, body=ex.body, headers=ex.headers)
    r = conn.getresponse()
    body = r.read()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def test_every_example_of_the_document(tmp_path):
    """Sends every example in document order and checks each answer."""
    servers, examples = parse(read_doc())
    assert len(examples) >= 100, f"only {len(examples)} examples found: is the format intact?"
    started, conns, failures = {}, {}, []
    try:
        for ex in examples:
            if ex.server not in started:
                flags = servers[ex.server]
                started[ex.server] = launch(tmp_path, [f for f in flags if f != IN_PROCESS],
                                            in_process=IN_PROCESS in flags)
                conns[ex.server] = http.client.HTTPConnection("127.0.0.1",
                                                              started[ex.server].port,
                                                              timeout=20)
            try:
                check(ex, *send(conns[ex.server], ex))
            except AssertionError as e:
                failures.append(str(e).split("\nassert ")[0])
    finally:
        for c in conns.values():
            c.close()
        errors = []
        for srv in started.values():
            try:
                finish(srv)
            except AssertionError as e:
                errors.append(str(e))
        assert not errors, "\n\n".join(errors)
    assert not failures, f"{len(failures)} example(s) differ:\n" + "\n".join(failures)


def route_table():
    """The routes of src/server/routes.c's table, but "unmatched"."""
    with open(os.path.join(SERVER_SRC, "routes.c")) as f:
        src = f.read()
    table = re.search(r"route_names\[KVP_ROUTE_COUNT\] = \{(.*?)\n\};", src, re.S).group(1)
    routes = re.findall(r'\[KVP_ROUTE_\w+\] = "([^"]+)"', table)
    assert len(routes) >= 17, routes
    return [r for r in routes if r != "unmatched"]


def test_every_route_has_an_example():
    """Each route of the table is named in the document and has at least one
    example whose path (after any /ns/NAME prefix) is that route."""
    doc = read_doc()
    _, examples = parse(doc)
    paths = [re.sub(r"^/ns/[^/]+(?=/)", "", e.path.split("?")[0]) for e in examples]
    for route in route_table():
        assert f"`{route}`" in doc or f" {route}`" in doc, f"route {route} not named in the doc"
        pat = re.compile(re.escape(route).replace(r"\{rank\}", r"[+-]?\d+"))
        assert any(pat.fullmatch(p) for p in paths), f"route {route} has no example"


C_STRING = r'"(?:[^"\\]|\\.)*"'
REPLY_RE = re.compile(r"kvp__reply_error\(\s*[^,]+,\s*(\w+),\s*((?:" + C_STRING + r"\s*)+)")
C_FORMAT = re.compile(r"%[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|z|j|t)?[diouxXsc]")


def server_messages():
    """(file, status, printf format) of every kvp__reply_error of the server."""
    found = []
    for name in sorted(os.listdir(SERVER_SRC)):
        if not name.endswith(".c"):
            continue
        with open(os.path.join(SERVER_SRC, name)) as f:
            src = f.read()
        for m in REPLY_RE.finditer(src):
            fmt = "".join(json.loads(s) for s in re.findall(C_STRING, m.group(2)))
            found.append((name, m.group(1), fmt))
    assert len(found) >= 50, found
    return found


def test_every_error_message_is_written():
    """Each error text the server sends is written in the document whole, in
    backquotes, with {name} where the server fills in a value."""
    doc = read_doc()
    missing = []
    for name, status, fmt in server_messages():
        pieces = C_FORMAT.split(fmt)
        pat = "`" + r"[^`\n]+?".join(re.escape(p) for p in pieces) + "`"
        if not re.search(pat, doc):
            missing.append(f"{name}: {status} {fmt!r}")
        if status.isdigit():
            assert re.search(rf"^\| {status} ", doc, re.M), f"status {status} has no row"
    assert not missing, "messages not in docs/protocol.md:\n" + "\n".join(missing)


@pytest.mark.parametrize("want, got, ok", [
    ('{"a": [1, <int>]}', {"a": [1, 7]}, True),
    ('{"a": [1, <int>]}', {"a": [1, "7"]}, False),
    ('{"a": 1}', {"a": 1, "b": 2}, False),
    ('{"a": 1, "...": "..."}', {"a": 1, "b": 2}, True),
    ('[1, "..."]', [1, 2, 3], True),
    ('[1]', [1, 2], False),
    ('{"a": true}', {"a": 1}, False),
])
def test_the_matcher_can_fail(want, got, ok):
    """The comparison is strict where the document is."""
    try:
        json_match(hole_json(want), got)
        matched = True
    except AssertionError:
        matched = False
    assert matched == ok
