/*
 * A program whose cudaMalloc goes through a wrapper library (wrapper.c)
 * that forwards with dlsym(RTLD_NEXT). Leaks one block of 2121 bytes.
 * Exit status: 0, or 10 + the error, or 5 when the wrapper did not run
 * exactly once per call.
 */
#include "common.h"

extern int wrapper_calls;

__attribute__((noinline)) static int leak(void) {
    void *p;
    return cudaMalloc(&p, 2121); /* LEAK wrapped */
}

int main(void) {
    int rc = leak();
    if (rc) return 10 + rc;
    if (wrapper_calls != 1) return 5;
    return 0;
}
