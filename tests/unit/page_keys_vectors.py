#!/usr/bin/env python3
"""Known vectors of kvp_page_keys (include/kvpage/keys.h) for
tests/unit/test_page_keys.c, computed with Python's hashlib.

get_hash_str is SGLang's page hash (python/sglang/srt/mem_cache/
hicache_storage.py); page_keys chains it over the full pages of a token list,
as HiCache does, and adds kvpage's salt: a non-empty salt makes the first
page's prior hash SHA-256(b"kvpage-salt\\0" + salt). Run it and paste its
output into the test when a vector is added:
    /usr/bin/python3 tests/unit/page_keys_vectors.py
"""
import hashlib

SALT_DOMAIN = b"kvpage-salt\0"


def get_hash_str(token_ids, prior_hash=None):
    """SGLang's get_hash_str, as it is."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def page_keys(tokens, page, parent=None, salt=b""):
    """What kvp_page_keys returns: one key per full page; the salt only
    when the chain starts here (parent is None)."""
    prior = parent
    if prior is None and salt:
        prior = hashlib.sha256(SALT_DOMAIN + salt).hexdigest()
    keys = []
    for i in range(len(tokens) // page):
        prior = get_hash_str(tokens[i * page:(i + 1) * page], prior)
        keys.append(prior)
    return keys


CASES = [
    ("seq16_p4", list(range(16)), 4, b""),
    ("big_p3", [0xFFFFFFFF, 123456789, 0, 0x80000000, 1, 0xFFFFFFFE, 42, 7, 65536], 3, b""),
    ("seq5_p1", list(range(5)), 1, b""),
    ("seq10_p4", list(range(10)), 4, b""),  # 2 full pages; tokens 8, 9 ignored
    ("seq16_p4_salt", list(range(16)), 4, b"model=llama-3-8b;dtype=bf16;tp=2"),
    ("seq16_p4_salt2", list(range(16)), 4, b"model=llama-3-8b;dtype=fp8;tp=2"),
]


def main():
    for name, tokens, page, salt in CASES:
        print(f"/* {name}: tokens {tokens}, page {page}, salt {salt!r} */")
        for k in page_keys(tokens, page, salt=salt):
            print(f'"{k}",')
    # The salt's prior hash, and the salted chain as SGLang's function sees it.
    salt = CASES[4][3]
    prior = hashlib.sha256(SALT_DOMAIN + salt).hexdigest()
    print(f"/* prior of salt {salt!r}: {prior} */")
    assert page_keys(list(range(16)), 4, salt=salt)[0] == get_hash_str(range(4), prior)
    # Continuing a chain: parent = key 1 of seq16_p4, tokens 8..15.
    full = page_keys(list(range(16)), 4)
    assert page_keys(list(range(8, 16)), 4, parent=full[1]) == full[2:]
    # The salt is not applied again when a parent is given.
    assert page_keys(list(range(8, 16)), 4, parent=full[1], salt=salt) == full[2:]


if __name__ == "__main__":
    main()
