/* The integrity-tags suite (tests/unit/test_pagefile_tags.c: writes, reads,
 * verify, faults at psync's sites) over the counting backend (pf_count.c). */
#include "pf_count_suite.h"
#define main pfc_suite_main
#include "test_pagefile_tags.c"
#undef main

int main(void)
{
    return pfc_report(pfc_suite_main());
}
