"""Issue 36's repro on the command line: `kvpage put` a page, another writer
overwrites it (here the bytes of the file, as `dd`, a benchmark or a second
engine would), then `kvpage get` of the key fails cleanly: a clear message
naming the page, exit status 3, nothing on standard output, never the other
writer's bytes. The other keys still read; `--no-tags` (every store
command) gives up the check; a page never changed reads as before."""
import os

from test_cli_store import kvp, where  # noqa: F401 (where: the store flags, a fixture)

PAGE = 64 * 1024


def page_of(path, data):
    """The offset of the page that holds data."""
    blob = open(path, "rb").read()
    at = blob.find(data)
    assert at >= 0 and at % PAGE == 0
    return at


def test_get_of_an_overwritten_page_fails_cleanly(where):
    path = where[1]
    a, b = os.urandom(1000), os.urandom(1000)
    assert kvp("put", *where, "--file-size", "1M", "K", input=a)[0] == 0
    assert kvp("put", *where, "L", input=b)[0] == 0
    assert os.path.exists(str(path) + ".tags")
    off = page_of(path, a)
    with open(path, "r+b") as f:  # another writer: the whole page
        f.seek(off)
        f.write(b"\xbe" * PAGE)
    rc, out, err = kvp("get", *where, "K")
    assert rc == 3 and out == b""
    assert err.startswith("kvpage get: K: its page failed its integrity check, so it is not "
                          "printed: ")
    assert f"slot {off // PAGE}" in err or f"page {off // PAGE}" in err, err
    assert err.endswith("; the key is dropped from the metadata (kvpage exists: missing): put it "
                        "again\n") and err.count("\n") == 1, err
    # dropped (issue 36: the next lookup is an honest miss), embedded or on the server
    rc, out, _ = kvp("exists", *where, "K", "L")
    assert (rc, out) == (1, b"K\tmissing\nL\tpresent\n")
    rc, out, err = kvp("get", *where, "K")
    assert (rc, out, err) == (1, b"", "kvpage get: K is not there\n")
    # the other key is intact; the check costs nothing to a good page
    rc, out, err = kvp("get", *where, "L")
    assert (rc, out, err) == (0, b, "")
    # put again: read whole
    assert kvp("put", *where, "K", input=a)[0] == 0
    assert kvp("get", *where, "K")[1] == a


def test_a_rejected_key_stays_when_the_store_cannot_be_written(tmp_path):
    """Embedded, the drop is the one write of a get: refused while a writer
    holds the store (in use), the get still fails cleanly and says the key
    stays; the next get, with the store free, drops it."""
    import fcntl
    flags = ["--file", tmp_path / "rank0.pages", "--page-size", "64K"]
    a = os.urandom(1000)
    assert kvp("put", *flags, "--file-size", "1M", "K", input=a)[0] == 0
    off = page_of(tmp_path / "rank0.pages", a)
    with open(tmp_path / "rank0.pages", "r+b") as f:
        f.seek(off)
        f.write(b"\xbe" * 64)
    lock = open(tmp_path / "rank0.pages.meta" / "LOCK", "rb")
    fcntl.flock(lock, fcntl.LOCK_SH)  # a reader: get reads beside it, but cannot write
    try:
        rc, out, err = kvp("get", *flags, "K")
    finally:
        lock.close()
    assert (rc, out) == (3, b"") and "integrity check" in err, err
    assert err.endswith("the key stays in the metadata: delete it and put it again\n"), err
    assert kvp("exists", *flags, "K")[1] == b"K\tpresent\n"
    rc, _, err = kvp("get", *flags, "K")
    assert rc == 3 and "the key is dropped from the metadata" in err, err
    assert kvp("exists", *flags, "K")[1] == b"K\tmissing\n"


def test_one_byte_changed_is_enough(where):
    path = where[1]
    a = os.urandom(PAGE - 16)
    assert kvp("put", *where, "--file-size", "1M", "K", input=a)[0] == 0
    off = page_of(path, a[:64])
    with open(path, "r+b") as f:
        f.seek(off + 5000)
        old = f.read(1)
        f.seek(off + 5000)
        f.write(bytes([old[0] ^ 1]))
    rc, out, err = kvp("get", *where, "K")
    assert (rc, out) == (3, b"") and "integrity check" in err


def test_no_tags_serves_the_bytes_as_before(where):
    path = where[1]
    a = os.urandom(1000)
    assert kvp("put", *where, "--no-tags", "--file-size", "1M", "K", input=a)[0] == 0
    assert not os.path.exists(str(path) + ".tags")
    off = page_of(path, a)
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(b"\xbe" * 10)
    rc, out, err = kvp("get", *where, "--no-tags", "K")
    assert (rc, err) == (0, "") and out[:10] == b"\xbe" * 10


def test_no_tags_is_in_the_help():
    for cmd in ("put", "get", "exists", "delete"):
        rc, out, _ = kvp(cmd, "--help")
        assert rc == 0 and b"--no-tags" in out, cmd
    rc, out, _ = kvp("bench", "store", "--help")
    assert rc == 0 and b"--no-tags" in out
