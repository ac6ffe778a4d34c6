"""The store's command line, run as a user would: `kvpage put | get | exists |
delete` and `kvpage bench store`, with embedded metadata (a data directory
beside the file) and with a remote `kvpage serve` (--meta http://...):
output bytes, messages and exit codes (0 done, 1 missing, 2 usage, 3 the
store failed), including bad flags, a missing file, a size typo, input
over the page size, and a whole page stored raw."""
import json
import os
import re
import subprocess

import pytest

from kvpserver import require_bin, run_kvp
from kvptest import invariants

PAGE = 64 * 1024
CAP = PAGE - 16  # the command line keeps 16 bytes of each page for the length


def kvp(*args, input=None, cwd=None):
    """Runs the kvpage binary; returns (exit status, stdout bytes, stderr text)."""
    return run_kvp(*args, input=input, cwd=cwd, stdout="bytes")


@pytest.fixture(params=["embedded", "remote"])
def where(request, tmp_path):
    """The store flags of one rank's file, embedded or on a kvpage serve."""
    flags = ["--file", tmp_path / "rank0.pages", "--page-size", "64K"]
    if request.param == "remote":
        srv = request.getfixturevalue("start_server")("--data-dir", tmp_path / "srv")
        flags += ["--meta", srv.url()]
    return flags


def test_put_get_round_trip(tmp_path, where):
    data = os.urandom(CAP - 5) + b"\0\0\0\0\0"  # trailing zeros are data too
    (tmp_path / "in").write_bytes(data)
    rc, out, err = kvp("put", *where, "--file-size", "1M", "page-a", tmp_path / "in")
    assert (rc, out, err) == (0, b"", "")
    rc, out, err = kvp("get", *where, "page-a")
    assert (rc, err) == (0, "") and out == data
    # to a file, and from standard input
    rc, _, err = kvp("put", *where, "page-b", input=b"from stdin")
    assert (rc, err) == (0, "")
    rc, _, err = kvp("get", *where, "page-b", tmp_path / "out")
    assert rc == 0 and (tmp_path / "out").read_bytes() == b"from stdin"
    rc, _, _ = kvp("put", *where, "empty", "-", input=b"")
    rc2, out, _ = kvp("get", *where, "empty")
    assert (rc, rc2, out) == (0, 0, b"")
    # exactly what a page holds
    full = os.urandom(CAP)
    assert kvp("put", *where, "full", input=full)[0] == 0
    assert kvp("get", *where, "full")[1] == full


def test_put_existing_key_says_so(tmp_path, where):
    assert kvp("put", *where, "--file-size", "1M", "k", input=b"first")[0] == 0
    rc, out, err = kvp("put", *where, "k", input=b"second")
    assert rc == 0 and out == b""
    assert "k is already there" in err
    assert kvp("get", *where, "k")[1] == b"first"


def test_get_missing_key(tmp_path, where):
    assert kvp("put", *where, "--file-size", "1M", "k", input=b"x")[0] == 0
    rc, out, err = kvp("get", *where, "nope", tmp_path / "out")
    assert (rc, out) == (1, b"")
    assert "nope is not there" in err
    assert not (tmp_path / "out").exists()  # nothing written for a missing key


def test_exists_and_delete(tmp_path, where):
    for k in ("a", "b"):
        assert kvp("put", *where, "--file-size", "1M", k, input=k.encode())[0] == 0
    rc, out, err = kvp("exists", *where, "a", "b")
    assert (rc, out, err) == (0, b"a\tpresent\nb\tpresent\n", "")
    rc, out, _ = kvp("exists", *where, "a", "zz", "b")
    assert (rc, out) == (1, b"a\tpresent\nzz\tmissing\nb\tpresent\n")
    rc, out, err = kvp("delete", *where, "a")
    assert (rc, out, err) == (0, b"", "")
    rc, _, err = kvp("delete", *where, "a", "b")
    assert rc == 1 and "a is not there" in err
    rc, out, _ = kvp("exists", *where, "a", "b")
    assert (rc, out) == (1, b"a\tmissing\nb\tmissing\n")


