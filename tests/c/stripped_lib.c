/*
 * A shared library shipped stripped, its debug information in a separate
 * file found by build-id (tests/reports.rs). The leaking function is
 * static: once stripped, nothing in the library names it, so only the
 * debug file can.
 */
#include "common.h"

__attribute__((noinline)) static void hidden_leak(void) {
    void *p;
    CHECK(cudaMalloc(&p, 4096)); /* LEAK hidden */
    __asm__ volatile("" ::: "memory");
}

void stripped_entry(void) {
    hidden_leak();
    __asm__ volatile("" ::: "memory");
}
