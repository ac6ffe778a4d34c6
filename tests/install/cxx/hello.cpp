// tests/install/cxx/hello.cpp — a C++17 program built against an installed
// kvpage through find_package(kvpage) and kvpage::kvpage (tests/install/run.sh).
// Exit 0 and an "ok" line, or exit 1 and a "FAIL" line.
#include <cstring>
#include <string>

#include "../meta_check.h"

int main()
{
    const std::string success = kvp_strerror(0);
    if (success != "success") {
        std::printf("FAIL kvp_strerror(0): '%s'\n", success.c_str());
        return 1;
    }
    return meta_check("hello_cxx");
}
