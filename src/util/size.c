/* kvp_parse_size (kvpage/size.h): the command line's grammar of sizes,
 * util/size.h's, for programs and bindings outside the kvpage binary. */
#include <errno.h>

#include "kvpage/size.h"
#include "util/size.h"

KVP_API int kvp_parse_size(const char *s, uint64_t *out)
{
    uint64_t v;
    if (!out || kvp__parse_size(s, 1, &v) != 0)
        return -EINVAL;
    *out = v;
    return 0;
}