def test_input_over_page_size_refused_before_anything_changes(tmp_path, where):
    big = tmp_path / "big"
    big.write_bytes(os.urandom(PAGE + 1))
    rc, _, err = kvp("put", *where, "--file-size", "1M", "k", big)
    assert rc == 2
    assert "larger than a page holds" in err and str(CAP) in err
    assert not (tmp_path / "rank0.pages").exists()  # not even created
    assert kvp("put", *where, "--file-size", "1M", "other", input=b"x")[0] == 0
    for n in (PAGE + 1, PAGE - 1, CAP + 1):  # over a page; no room for the trailer
        rc, _, err = kvp("put", *where, "k", input=os.urandom(n))
        assert rc == 2, n
        assert f"takes exactly {PAGE} bytes" in err and f"at most {CAP}" in err
    assert kvp("exists", *where, "k")[0] == 1


def test_page_round_trips_between_two_stores(tmp_path, where):
    """A whole page (as an engine writes it) is stored raw and comes back whole;
    a short payload comes back as it was; both survive get from one store, put
    into another and get from that one."""
    other = ["--file", tmp_path / "other.pages", "--page-size", "64K", "--file-size", "1M"]
    whole = os.urandom(PAGE)
    short = os.urandom(1000) + b"\0" * 24
    for key, data in (("whole", whole), ("short", short)):
        assert kvp("put", *where, "--file-size", "1M", key, input=data)[:1] == (0,)
        rc, got1, err = kvp("get", *where, key)
        assert (rc, err) == (0, "") and got1 == data
        rc, _, err = kvp("put", *other, key, input=got1)
        assert (rc, err) == (0, ""), key
        rc, got2, err = kvp("get", *other, key)
        assert (rc, err) == (0, "") and got2 == data
    # The whole page is in both files as it is: no trailer took its last 16 bytes.
    for f in ("rank0.pages", "other.pages"):
        assert whole in (tmp_path / f).read_bytes()


def test_whole_page_ending_in_a_trailer_refused(tmp_path, where):
    """A page put short by the command line and read whole from the file ends in
    a valid length trailer: put of it as one page would come back shortened, so
    it is refused (nothing changed), naming the length to put instead. The same
    page with its check broken is no trailer: stored raw, given back whole."""
    payload = os.urandom(5000)
    assert kvp("put", *where, "--file-size", "1M", "short", input=payload)[0] == 0
    raw = (tmp_path / "rank0.pages").read_bytes()
    at = raw.index(payload)
    page = raw[at:at + PAGE]
    assert page[-16:-8] == b"kvpageC1"
    rc, out, err = kvp("put", *where, "k", input=page)
    assert (rc, out) == (2, b"")
    assert "length trailer" in err and "head -c 5000" in err
    assert kvp("exists", *where, "k")[0] == 1
    assert (tmp_path / "rank0.pages").read_bytes() == raw
    # What it says works: the first 5000 bytes store the very same page.
    assert kvp("put", *where, "k", input=page[:5000])[0] == 0
    assert kvp("get", *where, "k")[1] == payload
    broken = page[:-1] + bytes([page[-1] ^ 1])
    assert kvp("put", *where, "k2", input=broken)[0] == 0
    assert kvp("get", *where, "k2")[1] == broken


def test_two_ranks_key_there_only_when_both_put(tmp_path):
    meta = tmp_path / "shared.meta"
    r0 = ["--file", tmp_path / "r0.pages", "--page-size", "64K", "--meta", meta, "--rank", "0"]
    r1 = ["--file", tmp_path / "r1.pages", "--page-size", "64K", "--meta", meta, "--rank", "1"]
    assert kvp("put", *r0, "--file-size", "1M", "k", input=b"zero")[0] == 0
    assert kvp("put", *r1, "--file-size", "1M", "other", input=b"one")[0] == 0
    assert kvp("exists", *r0, "k")[1] == b"k\tmissing\n"  # rank 1 lacks it
    assert kvp("get", *r0, "k")[0] == 1
    assert kvp("put", *r1, "k", input=b"one")[0] == 0
    assert kvp("exists", *r0, "k")[1] == b"k\tpresent\n"
    assert kvp("get", *r0, "k")[1] == b"zero"
    assert kvp("get", *r1, "k")[1] == b"one"


