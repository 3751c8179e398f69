/*
 * Loads plugins the way plugin hosts do, and calls each one's plugin_leak().
 *
 *   plugin_host now|lazy|reload PLUGIN...
 *     now:    dlopen(RTLD_NOW | RTLD_LOCAL)
 *     lazy:   dlopen(RTLD_LAZY) (local too)
 *     reload: for each plugin: open, call, dlclose (checking it is gone),
 *             reserve where it was, and where its libcudart was if that
 *             went with it (so they cannot come back there, and their
 *             old frames belong to no object: a runtime function is named
 *             at the dump, and an address another object took since is
 *             that object's code), open it again, call, close.
 *
 * Built twice: alone (libcudart only in the plugins' scopes), and with
 * HOST_RUNTIME, linked against libcudart.so.12 and leaking a block itself,
 * so that one runtime copy is global and another private.
 * The exit status is the first failing plugin's return value.
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>
#include "loaded_range.h"
#include <stdint.h>
#include <sys/mman.h>

/* The range of the loaded runtime copy named `soname`, if loaded. */
static int runtime_range(const char *soname, struct range *r) {
    void *rt = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (!rt) return 0;
    void *m = dlsym(rt, "cudaMalloc");
    r->addr = (uintptr_t)m;
    int found = m && dl_iterate_phdr(find_range, r);
    dlclose(rt);
    return found;
}

typedef int (*plugin_fn)(void);

static int call(const char *path, int mode, void **handle, void **fn) {
    void *h = dlopen(path, mode);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 20;
    }
    plugin_fn f = (plugin_fn)dlsym(h, "plugin_leak");
    if (!f) return 21;
    printf("%s plugin_leak at %p\n", path, (void *)f);
    int rc = f();
    if (rc) fprintf(stderr, "%s: plugin_leak returned %d\n", path, rc);
    *handle = h;
    *fn = (void *)f;
    return rc;
}

__attribute__((noinline)) static int host_leak(void) {
#ifdef HOST_RUNTIME
    void *p;
    return cudaMalloc(&p, 777); /* LEAK host */
#else
    return 0;
#endif
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int rc = host_leak();
    if (rc) return 30;
    const char *mode = argv[1];
    int flags = !strcmp(mode, "lazy") ? RTLD_LAZY : RTLD_NOW | RTLD_LOCAL;
    for (int i = 2; i < argc; i++) {
        void *h, *f;
        if ((rc = call(argv[i], flags, &h, &f))) return rc;
        if (strcmp(mode, "reload")) continue;
        struct range rt = {0, 0, 0};
        int had_runtime = runtime_range("libcudart.so.12", &rt);
        if (dlclose(h)) return 22;
        if (dlopen(argv[i], RTLD_NOW | RTLD_NOLOAD)) return 23; /* still loaded */
        printf("unloaded %s\n", argv[i]);
        void *still = had_runtime ? dlopen("libcudart.so.12", RTLD_NOW | RTLD_NOLOAD) : NULL;
        if (still) {
            dlclose(still); /* the host's own, global: it stays */
        } else if (had_runtime && mmap((void *)rt.lo, rt.hi - rt.lo, PROT_NONE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
                                       0) == MAP_FAILED) {
            return 27; /* taken at once: the test cannot say what it checks */
        }
        uintptr_t page = (uintptr_t)f & ~(uintptr_t)0xfff;
        void *hole = mmap((void *)(page - 0x4000), 0x8000, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (hole == MAP_FAILED) return 25;
        void *f2;
        if ((rc = call(argv[i], flags, &h, &f2))) return rc;
        if (f2 == f) return 26; /* loaded where it was after all */
        if (dlclose(h)) return 24;
    }
    fflush(stdout);
    return 0;
}
