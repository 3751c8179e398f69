/*
 * A private runtime copy first, a global one later: the program
 * loads libcudart.so.13 with RTLD_LOCAL and calls its cudaMalloc (the hook
 * answers with the adopted private function), then loads libcudart.so.12
 * with RTLD_GLOBAL and looks cudaMalloc up with RTLD_DEFAULT. Without us
 * that call reaches the global copy, so it must with us: the library
 * trusts its adopted answer only until the program looks a runtime name
 * up again. Each copy counts the calls that reached it.
 *
 *   runtime_late_global PRIVATE_RUNTIME GLOBAL_RUNTIME
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*count_fn)(void);

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *priv = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!priv) return 10;
    malloc_fn m1 = (malloc_fn)dlsym(priv, "cudaMalloc");
    count_fn priv_calls = (count_fn)dlsym(priv, "simcudart_malloc_calls");
    if (!m1 || !priv_calls) return 11;
    void *a, *b;
    if (m1(&a, 3131)) return 12; /* LEAK private copy */
    if (m1(&a, 1)) return 13;    /* twice: the adopted answer is cached */
    void *glob = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    if (!glob) return 14;
    count_fn glob_calls = (count_fn)dlsym(glob, "simcudart_malloc_calls");
    int before = glob_calls();
    malloc_fn m2 = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (!m2) return 15;
    if (m2(&b, 2424)) return 16; /* LEAK global copy */
    printf("private %d, global %d\n", priv_calls(), glob_calls() - before);
    if (priv_calls() != 2) return 17;
    if (glob_calls() - before != 1) return 18; /* reached the private copy */
    return 0;
}