@pytest.mark.parametrize("flags,needle", [
    (["--frobnicate", "1"], "unknown flag '--frobnicate'"),
    (["--page-size", "64Q"], "--page-size '64Q' is not a size"),
    (["--file-size", "1Mb"], "--file-size '1Mb' is not a size"),
    (["--file-size", "-1M"], "--file-size '-1M' is not a size"),
    (["--rank", "x"], "--rank 'x' is not a rank"),
    (["--rank", "2147483648"], "--rank '2147483648' is not a rank"),
    (["--page-size"], "--page-size needs a value"),
    (["--json"], "unknown flag '--json'"),
])
def test_bad_flags(tmp_path, flags, needle):
    base = ["--file", tmp_path / "f.pages", "--page-size", "64K", "--file-size", "1M"]
    rc, out, err = kvp("put", *base, "k", *flags, input=b"x")
    assert rc == 2 and out == b""
    assert needle in err, err
    assert not (tmp_path / "f.pages").exists()


def test_missing_file_and_flags(tmp_path):
    f = tmp_path / "absent.pages"
    rc, _, err = kvp("get", "--file", f, "--page-size", "64K", "k")
    assert rc == 2 and f"--file {f} does not exist" in err
    rc, _, err = kvp("put", "--file", f, "--page-size", "64K", "k", input=b"x")
    assert rc == 2 and "give --file-size SIZE to create it" in err
    rc, _, err = kvp("put", "--page-size", "64K", "k", input=b"x")
    assert rc == 2 and "--file PATH is required" in err
    rc, _, err = kvp("get", "--file", f, "k")
    assert rc == 2 and "--page-size SIZE is required" in err
    rc, _, err = kvp("put", "--file", f, "--page-size", "64K", "--file-size", "1M", "k",
                     tmp_path / "no-input")
    assert rc == 2 and "no-input" in err
    rc, _, err = kvp("get", "--file", f, "--page-size", "64K")
    assert rc == 2 and "no KEY given" in err
    assert not f.exists()
    rc, out, _ = kvp("put", "--help")
    assert rc == 0 and b"usage: kvpage put" in out


def test_other_page_size_on_same_file(tmp_path):
    base = ["--file", tmp_path / "f.pages", "--file-size", "1M"]
    assert kvp("put", *base, "--page-size", "64K", "k", input=b"x")[0] == 0
    rc, _, err = kvp("get", *base, "--page-size", "32K", "k")
    assert rc == 2
    assert "16 pages" in err and "32 pages" in err  # both counts named


def test_remote_server_gone(tmp_path, start_server):
    srv = start_server("--data-dir", tmp_path / "srv")
    flags = ["--file", tmp_path / "f.pages", "--page-size", "64K", "--file-size", "1M",
             "--meta", srv.url(), "--timeout", "2000"]
    assert kvp("put", *flags, "k", input=b"x")[0] == 0
    srv.stop()
    rc, _, err = kvp("get", *flags, "k")
    assert rc == 3
    assert srv.url() in err or "127.0.0.1" in err, err


def test_remote_keys_on_server(tmp_path, start_server):
    srv = start_server("--data-dir", tmp_path / "srv")
    flags = ["--file", tmp_path / "f.pages", "--page-size", "64K", "--file-size", "1M",
             "--meta", srv.url() + "/ns/team", "--pool", "cli"]
    assert kvp("put", *flags, "k1", input=b"x")[0] == 0
    assert kvp("put", *flags, "k2", input=b"y")[0] == 0
    st = srv.stats()
    ns = [n for n in st["namespaces"] if (n["deployment"], n["pool"]) == ("team", "cli")]
    assert len(ns) == 1 and ns[0]["ranks"][0]["held"] == 2
    assert ns[0]["ranks"][0]["num_pages"] == 16
    assert ns[0]["ranks"][0]["reserved"] == 0
    invariants(st)


