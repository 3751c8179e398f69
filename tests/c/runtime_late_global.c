/*
 * A private runtime copy first, a global one later: the program
 * loads libcudart.so.13 with RTLD_LOCAL and calls its cudaDeviceReset (a
 * runtime function the library hooks: the hook answers with the adopted
 * private function) and its cudaMalloc (libcudart's own, recorded at the
 * driver), then loads libcudart.so.12 with RTLD_GLOBAL and looks both up
 * with RTLD_DEFAULT. Without us those calls reach the global copy, so
 * they must with us: the library trusts its adopted answer only until
 * the program looks a runtime name up again. Each copy counts the calls
 * that reached it.
 *
 *   runtime_late_global PRIVATE_RUNTIME GLOBAL_RUNTIME
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*reset_fn)(void);
typedef int (*count_fn)(void);

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *priv = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!priv) return 10;
    malloc_fn m1 = (malloc_fn)dlsym(priv, "cudaMalloc");
    count_fn priv_calls = (count_fn)dlsym(priv, "simcudart_malloc_calls");
    reset_fn r1 = (reset_fn)dlsym(priv, "cudaDeviceReset");
    count_fn priv_resets = (count_fn)dlsym(priv, "simcudart_reset_calls");
    if (!m1 || !priv_calls || !r1 || !priv_resets) return 11;
    void *a, *b;
    if (r1()) return 19;
    if (r1()) return 19;         /* twice: the adopted answer is cached */
    if (m1(&a, 3131)) return 12; /* LEAK private copy */
    if (m1(&a, 1)) return 13;
    void *glob = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    if (!glob) return 14;
    count_fn glob_calls = (count_fn)dlsym(glob, "simcudart_malloc_calls");
    count_fn glob_resets = (count_fn)dlsym(glob, "simcudart_reset_calls");
    if (!glob_calls || !glob_resets) return 14;
    int before = glob_calls(), resets_before = glob_resets();
    reset_fn r2 = (reset_fn)dlsym(RTLD_DEFAULT, "cudaDeviceReset");
    if (!r2) return 15;
    if (r2()) return 19;
    malloc_fn m2 = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (!m2) return 15;
    if (m2(&b, 2424)) return 16; /* LEAK global copy */
    printf("private %d/%d, global %d/%d (cudaMalloc/cudaDeviceReset calls)\n", priv_calls(), priv_resets(),
           glob_calls() - before, glob_resets() - resets_before);
    if (priv_calls() != 2 || priv_resets() != 2) return 17;
    /* reached the private copy */
    if (glob_calls() - before != 1 || glob_resets() - resets_before != 1) return 18;
    return 0;
}
