/*
 * C functions whose names a C++ demangler reads as types (`f` is float,
 * `i` int, `v` void, `St` std, `Dn` std::nullptr_t, `a` signed char, `b`
 * bool): each leaks one block of its own size, so that a report that
 * renamed them would also merge or misname their groups.
 */
#include "common.h"

#define LEAK(name, bytes)                                                      \
    __attribute__((noinline)) void name(void) {                               \
        void *p;                                                               \
        CHECK(cudaMalloc(&p, bytes));                                          \
        __asm__ volatile("" ::: "memory"); /* not a tail call */              \
    }

LEAK(f, 101)
LEAK(i, 102)
LEAK(v, 103)
LEAK(St, 104)
LEAK(Dn, 105)
LEAK(a, 106)
LEAK(b, 107)

int main(void) {
    f();
    i();
    v();
    St();
    Dn();
    a();
    b();
    return 0;
}
