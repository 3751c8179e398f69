/*
 * A plugin that links libcudart and is loaded privately (dlopen with
 * RTLD_LOCAL, ctypes.CDLL, a Python extension module): its libcudart is in
 * its own scope only, not the global one. Built twice, against
 * libcudart.so.12 and against a second runtime copy libcudart.so.13, with
 * PLUGIN_BYTES telling the two leaks apart.
 *
 * plugin_leak() returns 0 after leaking one block, or the step that failed:
 * each cudaMalloc must have been served by the plugin's own runtime copy.
 */
#include "common.h"

#ifndef PLUGIN_BYTES
#define PLUGIN_BYTES 4242
#endif
#ifndef PLUGIN_RUNTIME
#define PLUGIN_RUNTIME "libcudart.so.12"
#endif

#include <dlfcn.h>

/* The cudaMalloc count of the runtime copy this plugin links (named by
 * PLUGIN_RUNTIME, its soname). Looked up through that copy's handle: a
 * direct call would bind to the first copy in the global scope. */
static int simcudart_malloc_calls(void) {
    void *h = dlopen(PLUGIN_RUNTIME, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return -1;
    int (*count)(void) = (int (*)(void))dlsym(h, "simcudart_malloc_calls");
    int n = count ? count() : -1;
    dlclose(h);
    return n;
}

__attribute__((noinline)) int plugin_leak(void) {
    int before = simcudart_malloc_calls();
    void *q = NULL, *p = NULL;
    int rc = cudaMalloc(&q, 100);
    if (rc) return 100 + rc;
    rc = cudaFree(q);
    if (rc) return 200 + rc;
    rc = cudaMalloc(&p, PLUGIN_BYTES); /* LEAK plugin */
    if (rc) return 300 + rc;
    if (before < 0 || simcudart_malloc_calls() != before + 2) return 4; /* another copy served it */
    return 0;
}

/* Allocates and frees: a clean plugin call. */
int plugin_clean(void) {
    void *q = NULL;
    if (cudaMalloc(&q, 64)) return 1;
    return cudaFree(q) ? 2 : 0;
}
