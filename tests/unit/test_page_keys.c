/* Unit tests of kvp_page_keys (src/keys): known vectors computed with
 * Python's hashlib by tests/unit/page_keys_vectors.py (SGLang's get_hash_str
 * chain; the salted ones with kvpage's salt), the salt, chains continued from
 * a parent, partial pages, and the argument errors. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "kvpage/keys.h"

#define MAXK 8

/* seq16_p4: tokens 0..15, page 4, no salt (also seq10_p4's first two). */
static const char *const seq16_p4[] = {
    "baed642339816affb3fe8719792d0e4ce82f12db72b7373d244eaa65445800fe",
    "01414b052706d93bd0f1f1646c0e8ca2fa8ef5efd7bcc99f7a1cee8eb11ad052",
    "fd5bd05ab69776768cb177e87c5ef6f8f8dec410a03a3c238a58a89c01ba803c",
    "c7c6af3c1b790b9ea1b276972632ee4eb3c540f8cfe405d75ef562dbb4f23cd5",
};
/* big_p3: the ids of big[], page 3, no salt. */
static const uint32_t big[] = {0xffffffffu, 123456789u, 0, 0x80000000u, 1,
                               0xfffffffeu, 42,         7, 65536};
static const char *const big_p3[] = {
    "b37a63f65de22cc171d44f7b5d821a2150b6e174045645f8daa392601a3d67ac",
    "29b811ef65e36355ad3997ab8009d71c064ca70464f9738f92f2e82c40fe235d",
    "55f73276c388f9201886b8aec046157873f17606a92f26a250fe5e66d73ffaab",
};
/* seq5_p1: tokens 0..4, page 1, no salt. */
static const char *const seq5_p1[] = {
    "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119",
    "53f69ec6a1c7effbd864307243e74feaafa8b26bbdc9d066fe8b22ed64a010bb",
    "a50b91b33b91a230e3b4567831c9cc253151883dbb44c7b7522026eb72237cca",
    "3c1c2168ea076f0037888d7f137f1512d2cdc3f5d42e501d5d426fcc46d21955",
    "84976891391588e2adfff568b4d42ab548c37d2c3af2231a2e6fe62eaf47b39d",
};
/* seq16_p4_salt: tokens 0..15, page 4, salt SALT. */
#define SALT "model=llama-3-8b;dtype=bf16;tp=2"
static const char *const seq16_p4_salt[] = {
    "0ad3c4f17e3bccabb0085edaa5e50d9da96ac9fcf0590a65d0beb38395ec312d",
    "febb7062c5cc9643d674739397aac07c5ffa1c298032ea4ef5c7be067c563929",
    "7bd2ed6c6a255b62dfd1c34d2c357526040b95ac363412ca723ba0e91a5ffb8e",
    "e613c1ae767230e78a59781e5293069a593200f59c982d0c1d9600a15b51e284",
};
/* seq16_p4_salt2: tokens 0..15, page 4, salt SALT2. */
#define SALT2 "model=llama-3-8b;dtype=fp8;tp=2"
static const char *const seq16_p4_salt2[] = {
    "718caaf6071cf7b4b46b72a3dee92da60c4235d708654b85d142a8eab8fe2ba7",
    "217d003a369c6d235d852ccd8eb342fca6b5c331d80c89c9779f50ca2ecdf9c0",
    "71ad3f67f4d106d5ce246abd20c5cff005509192b8daa2bac4ee020e254aabc2",
    "b6fea436f389bb53adbfaa9937349522bfa889b9b47a1c8673c8b1cafe51ced8",
};
/* The salt's prior hash: hex(SHA-256("kvpage-salt\0" SALT)). */
static const char salt_prior[] = "0044eae71ab0dc5d33d2ec3a405a5766d07e4f977c200b6d8bb1cf08b10e55c5";

static uint32_t seq[16];
static char keys[MAXK][KVP_PAGE_KEY_LEN + 1];

/* Computes the keys of tokens and checks them against want[0..nwant). */
static void check_keys(const uint32_t *tokens, size_t ntokens, size_t page, const char *parent,
                       const void *salt, size_t salt_len, const char *const *want, size_t nwant)
{
    struct kvp_error err = {0};
    size_t n = 12345;
    memset(keys, 'x', sizeof keys);
    CHECK_EQ(kvp_page_keys(tokens, ntokens, page, parent, salt, salt_len, keys, MAXK, &n, &err), 0);
    CHECK_EQ(n, nwant);
    for (size_t i = 0; i < nwant && i < MAXK; i++) {
        CHECK(strcmp(keys[i], want[i]) == 0);
        CHECK_EQ(strlen(keys[i]), KVP_PAGE_KEY_LEN);
    }
    if (nwant < MAXK)
        CHECK(keys[nwant][0] == 'x'); /* nothing written past the last full page */
}

