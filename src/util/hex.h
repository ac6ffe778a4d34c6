/* Hex digits (header only): the server's %XX decoding and the page keys' parent. */
#ifndef KVP_UTIL_HEX_H
#define KVP_UTIL_HEX_H

/* The value 0..15 of hex digit c (either case), or -1. */
static inline int kvp__hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