def test_rank_without_a_free_page_says_so(tmp_path, start_server):
    """Every page reserved by another writer's allocation (not confirmed): put
    names the rank and why no page could be had, not "No space left on device"."""
    srv = start_server("--data-dir", tmp_path / "srv")
    flags = ["--file", tmp_path / "r.pages", "--page-size", "64K", "--meta", srv.url()]
    assert kvp("put", *flags, "--file-size", "256K", "k0", input=b"x")[0] == 0
    c = srv.client()  # 4 pages: the 4th allocation evicts k0
    assert sorted(c.v_alloc(0, ["a", "b", "c", "d"])) == [0, 1, 2, 3]
    c.close()
    rc, out, err = kvp("put", *flags, "k1", input=b"y")
    assert (rc, out) == (3, b"")
    assert "rank 0 of default/kv has no free page: all 4 are taken, 4 reserved by writes " \
           "not yet confirmed, 0 holding keys" in err, err
    assert "No space left" not in err and "-28" not in err
    assert kvp("exists", *flags, "k1")[0] == 1


def test_bench_store(tmp_path):
    rc, out, err = kvp("bench", "store", "--file", tmp_path / "b.pages", "--page-size", "64K",
                       "--batch", "16", "--rounds", "3", "--json")
    assert rc == 0, err
    r = json.loads(out)
    for k in ("store_put_gbs", "store_get_gbs", "pagefile_write_gbs", "pagefile_read_gbs",
              "put_ratio", "get_ratio", "store_put_keys_s"):
        assert r[k] > 0
    assert (r["page_size"], r["batch"], r["rounds"], r["meta"]) == (PAGE, 16, 3, "embedded")
    # not a terminal: plain lines, one per round, then the summary
    rc, out, err = kvp("bench", "store", "--file", tmp_path / "c.pages", "--page-size", "64K",
                       "--batch", "8", "--rounds", "2")
    assert rc == 0, err
    lines = out.decode().splitlines()
    assert lines[0].startswith("round 0:") and lines[1].startswith("round 1:")
    assert "store / page file" in out.decode() and "\r" not in err
    # "costs 8.0%" or "is faster by 8.0%" per direction, never a signed percentage
    m = re.search(r"store / page file: put ([\d.]+), get ([\d.]+) \(the store (costs|is faster "
                  r"by) ([\d.]+)% on put, (costs|is faster by) ([\d.]+)% on get\)", out.decode())
    assert m, out.decode()
    for ratio, words, pct in ((m[1], m[3], m[4]), (m[2], m[5], m[6])):
        signed = float(pct) if words == "costs" else -float(pct)
        # the ratio is printed to 3 decimals, the percentage to 1
        lo, hi = ((1 / (float(ratio) + d) - 1) * 100 for d in (0.0005, -0.0005))
        assert lo - 0.06 <= signed <= hi + 0.06, (ratio, words, pct)
        assert words == "costs" or float(pct) > 0, (words, pct)
    rc, _, err = kvp("bench", "store", "--rounds", "0")
    assert rc == 2 and "--rounds '0' is not a count" in err


def _state(path):
    st = os.stat(path)
    with open(path, "rb") as f:
        return st.st_size, st.st_mtime_ns, f.read(1 << 16)


def test_one_owner_per_file(tmp_path, start_server):
    """A file put to with PATH.meta is refused under a server, another rank or
    pool, and the other way round; the message names both owners."""
    srv = start_server("--data-dir", tmp_path / "srv")
    path = tmp_path / "shared.pages"
    base = ["--file", path, "--page-size", "64K"]
    assert kvp("put", *base, "--file-size", "1M", "A", input=b"I am key A\n")[0] == 0
    before = _state(path)
    for other in (["--meta", srv.url()], ["--rank", "1"], ["--pool", "p2"],
                  ["--deployment", "d2"], ["--meta", "mem:"]):
        rc, out, err = kvp("put", *base, *other, "B", input=b"I am key B\n")
        assert (rc, out) == (2, b""), other
        assert "the page file belongs to shared.pages.meta beside the file (default/kv rank 0)" \
            in err, err
        assert "shared.pages.owner" in err
    rc, out, err = kvp("put", *base, "--meta", srv.url(), "B", input=b"B")
    assert f"not {srv.url()} (default/kv rank 0)" in err
    assert _state(path) == before
    assert kvp("get", *base, "A") == (0, b"I am key A\n", "")
    # the same owner named another way
    assert kvp("get", *base, "--meta", f"{path}.meta/", "A")[1] == b"I am key A\n"
    # remote first: the embedded default is refused
    p2 = tmp_path / "remote.pages"
    r = ["--file", p2, "--page-size", "64K"]
    assert kvp("put", *r, "--file-size", "1M", "--meta", srv.url("/ns/x"), "K", input=b"k")[0] == 0
    rc, _, err = kvp("exists", *r, "K")
    assert rc == 2 and f"belongs to {srv.url('/ns/x')} (x/kv rank 0)" in err
    assert kvp("exists", *r, "--meta", srv.url("/ns/x"), "K")[:2] == (0, b"K\tpresent\n")
    # without the record (the old metadata gone for good), a new owner takes it
    os.unlink(str(p2) + ".owner")
    assert kvp("exists", *r, "K")[0] == 1


