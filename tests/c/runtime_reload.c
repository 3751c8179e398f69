/*
 * Loads a runtime copy privately, allocates through it, unloads it, loads
 * it again (another object first, and a reservation where it was, so it
 * lands elsewhere) and allocates again: no call may jump into the unloaded copy, and the second copy's
 * calls are attributed.
 *
 *   runtime_reload RUNTIME FILLER
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>
#include <stdint.h>
#include <sys/mman.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

static int round_trip(const char *path, size_t leak, void **handle, void **fn) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 20;
    }
    malloc_fn m = (malloc_fn)dlsym(h, "cudaMalloc");
    free_fn f = (free_fn)dlsym(h, "cudaFree");
    if (!m || !f) return 21;
    void *a, *b;
    if (m(&a, 64) || f(a)) return 22;
    if (m(&b, leak)) return 23; /* LEAK reloaded runtime */
    printf("%s cudaMalloc at %p\n", path, (void *)m);
    *handle = h;
    /* Where the copy is: a function of it that no one hooks. */
    *fn = dlsym(h, "simcudart_malloc_calls");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *h, *m1, *m2;
    int rc = round_trip(argv[1], 1111, &h, &m1);
    if (rc) return rc;
    if (dlclose(h)) return 24;
    if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD)) return 25; /* still loaded */
    printf("unloaded\n");
    void *filler = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!filler) return 26;
    uintptr_t page = (uintptr_t)m1 & ~(uintptr_t)0xfff;
    if (mmap((void *)(page - 0x4000), 0x8000, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == MAP_FAILED)
        printf("%p taken by the filler\n", (void *)page);
    rc = round_trip(argv[1], 2222, &h, &m2);
    if (rc) return 30 + rc;
    if (m2 == m1) return 27; /* loaded where it was after all */
    fflush(stdout);
    return 0;
}
