/*
 * Leaks argv[1] blocks of 100 bytes at site A and argv[2] blocks of 200
 * bytes at site B (rank 2 of a fake distributed run also leaks at site C
 * when LEAK_EXTRA is set), then exits with status argv[3] (default 0).
 */
#include "common.h"

void site_a(void) { void *p; CHECK(cudaMalloc(&p, 100)); /* LEAK site A */ }
void site_b(void) { void *p; CHECK(cudaMalloc(&p, 200)); /* LEAK site B */ }
void site_c(void) { void *p; CHECK(cudaMalloc(&p, 300)); /* LEAK site C */ }

int main(int argc, char **argv) {
    int a = argc > 1 ? atoi(argv[1]) : 1;
    int b = argc > 2 ? atoi(argv[2]) : 0;
    int status = argc > 3 ? atoi(argv[3]) : 0;
    void *p;
    CHECK(cudaMalloc(&p, 1)); /* a clean allocation, so every run reports */
    CHECK(cudaFree(p));
    for (int i = 0; i < a; i++) site_a();
    for (int i = 0; i < b; i++) site_b();
    if (getenv("LEAK_EXTRA")) site_c();
    return status;
}
