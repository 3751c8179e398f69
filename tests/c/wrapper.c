/*
 * A wrapper library that interposes cudaMalloc itself and forwards to the
 * next definition with dlsym(RTLD_NEXT, "cudaMalloc"), as allocator shims
 * and profilers do. Linked into wrapped.c ahead of libcudart. The lookup
 * must yield the next definition after *this* library (libcudart's), not
 * cudaleak's hook: the hook's real function for a call from here would be
 * this wrapper again, and the two would call each other until the stack
 * overflows.
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>

typedef cudaError_t (*malloc_fn)(void **, size_t);

int wrapper_calls;

cudaError_t cudaMalloc(void **ptr, size_t size) {
    static malloc_fn next;
    if (!next) next = (malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
    if (!next) return cudaErrorUnknown;
    if (++wrapper_calls > 100) return cudaErrorUnknown; /* we called ourselves */
    return next(ptr, size);
}