def test_refused_put_changes_nothing(tmp_path, start_server):
    path = tmp_path / "a.pages"
    base = ["--file", path, "--page-size", "64K"]
    assert kvp("put", *base, "--file-size", "4M", "K", input=b"kept")[0] == 0
    before = _state(path)
    (tmp_path / "page.bin").write_bytes(b"x" * 100)
    rc, _, err = kvp("put", "--file", path, "--file-size", "1T", "--page-size", "64K", "K2",
                     tmp_path / "page.bin")
    assert rc == 2 and "holds data" in err
    assert _state(path) == before
    assert kvp("get", *base, "K") == (0, b"kept", "")
    # a new file of less than one page: nothing created
    rc, _, err = kvp("put", "--file", tmp_path / "b.pages", "--file-size", "1M", "--page-size",
                     "2M", "K", tmp_path / "page.bin")
    assert rc == 2 and "0 pages" in err
    # a stopped server: nothing created
    srv = start_server("--data-dir", tmp_path / "srv")
    url = srv.url()
    srv.stop()
    rc, _, err = kvp("put", "--file", tmp_path / "c.pages", "--file-size", "1G", "--page-size",
                     "64K", "--meta", url, "--timeout", "2000", "K", tmp_path / "page.bin")
    assert rc == 3 and "connect" in err.lower()
    left = [n for n in os.listdir(tmp_path) if n.startswith(("b.pages", "c.pages"))]
    assert left == []


def test_missing_directory_refused_unless_mkdir(tmp_path):
    path = tmp_path / "data" / "rank0.pages"
    flags = ["--file", path, "--file-size", "1M", "--page-size", "64K"]
    rc, out, err = kvp("put", *flags, "K", input=b"x")
    assert (rc, out) == (2, b"")
    assert f"its directory {tmp_path / 'data'} does not exist" in err and "--mkdir" in err
    assert not (tmp_path / "data").exists()
    assert kvp("put", *flags, "--mkdir", "K", input=b"x") == (0, b"", "")
    assert kvp("get", "--file", path, "--page-size", "64K", "K")[1] == b"x"


@pytest.mark.parametrize("loc", ["127.0.0.1:18501", "localhost:18000", "[::1]:6379"])
def test_host_port_is_not_a_directory(tmp_path, loc):
    """--meta HOST:PORT without a scheme is refused (exit 2), naming the URL
    meant, and creates nothing: no ./HOST:PORT/ directory, no page file."""
    rc, _, err = kvp("put", "--file", "s.pages", "--file-size", "1M", "--page-size", "64K",
                     "--meta", loc, "K", input=b"x", cwd=tmp_path)
    assert rc == 2, err
    assert f"did you mean http://{loc}?" in err
    assert os.listdir(tmp_path) == []
    rc, _, err = kvp("exists", "--file", "s.pages", "--page-size", "64K", "--meta", loc, "K",
                     cwd=tmp_path)
    assert rc == 2 and os.listdir(tmp_path) == []
    # any location the library refuses as an argument is a bad flag: exit 2 (https was 3)
    rc, _, err = kvp("put", "--file", "s.pages", "--file-size", "1M", "--page-size", "64K",
                     "--meta", f"https://{loc}", "K", input=b"x", cwd=tmp_path)
    assert rc == 2 and "'https:' is not implemented" in err, err
    assert os.listdir(tmp_path) == []


