/*
 * 4 threads race at the process's peak: each allocates 1000
 * blocks of 16 KiB from its own call site, then frees them at once, while
 * the others are still allocating or already freeing. One block of 4 KiB
 * is kept at the end.
 *
 * "handover": two threads in turn, never at once (each thread keeps its
 * changes to its current call site in its own delta slot, site_counters.rs):
 * A allocates 10 blocks of 1 MiB and frees 5, B allocates 6 (the peak,
 * 11 MiB), then A frees its other 5 and B its 6. The peak holds exactly
 * A's 5 and B's 6.
 */
#include "common.h"

#include <pthread.h>
#include <semaphore.h>

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

#define MIB (1 << 20)
static sem_t a_turn, b_turn;
static void *a_blocks[10];

__attribute__((noinline)) static void handover_a_site(void **p) { CHECK(cudaMalloc(p, MIB)); } /* HANDOVER A */
__attribute__((noinline)) static void handover_b_site(void **p) { CHECK(cudaMalloc(p, MIB)); } /* HANDOVER B */

static void *handover_a(void *arg) {
    (void)arg;
    for (int i = 0; i < 10; i++) handover_a_site(&a_blocks[i]);
    for (int i = 0; i < 5; i++) CHECK(cudaFree(a_blocks[i]));
    sem_post(&b_turn);
    sem_wait(&a_turn);
    for (int i = 5; i < 10; i++) CHECK(cudaFree(a_blocks[i]));
    sem_post(&b_turn);
    return NULL;
}

static void *handover_b(void *arg) {
    void *blocks[6];
    (void)arg;
    sem_wait(&b_turn);
    for (int i = 0; i < 6; i++) handover_b_site(&blocks[i]);
    sem_post(&a_turn);
    sem_wait(&b_turn);
    for (int i = 0; i < 6; i++) CHECK(cudaFree(blocks[i]));
    return NULL;
}

static int handover(void) {
    pthread_t a, b;
    CHECK(cudaFree(NULL));
    sem_init(&a_turn, 0, 0);
    sem_init(&b_turn, 0, 0);
    pthread_create(&a, NULL, handover_a, NULL);
    pthread_create(&b, NULL, handover_b, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return 0;
}

#define SOLE_PAIRS 40000

static void sole_pairs(int n) {
    for (int i = 0; i < n; i++) {
        void *p;
        CHECK(cudaMalloc(&p, 4096));
        CHECK(cudaFree(p));
    }
}

static void *sole_second(void *arg) {
    (void)arg;
    sole_pairs(SOLE_PAIRS / 2);
    return NULL;
}

static int sole(void) {
    pthread_t second, third;
    void *big;
    CHECK(cudaFree(NULL));
    sole_pairs(SOLE_PAIRS / 8);
    /* two at once: one ends sole mode while the other finds it ending */
    pthread_create(&second, NULL, sole_second, NULL);
    pthread_create(&third, NULL, sole_second, NULL);
    sole_pairs(SOLE_PAIRS);
    pthread_join(second, NULL);
    pthread_join(third, NULL);
    CHECK(cudaMalloc(&big, 1 << 30));
    return 0;
}

static void *exit_second(void *arg) {
    (void)arg;
    void *p;
    CHECK(cudaMalloc(&p, MIB)); /* kept: 1 MiB live when the thread ends */
    return NULL;
}

static int exit_share(void) {
    pthread_t second;
    void *halves[2], *more;
    CHECK(cudaMalloc(&halves[0], 512 * MIB));
    CHECK(cudaMalloc(&halves[1], 512 * MIB));
    CHECK(cudaFree(halves[1]));
    pthread_create(&second, NULL, exit_second, NULL);
    pthread_join(second, NULL);
    CHECK(cudaMalloc(&more, 1024 * MIB));
    CHECK(cudaFree(more));
    return 0;
}

int main(int argc, char **argv) {
    pthread_t th[THREADS];
    if (argc > 1 && !strcmp(argv[1], "handover")) return handover();
    if (argc > 1 && !strcmp(argv[1], "sole")) return sole();
    if (argc > 1 && !strcmp(argv[1], "exit")) return exit_share();
    CHECK(cudaFree(NULL));
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    void *kept;
    CHECK(cudaMalloc(&kept, 4096));
    return 0;
}
