/*
 * Allocates at the bottom of N nested calls (argv[1], default 20). Built
 * both with and without frame pointers: the unwinder must give the same
 * exact stack either way.
 */
#include "common.h"

__attribute__((noinline)) void allocate_at_depth(int depth, size_t bytes) {
    if (depth > 1) {
        allocate_at_depth(depth - 1, bytes); /* RECURSE */
        __asm__ volatile("" ::: "memory");   /* not a tail call */
        return;
    }
    void *p;
    CHECK(cudaMalloc(&p, bytes)); /* LEAK deep */
}

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 20;
    allocate_at_depth(depth, 1234);
    return 0;
}
