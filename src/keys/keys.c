/* Page keys (kvpage/keys.h): SGLang's chained SHA-256 page hash, with a salt
 * for the first page. SHA-256 is OpenSSL's (libcrypto, EVP interface). */
#include <errno.h>
#include <stdint.h>
#include <openssl/evp.h>

#include "kvpage/keys.h"
#include "util/error.h"
#include "util/hex.h"

#define DIGEST_LEN 32
#define TOKEN_CHUNK 256 /* tokens encoded per EVP_DigestUpdate on a big-endian host */

static const char salt_domain[] = "kvpage-salt"; /* hashed with its NUL: 12 bytes */

/* parent as 32 bytes into out, else -EINVAL with err filled. */
static int parse_parent(const char *parent, unsigned char *out, struct kvp_error *err)
{
    size_t len = 0;
    while (len <= KVP_PAGE_KEY_LEN && parent[len])
        len++;
    if (len != KVP_PAGE_KEY_LEN) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)len, KVP_PAGE_KEY_LEN,
                     "parent key has %s%zu characters, not %d hex characters",
                     len > KVP_PAGE_KEY_LEN ? "more than " : "", len > KVP_PAGE_KEY_LEN ? 64 : len,
                     KVP_PAGE_KEY_LEN);
        return -EINVAL;
    }
    for (size_t i = 0; i < KVP_PAGE_KEY_LEN; i += 2) {
        int hi = kvp__hex_value(parent[i]), lo = kvp__hex_value(parent[i + 1]);
        if (hi < 0 || lo < 0) {
            size_t bad = hi < 0 ? i : i + 1;
            kvp__set_err(err, -EINVAL, KVP_RULE_ARG, (int64_t)bad, (int64_t)len, KVP_PAGE_KEY_LEN,
                         "parent key character %zu is not a hex digit", bad);
            return -EINVAL;
        }
        out[i / 2] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

static void to_hex(const unsigned char *d, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < DIGEST_LEN; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * DIGEST_LEN] = '\0';
}

/* Feeds n token ids to ctx as 4-byte little-endian. 1 on success (OpenSSL's convention). */
static int update_tokens(EVP_MD_CTX *ctx, const uint32_t *t, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return EVP_DigestUpdate(ctx, t, n * sizeof *t);
#else
    unsigned char buf[4 * TOKEN_CHUNK];
    while (n) {
        size_t k = n < TOKEN_CHUNK ? n : TOKEN_CHUNK;
        for (size_t i = 0; i < k; i++) {
            buf[4 * i] = (unsigned char)t[i];
            buf[4 * i + 1] = (unsigned char)(t[i] >> 8);
            buf[4 * i + 2] = (unsigned char)(t[i] >> 16);
            buf[4 * i + 3] = (unsigned char)(t[i] >> 24);
        }
        if (!EVP_DigestUpdate(ctx, buf, 4 * k))
            return 0;
        t += k;
        n -= k;
    }
    return 1;
#endif
}

static int bad_arg(struct kvp_error *err, const char *what)
{
    kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0, "%s", what);
    return -EINVAL;
}

KVP_API int kvp_page_keys(const uint32_t *tokens, size_t ntokens, size_t page_tokens,
                          const char *parent, const void *salt, size_t salt_len,
                          char (*keys)[KVP_PAGE_KEY_LEN + 1], size_t max_keys, size_t *nkeys,
                          struct kvp_error *err)
{
    if (page_tokens == 0)
        return bad_arg(err, "page_tokens is 0");
    if (ntokens && !tokens)
        return bad_arg(err, "tokens is NULL");
    if (salt_len && !salt)
        return bad_arg(err, "salt is NULL with salt_len > 0");
    if (max_keys && !keys)
        return bad_arg(err, "keys is NULL with max_keys > 0");

    unsigned char prior[DIGEST_LEN];
    int have_prior = 0;
    if (parent) {
        int rc = parse_parent(parent, prior, err);
        if (rc)
            return rc;
        have_prior = 1;
    }

    size_t n = ntokens / page_tokens;
    if (nkeys)
        *nkeys = n;
    if (n > max_keys) {
        kvp__set_err(err, -ENOSPC, KVP_RULE_TOO_MANY, -1, (int64_t)n, (int64_t)max_keys,
                     "%zu full pages need %zu keys; keys has room for %zu", n, n, max_keys);
        return -ENOSPC;
    }
    if (n == 0)
        return 0;

    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
    int rc = 0;
    if (!ctx || !md) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_IO, -1, 0, 0,
                     "OpenSSL could not make a SHA-256 context");
        rc = -ENOMEM;
        goto out;
    }
    if (!have_prior && salt_len) {
        unsigned int len = 0;
        if (!EVP_DigestInit_ex(ctx, md, NULL) ||
            !EVP_DigestUpdate(ctx, salt_domain, sizeof salt_domain) ||
            !EVP_DigestUpdate(ctx, salt, salt_len) || !EVP_DigestFinal_ex(ctx, prior, &len))
            goto failed;
        have_prior = 1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned int len = 0;
        if (!EVP_DigestInit_ex(ctx, md, NULL) ||
            (have_prior && !EVP_DigestUpdate(ctx, prior, DIGEST_LEN)) ||
            !update_tokens(ctx, tokens + i * page_tokens, page_tokens) ||
            !EVP_DigestFinal_ex(ctx, prior, &len))
            goto failed;
        have_prior = 1;
        to_hex(prior, keys[i]);
    }
    goto out;
failed:
    kvp__set_err(err, -EIO, KVP_RULE_IO, -1, 0, 0, "OpenSSL's SHA-256 failed");
    rc = -EIO;
out:
    EVP_MD_free(md);
    EVP_MD_CTX_free(ctx);
    return rc;
}
