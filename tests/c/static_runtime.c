/*
 * Linked with the simulated runtime compiled in (cudart_static.o), as nvcc
 * links cudart by default: cudaMalloc is a function of this executable, so
 * no preload can interpose it; only the driver underneath is seen.
 */
#include "common.h"

void static_leak(void) { void *p; CHECK(cudaMalloc(&p, 12345)); /* LEAK static cudaMalloc */ }
void static_leak_host(void) { void *p; CHECK(cudaMallocHost(&p, 777)); /* LEAK static cudaMallocHost */ }

int main(void) {
    void *p;
    static_leak();
    static_leak_host();
    CHECK(cudaMalloc(&p, 10));
    CHECK(cudaFree(p));
    return 0;
}
