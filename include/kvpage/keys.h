/*
 * kvpage/keys.h — page keys: the key of each full page of a token sequence,
 * chained so that a page's key names the whole prefix up to its end.
 *
 * The construction (SHA-256, keys in lowercase hex):
 *
 *   key[0] = hex(SHA-256(prior || le32(t[0]) || ... || le32(t[P-1])))
 *   key[i] = hex(SHA-256(unhex(key[i-1]) || le32(t[iP]) || ... || le32(t[iP+P-1])))
 *
 * where P is page_tokens, le32(t) the token id as 4 bytes little-endian,
 * unhex the 32 raw bytes of a 64-character hex key, and prior is
 *   - unhex(parent)                               when a parent key is given;
 *   - nothing (no bytes)                          with no parent and an empty salt;
 *   - SHA-256("kvpage-salt" 0x00 || salt)         with no parent and a non-empty
 *     (the 12 bytes "kvpage-salt\0", then the     salt (32 raw bytes).
 *     salt_len bytes of the salt)
 *
 * With an empty salt the keys are exactly SGLang's HiCache chain
 * (get_hash_str(page_tokens, prior_hash) in mem_cache/hicache_storage.py):
 * the same tokens give the same keys. A salted chain equals SGLang's chain
 * started with prior_hash = hex(SHA-256("kvpage-salt\0" || salt)), so any
 * implementation of get_hash_str reproduces it. The salt is meant for what
 * the engines' keys leave out and what makes a page's bytes differ: model,
 * revision, KV dtype, layout, tensor-parallel size and rank split. Two
 * deployments with different salts never share a page by accident. The salt
 * is hashed only into the first page of a chain: a call given a parent
 * continues a chain already salted (or not) and ignores salt.
 *
 * Token ids are uint32_t, as SGLang encodes them (non-negative, below 2^32);
 * converting other ids (negative, wider) is the caller's business.
 * tests/unit/page_keys_vectors.py computes the known vectors with hashlib.
 *
 * Thread-safe; no state between calls.
 */
#ifndef KVPAGE_KEYS_H
#define KVPAGE_KEYS_H

#include <stddef.h>
#include <stdint.h>
#include "kvpage/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_PAGE_KEY_LEN 64 /* hex characters of a page key, without the NUL */

/*
 * Computes the keys of the ntokens / page_tokens full pages of tokens (a
 * partial last page has no key and is ignored) into keys[0..), each 64
 * lowercase hex characters and a NUL.
 *
 *   parent    NULL to start a chain (salted when salt_len > 0), or the key of
 *             the page before tokens[0] to continue one: exactly 64 hex
 *             characters (either case), then a NUL; salt is then ignored.
 *   salt      salt_len bytes (any bytes, NUL included); NULL when salt_len 0.
 *   max_keys  room in keys; keys may be NULL when max_keys is 0.
 *   nkeys     when non-NULL, set to the number of full pages (also on
 *             -ENOSPC: the room needed).
 *
 * Returns 0, or:
 *   -EINVAL   page_tokens 0; tokens NULL with ntokens > 0; salt NULL with
 *             salt_len > 0; keys NULL with max_keys > 0; a parent that is not
 *             64 hex characters (err->index = the first bad character, or -1
 *             for a wrong length; err->value = its length). KVP_RULE_ARG.
 *   -ENOSPC   max_keys below the number of full pages; nothing written.
 *             KVP_RULE_TOO_MANY, err->value = keys needed, err->limit = max_keys.
 *   -ENOMEM, -EIO  OpenSSL failed (KVP_RULE_IO).
 */
KVP_API int kvp_page_keys(const uint32_t *tokens, size_t ntokens, size_t page_tokens,
                          const char *parent, const void *salt, size_t salt_len,
                          char (*keys)[KVP_PAGE_KEY_LEN + 1], size_t max_keys, size_t *nkeys,
                          struct kvp_error *err);

#ifdef __cplusplus
}
#endif
#endif
