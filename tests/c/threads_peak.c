/*
 * 4 threads race at the process's peak (issue 21): each allocates 1000
 * blocks of 16 KiB from its own call site, then frees them at once, while
 * the others are still allocating or already freeing. One block of 4 KiB
 * is kept at the end.
 */
#include "common.h"

#include <pthread.h>

#define THREADS 4
#define BLOCKS 1000
#define SIZE 16384

static pthread_barrier_t barrier;

static void site_0(void **p) { CHECK(cudaMalloc(p, SIZE)); }
static void site_1(void **p) { CHECK(cudaMalloc(p, SIZE)); }
static void site_2(void **p) { CHECK(cudaMalloc(p, SIZE)); }
static void site_3(void **p) { CHECK(cudaMalloc(p, SIZE)); }
static void (*const sites[THREADS])(void **) = {site_0, site_1, site_2, site_3};

static void *worker(void *arg) {
    long t = (long)arg;
    static void *blocks[THREADS][BLOCKS];
    pthread_barrier_wait(&barrier);
    for (int i = 0; i < BLOCKS; i++) sites[t](&blocks[t][i]);
    for (int i = 0; i < BLOCKS; i++) CHECK(cudaFree(blocks[t][i]));
    return NULL;
}

int main(void) {
    pthread_t th[THREADS];
    CHECK(cudaFree(NULL));
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    void *kept;
    CHECK(cudaMalloc(&kept, 4096));
    return 0;
}
