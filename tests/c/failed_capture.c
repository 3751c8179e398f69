/*
 * A call that fails has its stack captured and records nothing. The next
 * call from that same stack must get a trace of its own, not the one
 * interned before the failure: the trace reuse of a repeated stack once
 * keyed on "the native frames were replayed", which a failed call's
 * capture made true for the wrong trace.
 */
#include "common.h"

__attribute__((noinline)) void allocate_first(void) {
    void *p;
    CHECK(cudaMalloc(&p, 1000)); /* LEAK first */
    __asm__ volatile("" ::: "memory"); /* not a tail call */
}

__attribute__((noinline)) int allocate_here(void **out) {
    int rc = cudaMalloc(out, 2000); /* LEAK second */
    __asm__ volatile("" ::: "memory");
    return rc;
}

int main(void) {
    allocate_first();
    void *p;
    /* The same call from the same stack, twice: without an out pointer
     * (fails, records nothing), then with one (a leak). */
    for (int i = 0; i < 2; i++) {
        int rc = allocate_here(i == 0 ? NULL : &p);
        if (rc != (i == 0 ? (int)cudaErrorInvalidValue : 0)) {
            fprintf(stderr, "call %d returned %d\n", i, rc);
            return 3;
        }
    }
    return 0;
}
