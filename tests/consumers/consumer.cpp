// A C++ consumer of atap.hpp: a capturing lambda, a typed join, a handle
// that releases itself. Exits 0 when the output is right.
#include <atap.hpp>
#include <cstdio>

int main()
{
    if (atap_init(nullptr) != 0)
        return 1;
    long base = 40, v = 0;
    int rc;
    {
        atap::task<long> t;
        rc = atap::spawn(t, [base](atap_ctx *) { return base + 2; });
        rc = rc ? rc : t.join(v);
    }
    if (atap_shutdown() != 0 || rc != 0 || v != 42)
        return 1;
    std::printf("libatap %s from C++: %ld\n", atap_version_string(), v);
    return 0;
}
