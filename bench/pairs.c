/*
 * Benchmark program: N allocate/free pairs made DEPTH frames deep, through
 * the simulated runtime (cudaMalloc/cudaFree, the common path) or the
 * driver (cuMemAlloc_v2/cuMemFree_v2). Prints nanoseconds per pair.
 * Also used for the live-block memory figure (mode "hold": N blocks kept).
 *
 *   pairs runtime|driver N DEPTH [THREADS]   ns per pair
 *   pairs mixed N DEPTH                       ns per pair, each pair from one of
 *                                             1024 call stacks in turn
 *   pairs hold N DEPTH                        N blocks kept live; prints the
 *                                             RSS growth in bytes per block
 *   pairs dump N DEPTH                        N live blocks over 1024 distinct
 *                                             stacks, then times cudaleak_dump()
 *   pairs oom N DEPTH                         N live blocks over 1024 distinct
 *                                             stacks, then times a cudaMalloc that
 *                                             fails for lack of memory (1 PiB):
 *                                             microseconds the failing thread
 *                                             waited (issue 21: the snapshot of
 *                                             an out-of-memory report); a line
 *                                             before it gives a second failure's
 *                                             (counted in the first's report)
 */
#include "cuda.h"
#include "cuda_runtime_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *mode;
static long pairs;
static int depth;

/* BENCH_CPU_TIME=1: the thread's CPU time instead of wall time, for one
 * thread on a loaded machine (wall time also counts the time the thread
 * waited for a CPU). */
static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec t;
    clock_gettime(clock_id, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static long rss_bytes(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * 4096;
}

/* 1024 distinct call stacks: ten levels, each through one of two functions. */
static int route_frees;
static void route(int bits, int level);
__attribute__((noinline)) static void route_a(int bits, int level) {
    route(bits, level + 1);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) static void route_b(int bits, int level) {
    route(bits, level + 1);
    __asm__ volatile("" ::: "memory");
}
static void route(int bits, int level) {
    if (level == 10) {
        void *p;
        if (cudaMalloc(&p, 64)) abort();
        if (route_frees && cudaFree(p)) abort();
    } else if (bits & (1 << level)) {
        route_a(bits, level);
    } else {
        route_b(bits, level);
    }
}

static void work(void) {
    if (!strcmp(mode, "runtime")) {
        for (long i = 0; i < pairs; i++) {
            void *p;
            if (cudaMalloc(&p, 256) || cudaFree(p)) abort();
        }
    } else if (!strcmp(mode, "driver")) {
        for (long i = 0; i < pairs; i++) {
            CUdeviceptr p;
            if (cuMemAlloc_v2(&p, 256) || cuMemFree_v2(p)) abort();
        }
    } else if (!strcmp(mode, "mixed")) {
        route_frees = 1;
        for (long i = 0; i < pairs; i++) route((int)(i % 1024), 0);
    } else if (!strcmp(mode, "hold")) {
        long before = rss_bytes();
        for (long i = 0; i < pairs; i++) {
            void *p;
            if (cudaMalloc(&p, 64)) abort();
        }
        printf("%.1f\n", (double)(rss_bytes() - before) / pairs);
        exit(0); /* the measurement is done; skip the exit report */
    } else if (!strcmp(mode, "oom")) {
        for (long i = 0; i < pairs; i++) route((int)(i % 1024), 0);
        void *p;
        double t0 = now();
        if (cudaMalloc(&p, 1ULL << 50) != cudaErrorMemoryAllocation) abort();
        double t1 = now();
        if (cudaMalloc(&p, 1ULL << 50) != cudaErrorMemoryAllocation) abort();
        double t2 = now();
        printf("second failure: %.1f us\n", (t2 - t1) / 1e3);
        printf("%.1f\n", (t1 - t0) / 1e3);
        exit(0);
    } else if (!strcmp(mode, "dump")) {
        for (long i = 0; i < pairs; i++) route((int)(i % 1024), 0);
        int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cudaleak_dump");
        if (!dump) {
            printf("0\n");
            exit(0);
        }
        double t0 = now();
        if (dump("benchmark") != 0) abort();
        printf("%.1f\n", (now() - t0) / 1e6);
        exit(0);
    }
}

/* Each level is a real frame: not inlined, not a tail call. */
__attribute__((noinline)) static void nest(int d) {
    if (d > 1) {
        nest(d - 1);
        __asm__ volatile("" ::: "memory");
    } else {
        work();
    }
}

static void *thread_main(void *arg) {
    (void)arg;
    nest(depth);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s runtime|driver|hold PAIRS DEPTH [THREADS]\n", argv[0]);
        return 2;
    }
    mode = argv[1];
    pairs = atol(argv[2]);
    depth = atoi(argv[3]);
    int threads = argc > 4 ? atoi(argv[4]) : 1;
    const char *cpu = getenv("BENCH_CPU_TIME");
    if (cpu && !strcmp(cpu, "1") && threads == 1) clock_id = CLOCK_THREAD_CPUTIME_ID;
    CUcontext ctx;
    cudaFree(NULL); /* initialize the runtime and its context */
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    if (!strcmp(mode, "hold") || !strcmp(mode, "dump") || !strcmp(mode, "oom")) {
        nest(depth);
        return 0;
    }
    double t0 = now();
    if (threads == 1) {
        nest(depth);
    } else {
        pthread_t th[64];
        for (int i = 0; i < threads && i < 64; i++) pthread_create(&th[i], NULL, thread_main, NULL);
        for (int i = 0; i < threads && i < 64; i++) pthread_join(th[i], NULL);
    }
    double t1 = now();
    printf("%.1f\n", (t1 - t0) / ((double)pairs * threads));
    return 0;
}
