"""`kvpage fsck --file PATH` (issue 36 §1): verifies every page of a page
file against its integrity tag (PATH.tags), names each bad page (index,
offset, why), exits 1 when any is bad, 0 when none is, 2 when there is
nothing to verify; and writes nothing. Through the real binary."""
import hashlib
import os

from kvpserver import run_kvp

MB = 1 << 20


def kvp(*args):
    return run_kvp(*args)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns


def put(path, key, data, tmp_path):
    src = tmp_path / (key + ".bin")
    src.write_bytes(data)
    rc, out, err = kvp("put", "--file", path, "--file-size", "8M", "--page-size", "1M", key, src)
    assert rc == 0, err


def test_fsck_file_names_bad_pages_and_writes_nothing(tmp_path):
    path = tmp_path / "s.pages"
    put(path, "a", os.urandom(5000), tmp_path)
    put(path, "b", os.urandom(MB), tmp_path)
    assert os.path.exists(str(path) + ".tags")
    rc, out, err = kvp("fsck", "--file", path)
    assert rc == 0, err
    assert out.startswith("ok: 8 pages of 1048576 bytes: 2 tagged and verified"), out
    assert "6 never written" in out

    # change one byte of the second page behind kvpage's back, and a
    # never-written page (another writer)
    with open(path, "r+b") as f:
        f.seek(MB + 17)
        b = f.read(1)
        f.seek(MB + 17)
        f.write(bytes([b[0] ^ 1]))
        f.seek(5 * MB + 3)
        f.write(b"x")
    before = {p: digest(p) for p in (str(path), str(path) + ".tags")}
    rc, out, err = kvp("fsck", "--file=" + str(path))
    assert rc == 1, (out, err)
    lines = out.splitlines()
    assert lines[0] == "bad page 1 (offset 1048576): its bytes differ from what was written there"
    assert lines[1].startswith("bad page 5 (offset 5242880): it was never written through "
                               "kvpage but is not zeros")
    assert lines[2].startswith("FAIL: 2 of 8 pages of %s fail their integrity tag" % path)
    assert {p: digest(p) for p in before} == before  # read-only: nothing written


def test_fsck_file_without_tags_or_file(tmp_path):
    path = tmp_path / "plain.pages"
    path.write_bytes(os.urandom(2 * MB))  # written by something else, no sidecar
    rc, out, err = kvp("fsck", "--file", path)
    assert rc == 2 and "no tags sidecar" in err, err
    assert not os.path.exists(str(path) + ".tags")  # fsck made none
    rc, out, err = kvp("fsck", "--file", tmp_path / "missing.pages")
    assert rc == 2 and "missing.pages" in err, err
    rc, out, err = kvp("fsck", "--file")
    assert rc == 2 and "usage: kvpage fsck --file PATH" in err
    rc, out, err = kvp("fsck", "--help")
    assert rc == 0 and "kvpage fsck --file PATH" in out
