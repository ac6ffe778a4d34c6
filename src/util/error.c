#include <errno.h>
#include <string.h>
#include "kvpage/error.h"

KVP_API const char *kvp_strerror(int code)
{
    if (code > 0)
        code = -code;
    switch (code) {
    case 0:
        return "success";
    case -EUCLEAN:
        return "invariant violated (structure needs cleaning)";
    default:
        /* strerror's table is static in glibc; the buffer variant is not needed. */
        return strerror(-code);
    }
}