static void test_vectors(void)
{
    check_keys(seq, 16, 4, NULL, NULL, 0, seq16_p4, 4);
    check_keys(big, 9, 3, NULL, NULL, 0, big_p3, 3);
    check_keys(seq, 5, 1, NULL, NULL, 0, seq5_p1, 5);
}

static void test_partial_pages(void)
{
    /* 10 tokens, page 4: two keys, tokens 8 and 9 ignored. */
    check_keys(seq, 10, 4, NULL, NULL, 0, seq16_p4, 2);
    /* 15 tokens: the 4th page is partial. */
    check_keys(seq, 15, 4, NULL, NULL, 0, seq16_p4, 3);
    /* Fewer tokens than a page, or none: no key, and tokens may be NULL when 0. */
    check_keys(seq, 3, 4, NULL, NULL, 0, seq16_p4, 0);
    check_keys(NULL, 0, 4, NULL, NULL, 0, seq16_p4, 0);
    size_t n = 9;
    CHECK_EQ(kvp_page_keys(seq, 3, 4, NULL, NULL, 0, NULL, 0, &n, NULL), 0);
    CHECK_EQ(n, 0);
    /* 8 of big's 9 ids with page 3: big_p3 without its last key. */
    check_keys(big, 8, 3, NULL, NULL, 0, big_p3, 2);
}

static void test_parent(void)
{
    /* Continuing from key 1 gives keys 2 and 3 of the whole chain. */
    check_keys(seq + 8, 8, 4, seq16_p4[1], NULL, 0, seq16_p4 + 2, 2);
    check_keys(seq + 4, 12, 4, seq16_p4[0], NULL, 0, seq16_p4 + 1, 3);
    check_keys(big + 3, 6, 3, big_p3[0], NULL, 0, big_p3 + 1, 2);
    /* The salt is not applied again after a parent. */
    check_keys(seq + 8, 8, 4, seq16_p4[1], SALT, strlen(SALT), seq16_p4 + 2, 2);
    check_keys(seq + 4, 12, 4, seq16_p4_salt[0], SALT, strlen(SALT), seq16_p4_salt + 1, 3);
    check_keys(seq + 4, 12, 4, seq16_p4_salt[0], NULL, 0, seq16_p4_salt + 1, 3);
    /* A salted chain is SGLang's chain from the salt's prior hash. */
    check_keys(seq, 16, 4, salt_prior, NULL, 0, seq16_p4_salt, 4);
    /* Upper-case hex is the same parent. */
    char upper[KVP_PAGE_KEY_LEN + 1];
    for (size_t i = 0; i <= KVP_PAGE_KEY_LEN; i++)
        upper[i] = (char)(seq16_p4[1][i] >= 'a' ? seq16_p4[1][i] - 'a' + 'A' : seq16_p4[1][i]);
    check_keys(seq + 8, 8, 4, upper, NULL, 0, seq16_p4 + 2, 2);
}

static void test_salt(void)
{
    check_keys(seq, 16, 4, NULL, SALT, strlen(SALT), seq16_p4_salt, 4);
    check_keys(seq, 16, 4, NULL, SALT2, strlen(SALT2), seq16_p4_salt2, 4);
    for (size_t i = 0; i < 4; i++) {
        CHECK(strcmp(seq16_p4_salt[i], seq16_p4[i]) != 0);
        CHECK(strcmp(seq16_p4_salt[i], seq16_p4_salt2[i]) != 0);
    }
    /* An empty salt, NULL or "", is SGLang's chain. */
    check_keys(seq, 16, 4, NULL, "", 0, seq16_p4, 4);
    check_keys(seq, 16, 4, NULL, NULL, 0, seq16_p4, 4);
    /* The salt's length counts, NUL bytes included: "ab\0" differs from "ab". */
    char k_ab[MAXK][KVP_PAGE_KEY_LEN + 1], k_ab0[MAXK][KVP_PAGE_KEY_LEN + 1];
    CHECK_EQ(kvp_page_keys(seq, 4, 4, NULL, "ab", 2, k_ab, MAXK, NULL, NULL), 0);
    CHECK_EQ(kvp_page_keys(seq, 4, 4, NULL, "ab", 3, k_ab0, MAXK, NULL, NULL), 0);
    CHECK(strcmp(k_ab[0], k_ab0[0]) != 0);
    CHECK(strcmp(k_ab[0], seq16_p4[0]) != 0);
}

