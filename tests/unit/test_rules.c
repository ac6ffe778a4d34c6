/*
 * The rules' names (kvp_rule_name, kvp_rule_from_name in kvpage/error.h):
 * the spelling the server's error replies, the http:// client and Python
 * share, one name per rule and back.
 */
#include <string.h>

#include "check.h"
#include "kvpage/error.h"

int main(void)
{
    CHECK(strcmp(kvp_rule_name(KVP_RULE_NONE), "none") == 0);
    CHECK(strcmp(kvp_rule_name(KVP_RULE_CONFIRM_PAGE), "confirm_page") == 0);
    CHECK(strcmp(kvp_rule_name(KVP_RULE_INTEGRITY), "integrity") == 0);
    CHECK(kvp_rule_name(KVP_RULE_INTEGRITY + 1) == NULL);
    CHECK(kvp_rule_name(-1) == NULL);
    int n = 0;
    for (const char *s; (s = kvp_rule_name(n)) != NULL; n++) {
        CHECK_EQ(kvp_rule_from_name(s, strlen(s)), n);
        for (int j = 0; j < n; j++)
            CHECK(strcmp(kvp_rule_name(j), s) != 0);
    }
    CHECK_EQ(n, KVP_RULE_INTEGRITY + 1);
    CHECK_EQ(kvp_rule_from_name("held_by_other...", 13), KVP_RULE_HELD_BY_OTHER);
    CHECK_EQ(kvp_rule_from_name("held_by", 7), -1);
    CHECK_EQ(kvp_rule_from_name("", 0), -1);
    CHECK_EQ(kvp_rule_from_name(NULL, 0), -1);
    return check_report();
}
