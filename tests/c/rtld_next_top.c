/* A wrapper that finds the next probe() the way interposers do: with
 * dlsym(RTLD_NEXT). If cudaleak's dlsym override answered RTLD_NEXT
 * relative to itself, this would find itself and recurse forever. */
#define _GNU_SOURCE
#include <dlfcn.h>

int probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    if (!next || next == probe) return -1;
    return 10 + next();
}
