"""One page file, one metadata owner (PATH.owner), across every way kvpage
opens a file: the command line, kvpage.Store, kvpage.store.claim and the
compat client, with embedded metadata (PATH.meta, file:, mem:) and a real
kvpage serve. And a refused open changes nothing; a missing directory is
refused, naming it, unless mkdir."""
import errno
import os

import pytest

import kvpage
from kvpage.compat import Hf3fsClient
from kvpage.store import claim
from kvpserver import run_kvp

BPP = 1 << 20


def kvp(*args, input=None):
    return run_kvp(*args, input=input, stdout="bytes")


def state(path):
    """What a refused open must leave as it was: size, mtime, the bytes."""
    st = os.stat(path)
    with open(path, "rb") as f:
        return st.st_size, st.st_mtime_ns, f.read()


def page(text):
    b = bytearray(BPP)
    b[:len(text)] = text
    return b


def test_the_issue_scenario_cli_then_python_remote(tmp_path, server):
    """CLI put A (PATH.meta), then a Store on a kvpage serve puts B into the
    same file: refused, naming both owners; A still reads A."""
    path = tmp_path / "shared.pages"
    rc, _, err = kvp("put", "--file", path, "--file-size", "4M", "--page-size", "1M", "A",
                     input=b"I am key A\n")
    assert (rc, err) == (0, "")
    before = state(path)
    with pytest.raises(kvpage.KvpageError) as e:
        kvpage.Store(path=str(path), file_size=4 << 20, bytes_per_page=BPP, meta=server.url())
    assert e.value.errno == errno.EEXIST and e.value.rule == "owner"
    msg = str(e.value)
    assert "belongs to shared.pages.meta beside the file (default/kv rank 0), not " \
        f"{server.url()} (default/kv rank 0)" in msg
    assert "shared.pages.owner" in msg and "use that metadata" in msg
    assert state(path) == before
    rc, out, err = kvp("get", "--file", path, "--page-size", "1M", "A")
    assert (rc, out, err) == (0, b"I am key A\n", "")


def test_python_remote_then_cli_embedded(tmp_path, server):
    path = tmp_path / "r0.pages"
    with kvpage.Store(str(path), 4 << 20, BPP, meta=server.url("/ns/team")) as s:
        assert s.put(["B"], [page(b"B")]) == [kvpage.STORED]
    rc, out, err = kvp("get", "--file", path, "--page-size", "1M", "B")
    assert (rc, out) == (2, b"")
    assert "cannot open the store" in err and "belongs to " + server.url("/ns/team") in err
    assert "(team/kv rank 0), not r0.pages.meta beside the file (default/kv rank 0)" in err
    # the same owner, from the command line: B is there
    rc, out, _ = kvp("exists", "--file", path, "--page-size", "1M", "--meta",
                     server.url("/ns/team/"), "B")
    assert (rc, out) == (0, b"B\tpresent\n")


@pytest.mark.parametrize("where", ["embedded", "file", "mem", "remote"])
def test_same_owner_reopens_another_refused(tmp_path, where, request):
    path = tmp_path / "rank.pages"
    meta = {"embedded": None, "file": str(tmp_path / "md"), "mem": "mem:"}.get(where)
    if where == "remote":
        meta = request.getfixturevalue("server").url()
    with kvpage.Store(path, 8 << 20, BPP, meta=meta, rank=1, pool="p") as s:
        s.put(["k"], [page(b"kept")])
    before = state(path)
    again = {"file": "file:" + str(tmp_path / "md") + "/"}.get(where, meta)
    with kvpage.Store(path, 0, BPP, meta=again, rank=1, pool="p") as s:
        assert s.num_pages == 8
        if where != "mem":  # mem: forgets its keys with the process's store
            assert s.exists(["k"]) == (1, [True])
    for other in ({"rank": 2, "pool": "p"}, {"rank": 1, "pool": "q"},
                  {"rank": 1, "pool": "p", "deployment": "d2"},
                  {"rank": 1, "pool": "p", "meta": "mem:" if where != "mem" else None}):
        kw = dict(other)
        m = kw.pop("meta", meta)
        with pytest.raises(kvpage.KvpageError) as e:
            kvpage.Store(path, 8 << 20, BPP, meta=m, **kw)
        assert e.value.errno == errno.EEXIST and e.value.rule == "owner", other
        assert "the page file belongs to" in str(e.value)
    assert state(path) == before
    owner = (tmp_path / "rank.pages.owner").read_text()
    assert owner.startswith("kvpage page-file owner 1\nlocation ")
    assert owner.endswith("\ndeployment default\npool p\nrank 1\n")