def test_host_port_directory_that_exists_or_file_scheme_still_works(tmp_path):
    """An existing directory named like HOST:PORT is a directory, and file:
    always is one (created when missing)."""
    (tmp_path / "127.0.0.1:18501").mkdir()
    base = ["--file-size", "1M", "--page-size", "64K"]
    assert kvp("put", "--file", "a.pages", *base, "--meta", "127.0.0.1:18501", "K",
               input=b"a", cwd=tmp_path)[:2] == (0, b"")
    assert kvp("get", "--file", "a.pages", "--page-size", "64K", "--meta", "127.0.0.1:18501",
               "K", cwd=tmp_path)[1] == b"a"
    assert any(n.startswith("wal-") for n in os.listdir(tmp_path / "127.0.0.1:18501"))
    assert kvp("put", "--file", "b.pages", *base, "--meta", "file:localhost:18000", "K",
               input=b"b", cwd=tmp_path)[0] == 0
    assert (tmp_path / "localhost:18000").is_dir()


# A bad flag or location, for every command that takes one: exit 2 and
# nothing created. ("serve" is given 127.0.0.1:0, so no port is in use.)
# serve --meta https:/HOST:PORT/ftp:/redis:// and a --data-dir through a
# file or a missing parent, and bench io's --file there, were 1 and 3.
BAD_INVOCATIONS = [
    ["serve", "--listen", "127.0.0.1:0", "--meta", "https://127.0.0.1:1"],
    ["serve", "--listen", "127.0.0.1:0", "--meta", "127.0.0.1:1"],
    ["serve", "--listen", "127.0.0.1:0", "--meta", "ftp://x"],
    ["serve", "--listen", "127.0.0.1:0", "--meta", "redis://"],
    ["serve", "--listen", "127.0.0.1:0", "--data-dir", "afile"],
    ["serve", "--listen", "127.0.0.1:0", "--data-dir", "afile/d"],
    ["serve", "--listen", "127.0.0.1:0", "--data-dir", "none/x/y"],
    ["serve", "--listen", "nonsense"],
    ["serve", "--bogus"],
    ["put", "--file", "f", "--file-size", "1M", "--page-size", "64K", "--meta",
     "https://127.0.0.1:1", "K"],
    ["put", "--file", "f", "--file-size", "1M", "--page-size", "64K", "--meta", "ftp://x", "K"],
    ["put", "--file", "afile/f", "--file-size", "1M", "--page-size", "64K", "K"],
    ["put", "--bogus", "K"],
    ["get", "--file", "afile/f", "--page-size", "64K", "K"],
    ["exists", "--file", "f", "--page-size", "64X", "K"],
    ["delete", "--bogus", "K"],
    ["bench", "io", "--file", "none/x/f", "--seconds", "1"],
    ["bench", "io", "--file", "afile/f", "--seconds", "1"],
    ["bench", "io", "--bogus"],
    ["bench", "meta", "https://127.0.0.1:1"],
    ["bench", "meta", "127.0.0.1:1"],
    ["bench", "store", "--file", "f", "--meta", "https://127.0.0.1:1"],
    ["bench", "store", "--file", "none/x/f"],
    ["bench", "store", "--bogus"],
    ["inspect", "afile"],
    ["fsck", "https://127.0.0.1:1"],
    ["bogus"],
]


@pytest.mark.parametrize("args", BAD_INVOCATIONS, ids=" ".join)
def test_bad_flag_or_location_exits_2(tmp_path, args):
    (tmp_path / "afile").write_bytes(b"")
    rc, out, err = kvp(*args, cwd=tmp_path)
    assert rc == 2, (rc, err)
    assert err.strip()
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_data_dir_in_use_said_once_in_serve_words(tmp_path, start_server):
    """A data directory that a kvpage serve holds: the second serve and an
    embedded put say so once, in the same words, and change nothing."""
    data = tmp_path / "busy"
    start_server("--data-dir", data)
    words = f"data directory {data} is busy: in use by another kvpage process"
    before = sorted(os.listdir(data))
    p = subprocess.run([require_bin(), "serve", "--listen", "127.0.0.1:0", "--data-dir", data],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.count("in use") == 1 and words in p.stderr, p.stderr
    rc, _, err = kvp("put", "--file", tmp_path / "f", "--file-size", "1M", "--page-size", "64K",
                     "--meta", data, "K", input=b"x")
    assert rc == 3 and err.count("in use") == 1 and words in err, err
    assert sorted(os.listdir(data)) == before
    assert not (tmp_path / "f").exists()
