"""The constructors that take sizes (PageFile, Store, compat.Hf3fsClient)
take the command line's size strings too (src/util/size.h: K, M, G, T are
powers of 1024, then optionally iB or B); ints keep working; a bad string is
a ValueError naming the argument, and nothing is created."""
import pytest

import kvpage
from kvpage.compat import Hf3fsClient

GOOD = [("4096", 4096), ("4k", 4096), ("4K", 4096), ("4KB", 4096), ("4KiB", 4096),
        ("2m", 2 << 20), ("2M", 2 << 20), ("2MiB", 2 << 20), ("1G", 1 << 30), ("1gB", 1 << 30),
        ("1T", 1 << 40), ("1TiB", 1 << 40), ("16777215T", (1 << 64) - (1 << 40))]
BAD = ["", "G", "4X", "4 G", " 4G", "4G ", "-1", "+1", "1.5G", "4Gb", "4Gi", "4B", "4iB",
       "0x10", "4GG", "16777216T", "18446744073709551616", "١"]


@pytest.mark.parametrize("text,value", GOOD)
def test_size_strings(text, value):
    from kvpage._size import size_arg
    assert size_arg("PageFile", "size", text) == value
    assert size_arg("PageFile", "size", value) == value  # ints as before


@pytest.mark.parametrize("text", BAD)
def test_bad_size_strings_are_refused(tmp_path, text):
    path = tmp_path / "f.pages"
    calls = [lambda: kvpage.PageFile(path, text, 4096),
             lambda: kvpage.PageFile(path, 1 << 20, text),
             lambda: kvpage.Store(path, text, 4096, meta="mem:"),
             lambda: kvpage.Store(path, 1 << 20, text, meta="mem:"),
             lambda: Hf3fsClient(str(path), text, 4096, 8),
             lambda: Hf3fsClient(str(path), 1 << 20, text, 8)]
    names = ["size", "bytes_per_page", "file_size", "bytes_per_page", "size", "bytes_per_page"]
    for call, name in zip(calls, names):
        with pytest.raises(ValueError) as e:
            call()
        if text == "" and "Store: bytes_per_page is required" in str(e.value):
            continue  # Store's own check of a missing page size comes first
        assert f"{name} {text!r} is not a size" in str(e.value)
        assert "powers of 1024" in str(e.value)
        assert not path.exists()


def test_pagefile_takes_size_strings(tmp_path):
    with kvpage.PageFile(tmp_path / "f.pages", "1M", "64K", entries=2) as pf:
        assert (pf.file_size, pf.bytes_per_page) == (1 << 20, 64 << 10)
        page = bytearray(b"z" * (64 << 10))
        assert pf.write([3 << 16], [page]) == [64 << 10]
        back = bytearray(64 << 10)
        assert pf.read([3 << 16], [back]) == [64 << 10] and back == page


def test_store_takes_size_strings(tmp_path):
    with kvpage.Store(tmp_path / "f.pages", "4M", "1M", meta="mem:") as s:
        assert s.bytes_per_page == 1 << 20
        assert s.put(["k"], [bytearray(b"v" * 100)]) == [kvpage.STORED]
    # reopened with the same geometry given as ints
    with kvpage.Store(tmp_path / "g.pages", "4MiB", "1MiB") as s:
        s.put(["k"], [bytearray(b"v" * 100)])
    with kvpage.Store(tmp_path / "g.pages", 4 << 20, 1 << 20) as s:
        buf = bytearray(100)
        lead, res = s.get(["k"], [buf])
        assert lead == 1 and buf == b"v" * 100


def test_compat_client_takes_size_strings(tmp_path):
    c = Hf3fsClient(str(tmp_path / "hicache.0.bin"), "1M", "64K", 8)
    try:
        assert (c.get_size(), c.bytes_per_page) == (1 << 20, 64 << 10)
    finally:
        c.close()


def test_the_library_parses_sizes():
    """The grammar is the library's (kvp_parse_size, kvpage/size.h): the same
    answers as size_arg, and a failure leaves the output as it was."""
    import ctypes
    import errno
    from kvpage._lib import lib
    lib.kvp_parse_size.restype = ctypes.c_int
    lib.kvp_parse_size.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
    for text, value in GOOD:
        out = ctypes.c_uint64(7)
        assert lib.kvp_parse_size(text.encode(), ctypes.byref(out)) == 0, text
        assert out.value == value
    for text in BAD:
        out = ctypes.c_uint64(7)
        assert lib.kvp_parse_size(text.encode(), ctypes.byref(out)) == -errno.EINVAL, text
        assert out.value == 7
    assert lib.kvp_parse_size(None, ctypes.byref(ctypes.c_uint64())) == -errno.EINVAL
    assert lib.kvp_parse_size(b"4G", None) == -errno.EINVAL


@pytest.mark.parametrize("text", ["4\0", "4G\0", "4\0G", "\0"])
def test_a_nul_in_a_size_string_is_refused(text):
    """C would stop reading at the NUL; the string as a whole is not a size."""
    from kvpage._size import size_arg
    with pytest.raises(ValueError, match="is not a size"):
        size_arg("PageFile", "size", text)
