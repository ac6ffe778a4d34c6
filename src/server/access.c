/*
 * Who may ask (server.h): client addresses against --allow's CIDR blocks,
 * and the bearer token of --token, compared in constant time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>

#include "server/server.h"

int kvp__cidr_parse(const char *s, struct kvp_cidr *out)
{
    char addr[64];
    const char *slash = strchr(s, '/');
    size_t alen = slash ? (size_t)(slash - s) : strlen(s);
    if (alen == 0 || alen >= sizeof addr)
        return -EINVAL;
    memcpy(addr, s, alen);
    addr[alen] = 0;
    memset(out, 0, sizeof *out);
    unsigned maxp;
    if (inet_pton(AF_INET, addr, out->addr) == 1) {
        out->family = AF_INET;
        maxp = 32;
    } else if (inet_pton(AF_INET6, addr, out->addr) == 1) {
        out->family = AF_INET6;
        maxp = 128;
    } else {
        return -EINVAL;
    }
    out->prefix = maxp;
    if (slash) {
        const char *p = slash + 1;
        if (!*p || strlen(p) > 3)
            return -EINVAL;
        unsigned v = 0;
        for (; *p; p++) {
            if (*p < '0' || *p > '9')
                return -EINVAL;
            v = v * 10 + (unsigned)(*p - '0');
        }
        if (v > maxp)
            return -EINVAL;
        out->prefix = v;
    }
    return 0;
}

static int prefix_eq(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    unsigned bytes = bits / 8, rem = bits % 8;
    if (memcmp(a, b, bytes))
        return 0;
    if (!rem)
        return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rem));
    return (a[bytes] & mask) == (b[bytes] & mask);
}

int kvp__cidr_match(const struct kvp_cidr *c, const struct sockaddr *sa)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    uint8_t a[16];
    int fam;
    if (sa->sa_family == AF_INET) {
        memcpy(a, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        fam = AF_INET;
    } else if (sa->sa_family == AF_INET6) {
        memcpy(a, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        fam = AF_INET6;
        if (c->family == AF_INET && !memcmp(a, v4mapped, 12)) {
            memmove(a, a + 12, 4);
            fam = AF_INET;
        }
    } else {
        return 0;
    }
    return fam == c->family && prefix_eq(a, c->addr, c->prefix);
}

int kvp__client_allowed(const struct kvp_server *srv, const struct sockaddr *sa)
{
    if (!srv->cfg.nallow || !sa)
        return 1;
    for (size_t i = 0; i < srv->cfg.nallow; i++)
        if (kvp__cidr_match(&srv->cfg.allow[i], sa))
            return 1;
    return 0;
}

int kvp__token_ok(const struct kvp_server *srv, const char *h)
{
    if (!h || strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t'))
        return 0;
    h += 6;
    while (*h == ' ' || *h == '\t')
        h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    if (n != srv->token_len)
        return 0;
    /* Constant time over the token's length. */
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(h[i] ^ srv->cfg.token[i]);
    return d == 0;
}
