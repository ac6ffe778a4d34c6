/* The concurrency suite (tests/unit/test_pagefile_concurrency.c: many
 * threads on one handle, psync's helpers) over the counting backend
 * (pf_count.c). */
#include "pf_count_suite.h"
#define main pfc_suite_main
#include "test_pagefile_concurrency.c"
#undef main

int main(void)
{
    return pfc_report(pfc_suite_main());
}
