"""kvpage.page_keys against SGLang's get_hash_str chain, recomputed here with
hashlib (the construction of kvpage/keys.h)."""
import hashlib

import numpy as np
import pytest

import kvpage


def sglang_chain(tokens, page, prior=None):
    keys = []
    for i in range(0, len(tokens) - page + 1, page):
        h = hashlib.sha256()
        if prior is not None:
            h.update(bytes.fromhex(prior))
        for t in tokens[i:i + page]:
            h.update(int(t).to_bytes(4, "little"))
        prior = h.hexdigest()
        keys.append(prior)
    return keys


def test_unsalted_equals_sglang():
    toks = list(range(1000))
    assert kvpage.page_keys(toks, 64) == sglang_chain(toks, 64)
    assert len(kvpage.page_keys(toks, 64)) == 15  # the partial last page has none


def test_salt_and_parent():
    toks = [7] * 32
    salted = kvpage.page_keys(toks, 16, salt=b"model=x;dtype=bf16")
    prior = hashlib.sha256(b"kvpage-salt\0model=x;dtype=bf16").hexdigest()
    assert salted == sglang_chain(toks, 16, prior)
    assert salted != kvpage.page_keys(toks, 16)
    k = kvpage.page_keys(toks, 16)
    assert kvpage.page_keys(toks[16:], 16, parent=k[0]) == k[1:]
    assert kvpage.page_keys(np.array(toks, dtype=np.int64), 16) == k


def test_bad_tokens():
    with pytest.raises(ValueError, match="below 0"):
        kvpage.page_keys([1, -1], 1)
    with pytest.raises(ValueError):
        kvpage.page_keys([2 ** 32], 1)
    with pytest.raises(kvpage.KvpageValueError):
        kvpage.page_keys([1, 2], 0)
