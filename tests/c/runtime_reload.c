/*
 * Loads a runtime copy privately, allocates through it, unloads it, loads
 * it again (a reservation over the whole range it had, then another object
 * first, so that it lands elsewhere) and allocates again: no call may jump
 * into the unloaded copy, and both copies' calls are attributed. The
 * reservation keeps the first copy's addresses from being reused: a
 * runtime function is named at the dump, and an address another object
 * took since is that object's code.
 *
 *   runtime_reload RUNTIME FILLER
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>
#include "loaded_range.h"
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
    struct range r = {(uintptr_t)m1, 0, 0};
    if (!dl_iterate_phdr(find_range, &r)) return 28;
    if (dlclose(h)) return 24;
    if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD)) return 25; /* still loaded */
    printf("unloaded\n");
    if (mmap((void *)r.lo, r.hi - r.lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
             0) == MAP_FAILED)
        return 29; /* taken at once: the test cannot say what it checks */
    void *filler = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!filler) return 26;
    rc = round_trip(argv[1], 2222, &h, &m2);
    if (rc) return 30 + rc;
    if (m2 == m1) return 27; /* loaded where it was after all */
    fflush(stdout);
    return 0;
}
