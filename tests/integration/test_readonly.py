"""Read-only commands write nothing (issue 36 §2): `kvpage exists`, `get`,
`inspect`, `fsck` and every refused command leave every file of a store --
the page file, PATH.meta and each file in it, PATH.owner -- byte for byte
and owner for owner as they were (content hash, mode, uid, gid, mtime,
size, and no file added or removed). Run through the real binary; and a
store made by one user and read by another (root) keeps working for its
owner."""
import hashlib
import os
import shutil
import tempfile

import pytest

from kvpserver import run_kvp

NOBODY = 65534


def kvp(*args, input=None, user=None):
    """Runs the kvpage binary (as uid `user` when given); returns (exit
    status, stdout bytes, stderr text)."""
    def drop():
        os.setgroups([])
        os.setgid(user)
        os.setuid(user)
    return run_kvp(*args, input=input, stdout="bytes",
                   preexec_fn=drop if user is not None else None)


def store_files(path):
    """Every file and directory of the store at path: {name: (kind, sha256,
    mode, uid, gid, mtime_ns, size)}."""
    path = str(path)
    names = [path, path + ".owner", path + ".meta"]
    meta = path + ".meta"
    if os.path.isdir(meta):
        names += [os.path.join(meta, n) for n in os.listdir(meta)]
    out = {}
    for n in names:
        try:
            st = os.lstat(n)
        except FileNotFoundError:
            continue
        digest = None
        if os.path.isfile(n):
            with open(n, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        out[n] = (os.path.isdir(n), digest, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns,
                  st.st_size)
    return out


def made_store(path, user=None):
    """A store at path with two keys put (as uid user when given)."""
    base = ["--file", path, "--page-size", "64K"]
    assert kvp("put", *base, "--file-size", "1M", "A", input=b"I am A", user=user)[0] == 0
    assert kvp("put", *base, "B", input=b"I am B", user=user)[0] == 0
    return base


def reads(path, base, other_url):
    """(command, expected exit status) of every read and refusal checked."""
    meta = f"{path}.meta"
    return [
        (["exists", *base, "A", "B", "nope"], 1),
        (["get", *base, "A"], 0),
        (["get", *base, "nope"], 1),
        (["exists", *base, "x" * 1025], 2),                    # a bad key
        (["get", *base, ""], 2),                               # an empty key
        (["get", "--file", path, "--page-size", "32K", "A"], 2),  # another page size
        (["exists", "--file", path, "--page-size", "128K", "A"], 2),
        (["get", *base, "--meta", other_url, "A"], 2),         # owned by other metadata
        (["exists", *base, "--rank", "1", "A"], 2),            # another rank's owner
        (["put", "--file", path, "--page-size", "32K", "C"], 2),  # a put refused
        (["put", *base, "--file-size", "1T", "C"], 2),
        (["put", *base, "--meta", other_url, "C"], 2),
        (["put", *base, "C", "/nonexistent/input"], 2),
        (["delete", *base, "--pool", "p2", "A"], 2),
        (["get", *base, "--bogus", "A"], 2),
        (["inspect", meta], 0),
        (["fsck", meta], 0),
    ]


def test_reads_and_refusals_write_nothing(tmp_path, start_server):
    path = tmp_path / "s.pages"
    base = made_store(path)
    srv = start_server("--data-dir", tmp_path / "srv")
    before = store_files(path)
    assert len(before) >= 5  # file, owner, meta dir, its LOCK, a log or snapshot
    for cmd, want in reads(path, base, srv.url()):
        rc, out, err = kvp(*cmd, input=b"C")
        assert rc == want, (cmd, rc, err)
        assert store_files(path) == before, cmd
    # and what was read is still there, for a writer too
    assert kvp("get", *base, "A")[:2] == (0, b"I am A")
    assert kvp("put", *base, "C", input=b"I am C")[0] == 0
    assert kvp("get", *base, "C")[:2] == (0, b"I am C")


@pytest.mark.parametrize("kind", ["server", "redis"])
def test_remote_reads_write_nothing_beside_the_file(tmp_path, start_server, kind):
    if kind == "redis":
        import redisfix
        url = redisfix.fresh_location()
    else:
        url = start_server("--data-dir", tmp_path / "srv").url()
    path = tmp_path / "r.pages"
    base = ["--file", path, "--page-size", "64K", "--meta", url]
    assert kvp("put", *base, "--file-size", "1M", "A", input=b"remote A")[0] == 0
    before = store_files(path)
    assert kvp("get", *base, "A")[:2] == (0, b"remote A")
    assert kvp("exists", *base, "A", "Z")[:2] == (1, b"A\tpresent\nZ\tmissing\n")
    assert kvp("get", "--file", path, "--page-size", "64K", "A")[0] == 2  # embedded: not its owner
    assert store_files(path) == before


def test_get_of_a_file_without_metadata_creates_nothing(tmp_path):
    path = tmp_path / "bare.pages"
    path.write_bytes(b"\0" * (1 << 20))
    rc, _, err = kvp("get", "--file", path, "--page-size", "64K", "A")
    assert rc == 1 and "A is not there" in err
    assert kvp("exists", "--file", path, "--page-size", "64K", "A")[:2] == (1, b"A\tmissing\n")
    assert sorted(os.listdir(tmp_path)) == ["bare.pages"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")
def test_store_of_another_user_read_by_root_keeps_working():
    """A store made by nobody, read by root: root's reads leave the files
    nobody's, with their modes, and nobody's next get and put work."""
    top = tempfile.mkdtemp(prefix="kvpage-ro-")
    try:
        os.chmod(top, 0o755)
        d = os.path.join(top, "nobody")
        os.mkdir(d)
        os.chown(d, NOBODY, NOBODY)
        path = os.path.join(d, "s.pages")
        base = made_store(path, user=NOBODY)
        before = store_files(path)
        assert {v[3] for v in before.values()} == {NOBODY}
        assert kvp("exists", *base, "A", "B")[0] == 0
        assert kvp("get", *base, "A")[:2] == (0, b"I am A")
        assert kvp("get", "--file", path, "--page-size", "32K", "A")[0] == 2
        assert kvp("fsck", path + ".meta")[0] == 0
        assert store_files(path) == before
        assert kvp("get", *base, "B", user=NOBODY)[:2] == (0, b"I am B")
        rc, _, err = kvp("put", *base, "C", input=b"I am C", user=NOBODY)
        assert rc == 0, err
        assert kvp("get", *base, "C", user=NOBODY)[:2] == (0, b"I am C")
        assert {v[3] for v in store_files(path).values()} == {NOBODY}
    finally:
        shutil.rmtree(top)
