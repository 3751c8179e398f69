/*
 * Loads the driver privately, allocates through it, unloads it, reserves
 * where it was and loads it again elsewhere, and allocates again: every
 * cached pointer into the first copy must be forgotten, or the second
 * round's call jumps into unmapped memory.
 *
 *   driver_reload
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>
#include <stdint.h>
#include <sys/mman.h>

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*set_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static int round_trip(size_t leak, void **where) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return 20;
    init_fn init = (init_fn)dlsym(h, "cuInit");
    retain_fn retain = (retain_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
    set_fn set = (set_fn)dlsym(h, "cuCtxSetCurrent");
    alloc_fn alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    free_fn release = (free_fn)dlsym(h, "cuMemFree_v2");
    if (!init || !retain || !set || !alloc || !release) return 21;
    CUcontext ctx;
    if (init(0) || retain(&ctx, 0) || set(ctx)) return 22;
    CUdeviceptr a, b;
    if (alloc(&a, 64) || release(a)) return 23;
    if (alloc(&b, leak)) return 24; /* LEAK reloaded driver */
    *where = (void *)init; /* a function nobody hooks: where this copy is */
    if (dlclose(h)) return 25;
    return 0;
}

int main(void) {
    void *first, *second;
    int rc = round_trip(3333, &first);
    if (rc) return rc;
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) return 26; /* still loaded */
    printf("unloaded\n");
    uintptr_t page = (uintptr_t)first & ~(uintptr_t)0xfff;
    if (mmap((void *)page, 0x1000, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == MAP_FAILED)
        return 27;
    rc = round_trip(4444, &second);
    if (rc) return 30 + rc;
    if (second == first) return 28; /* loaded where it was after all */
    fflush(stdout);
    return 0;
}
