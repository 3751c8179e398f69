/*
 * A plugin loaded with RTLD_LOCAL that looks cudaMalloc up with
 * dlsym(RTLD_DEFAULT): glibc searches the caller's own scope too, so it
 * finds the plugin's private libcudart although no runtime is global.
 * Leaks one block of 3131 bytes through it; a name nobody defines gives
 * NULL and an error. plugin_leak() returns 0, or the step that failed.
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>

typedef cudaError_t (*malloc_fn)(void **, size_t);

__attribute__((noinline)) int plugin_leak(void) {
    malloc_fn m = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (!m) {
        fprintf(stderr, "dlsym(RTLD_DEFAULT, cudaMalloc): %s\n", dlerror());
        return 1;
    }
    void *p;
    int rc = m(&p, 3131); /* LEAK default lookup */
    if (rc) return 100 + rc;
    (void)dlerror();
    if (dlsym(RTLD_DEFAULT, "cuNoSuchFunction") || !dlerror()) return 2;
    return 0;
}