/* Calls kvp_page_keys expecting rc and the rule; returns err for more checks. */
static struct kvp_error expect_fail(int rc, int rule, const uint32_t *tokens, size_t ntokens,
                                    size_t page, const char *parent, const void *salt,
                                    size_t salt_len, size_t max_keys)
{
    struct kvp_error err = {0};
    memset(keys, 'x', sizeof keys);
    CHECK_EQ(kvp_page_keys(tokens, ntokens, page, parent, salt, salt_len, max_keys ? keys : NULL,
                           max_keys, NULL, &err),
             rc);
    CHECK_EQ(err.code, rc);
    CHECK_EQ(err.rule, rule);
    CHECK(err.msg[0] != '\0');
    CHECK(keys[0][0] == 'x');
    return err;
}

static void test_errors(void)
{
    expect_fail(-EINVAL, KVP_RULE_ARG, seq, 16, 0, NULL, NULL, 0, MAXK);
    expect_fail(-EINVAL, KVP_RULE_ARG, NULL, 4, 4, NULL, NULL, 0, MAXK);
    expect_fail(-EINVAL, KVP_RULE_ARG, seq, 16, 4, NULL, NULL, 3, MAXK);
    struct kvp_error err = {0};
    CHECK_EQ(kvp_page_keys(seq, 16, 4, NULL, NULL, 0, NULL, 4, NULL, &err), -EINVAL);

    /* Parents: 63 characters, 65, empty, a non-hex character. */
    char p[KVP_PAGE_KEY_LEN + 2];
    memcpy(p, seq16_p4[0], KVP_PAGE_KEY_LEN + 1);
    p[63] = '\0';
    err = expect_fail(-EINVAL, KVP_RULE_ARG, seq, 16, 4, p, NULL, 0, MAXK);
    CHECK_EQ(err.index, -1);
    CHECK_EQ(err.value, 63);
    memcpy(p, seq16_p4[0], KVP_PAGE_KEY_LEN);
    p[64] = '0';
    p[65] = '\0';
    err = expect_fail(-EINVAL, KVP_RULE_ARG, seq, 16, 4, p, NULL, 0, MAXK);
    CHECK_EQ(err.index, -1);
    expect_fail(-EINVAL, KVP_RULE_ARG, seq, 16, 4, "", NULL, 0, MAXK);
    memcpy(p, seq16_p4[0], KVP_PAGE_KEY_LEN + 1);
    p[17] = 'g';
    err = expect_fail(-EINVAL, KVP_RULE_ARG, seq, 16, 4, p, NULL, 0, MAXK);
    CHECK_EQ(err.index, 17);
    p[17] = ' ';
    p[40] = 'Z';
    err = expect_fail(-EINVAL, KVP_RULE_ARG, seq, 16, 4, p, NULL, 0, MAXK);
    CHECK_EQ(err.index, 17);
    /* A bad parent is an error even with no full page. */
    expect_fail(-EINVAL, KVP_RULE_ARG, seq, 2, 4, p, NULL, 0, MAXK);

    /* Too little room: nothing written, err and nkeys say how many are needed. */
    err = expect_fail(-ENOSPC, KVP_RULE_TOO_MANY, seq, 16, 4, NULL, NULL, 0, 3);
    CHECK_EQ(err.value, 4);
    CHECK_EQ(err.limit, 3);
    err = expect_fail(-ENOSPC, KVP_RULE_TOO_MANY, seq, 16, 4, NULL, NULL, 0, 0);
    CHECK_EQ(err.value, 4);
    CHECK_EQ(err.limit, 0);
    size_t n = 0;
    CHECK_EQ(kvp_page_keys(seq, 16, 1, NULL, NULL, 0, keys, MAXK, &n, NULL), -ENOSPC);
    CHECK_EQ(n, 16);
    /* Exactly enough room is enough. */
    CHECK_EQ(kvp_page_keys(seq, 16, 4, NULL, NULL, 0, keys, 4, &n, NULL), 0);
    CHECK_EQ(n, 4);
    CHECK(strcmp(keys[3], seq16_p4[3]) == 0);
}

int main(void)
{
    for (uint32_t i = 0; i < 16; i++)
        seq[i] = i;
    test_vectors();
    test_partial_pages();
    test_parent();
    test_salt();
    test_errors();
    return check_report();
}