def test_compat_client_with_owner(tmp_path, server):
    path = str(tmp_path / "hf3fs_vllm_data_file_0")
    with kvpage.Store(path, 4 << 20, BPP) as s:  # owned by PATH.meta
        s.put(["A"], [page(b"A")])
    before = state(path)
    with pytest.raises(kvpage.KvpageError) as e:
        Hf3fsClient(path, 4 << 20, BPP, 8, owner={"location": server.url()})
    assert e.value.errno == errno.EEXIST and e.value.rule == "owner"
    assert state(path) == before
    # the owner it has: accepted
    c = Hf3fsClient(path, 4 << 20, BPP, 8, owner={"location": path + ".meta"})
    c.close()
    # without an owner the client cannot know keys: it is not guarded
    Hf3fsClient(path, 4 << 20, BPP, 8).close()
    # a new file is claimed for the client's owner; a Store then must match it
    p2 = str(tmp_path / "sub" / "f1")
    c = Hf3fsClient(p2, 4 << 20, BPP, 8, owner={"location": server.url(), "rank": 1})
    c.close()
    claim(p2, server.url(), rank=1)
    with pytest.raises(kvpage.KvpageError):
        claim(p2, server.url(), rank=0)
    with kvpage.Store(p2, 0, BPP, meta=server.url(), rank=1) as s:
        assert s.num_pages == 4
    with pytest.raises(kvpage.KvpageValueError):
        Hf3fsClient(p2, 4 << 20, BPP, 8, owner={"url": server.url()})


def test_refused_store_changes_nothing(tmp_path, server):
    path = tmp_path / "a.pages"
    with kvpage.Store(path, 4 << 20, BPP) as s:
        s.put(["K"], [page(b"K")])
    before = state(path)
    with pytest.raises(kvpage.KvpageError) as e:  # 1 TiB over a rank holding data
        kvpage.Store(path, 1 << 40, BPP)
    assert e.value.errno == errno.EEXIST and e.value.rule == "resize_held"
    with pytest.raises(kvpage.KvpageValueError):  # fewer than one page
        kvpage.Store(path, 1 << 19, BPP)
    assert state(path) == before
    with kvpage.Store(path, 0, BPP) as s:
        assert s.num_pages == 4 and s.exists(["K"]) == (1, [True])
    # new files: nothing is left of a refused open
    new = tmp_path / "new.pages"
    with pytest.raises(kvpage.KvpageValueError):
        kvpage.Store(new, 1 << 20, 2 << 20)
    dead = server.url()
    server.stop()
    with pytest.raises(kvpage.KvpageError):
        kvpage.Store(new, 1 << 30, BPP, meta=dead, retries=0)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("new")]


def test_missing_directory_refused_unless_mkdir(tmp_path):
    path = tmp_path / "data" / "rank0.pages"
    with pytest.raises(kvpage.KvpageError) as e:
        kvpage.Store(path, 4 << 20, BPP)
    assert e.value.errno == errno.ENOENT
    assert f"its directory {tmp_path / 'data'} does not exist" in str(e.value)
    assert not (tmp_path / "data").exists()
    with pytest.raises(kvpage.KvpageError) as e:
        kvpage.PageFile(path, 4 << 20, BPP)
    assert e.value.errno == errno.ENOENT and str(tmp_path / "data") in str(e.value)
    assert not (tmp_path / "data").exists()
    with kvpage.Store(path, 4 << 20, BPP, mkdir=True) as s:
        assert s.num_pages == 4
    p2 = tmp_path / "x" / "y" / "pf"
    with kvpage.PageFile(p2, 4 << 20, BPP, mkdir=True) as f:
        assert f.size == 4 << 20
    # the compat client creates directories, as the engines' clients do
    Hf3fsClient(str(tmp_path / "e" / "f" / "hicache.0.bin"), 4 << 20, BPP, 8).close()
    assert (tmp_path / "e" / "f" / "hicache.0.bin").stat().st_size == 4 << 20


def test_missing_directory_hint_in_python_words(tmp_path):
    """The refusal's hint is the keyword that fixes it (mkdir=True), not the
    command line's --mkdir or the C flag's name; the CLI's says --mkdir."""
    path = tmp_path / "data" / "rank0.pages"
    for open_ in (lambda: kvpage.Store(path, 4 << 20, BPP),
                  lambda: kvpage.PageFile(path, 4 << 20, BPP)):
        with pytest.raises(kvpage.KvpageError) as e:
            open_()
        msg = str(e.value)
        assert msg.endswith("(create it, or pass mkdir=True)"), msg
        assert "--mkdir" not in msg and "KVP_PAGEFILE" not in msg
    rc, _, err = kvp("put", "--file", path, "--file-size", "4M", "--page-size", "1M", "K",
                     input=b"x")
    assert rc == 2 and err.rstrip().endswith("(create it, or give --mkdir)"), err
    assert not (tmp_path / "data").exists()


def test_resize_refusal_names_store_clear(tmp_path):
    """A rank that holds pages refuses a Store of other sizes; from Python the
    hint names Store.clear() (and still the command), and following it works."""
    path = tmp_path / "r.pages"
    with kvpage.Store(path, 4 << 20, BPP) as st:
        st.put(["a"], [bytes(BPP)])
    with pytest.raises(kvpage.KvpageError) as e:
        kvpage.Store(path, 4 << 20, BPP // 2)
    msg = str(e.value)
    assert "clear the rank (Store.clear() on a Store opened with its present file size" in msg, msg
    assert "kvpage clear --file" in msg and msg.endswith("or keep the file size and page size"), msg
    with kvpage.Store(path, 4 << 20, BPP) as st:
        st.clear()
    with kvpage.Store(path, 4 << 20, BPP // 2) as st:
        assert st.bytes_per_page == BPP // 2
