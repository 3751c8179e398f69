/*
 * 8 threads of allocation traffic; every thread frees the blocks another
 * thread allocated, then churns, then leaks exactly one block.
 * Exact totals: allocations 8*(2000+2000+1), frees 8*4000, 8 leaked blocks.
 */
#include "common.h"

#include <pthread.h>

#define THREADS 8
#define ROUNDS 2000

static void *blocks[THREADS][ROUNDS];
static pthread_barrier_t barrier;

void leak_one(void) { void *p; CHECK(cudaMalloc(&p, 4096)); /* LEAK thread */ }

static void *worker(void *arg) {
    long t = (long)arg;
    for (int i = 0; i < ROUNDS; i++) CHECK(cudaMalloc(&blocks[t][i], 256 + t));
    pthread_barrier_wait(&barrier);
    long other = (t + 1) % THREADS;
    for (int i = 0; i < ROUNDS; i++) CHECK(cudaFree(blocks[other][i]));
    for (int i = 0; i < ROUNDS; i++) {
        void *p;
        CHECK(cudaMalloc(&p, 64));
        CHECK(cudaFree(p));
    }
    leak_one();
    return NULL;
}

int main(void) {
    pthread_t th[THREADS];
    CHECK(cudaFree(NULL));
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    return 0;
}
