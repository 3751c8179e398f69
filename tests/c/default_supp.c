/* A function named like cuBLAS's handle constructor, whose allocation the
 * built-in suppressions must cover, and an ordinary leak they must not. */
#include "common.h"

void cublasCreate_v2(void) { void *p; CHECK(cudaMalloc(&p, 640)); /* LEAK one-time */ }
void ordinary_leak(void) { void *p; CHECK(cudaMalloc(&p, 320)); /* LEAK ordinary */ }

int main(void) {
    cublasCreate_v2();
    ordinary_leak();
    return 0;
}
