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
 *                                             waited (for the snapshot of an
 *                                             out-of-memory report); a line
 *                                             before it gives a second failure's
 *                                             (counted in the first's report)
 *   pairs fresh N DEPTH                       ns per pair, each pair from a call
 *                                             stack never seen before (24 levels
 *                                             of two functions: 16M stacks), so
 *                                             the stack depot grows by one per pair
 *   pairs stall N DEPTH                       N blocks kept live, then pairs for
 *                                             3 s while another thread sends
 *                                             SIGUSR1 every 250 ms (11 live dumps):
 *                                             prints the pairs over 1 ms, then the
 *                                             longest pair in ms (what a live
 *                                             dump costs a thread that
 *                                             allocates alone)
 *   pairs leaks N DEPTH                       N blocks leaked from N distinct
 *                                             stacks (N = 1: one leak), then exits;
 *                                             prints the CLOCK_REALTIME of the end
 *                                             of main in ns: what follows until
 *                                             the process is gone is the exit
 *                                             report's time
 *
 * BENCH_CPU_TIME=1 times one thread by its CPU time; BENCH_CPU_TIME=process
 * times any number of threads by the process's CPU time, printed per pair
 * per thread: the cost of sharing (2 threads vs 1).
 * BENCH_HELD_BYTES=N: the main thread allocates one block of N bytes and
 * keeps it before the pairs, as a program holds its memory while it
 * allocates more (the peak is then far above one pair's block).
 * BENCH_EXITED_THREADS=N: before the pairs, N threads in turn each
 * allocate and free one block and exit, as a data loader's short-lived
 * workers do (live_bytes.rs, case 3: the quota of a thread's share
 * depends on how many threads count now, not on how many ever did).
 */
#include "cuda.h"
#include "cuda_runtime_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* A fresh stack for each of 2^24 values: 24 levels, each through one of
 * two functions, chosen by one bit of the value. */
static void fresh(long bits, int level, int free_it);
__attribute__((noinline)) static void fresh_a(long bits, int level, int free_it) {
    fresh(bits, level + 1, free_it);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) static void fresh_b(long bits, int level, int free_it) {
    fresh(bits, level + 1, free_it);
    __asm__ volatile("" ::: "memory");
}
static void fresh(long bits, int level, int free_it) {
    if (level == 24) {
        void *p;
        if (cudaMalloc(&p, 64)) abort();
        if (free_it && cudaFree(p)) abort();
    } else if (bits & (1L << level)) {
        fresh_a(bits, level, free_it);
    } else {
        fresh_b(bits, level, free_it);
    }
}

static volatile int stall_done;

static void *send_dump_signals(void *arg) {
    (void)arg;
    while (!stall_done) {
        usleep(250000);
        if (!stall_done) kill(getpid(), SIGUSR1);
    }
    return NULL;
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
    } else if (!strcmp(mode, "fresh")) {
        for (long i = 0; i < pairs; i++) fresh(i, 0, 1);
    } else if (!strcmp(mode, "leaks")) {
        for (long i = 0; i < pairs; i++) fresh(i, 0, 0);
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        printf("%.0f\n", t.tv_sec * 1e9 + t.tv_nsec);
        fflush(stdout);
    } else if (!strcmp(mode, "hold")) {
        long before = rss_bytes();
        for (long i = 0; i < pairs; i++) {
            void *p;
            if (cudaMalloc(&p, 64)) abort();
        }
        printf("%.1f\n", (double)(rss_bytes() - before) / pairs);
        exit(0); /* the measurement is done; skip the exit report */
    } else if (!strcmp(mode, "stall")) {
        for (long i = 0; i < pairs; i++) {
            void *p;
            if (cudaMalloc(&p, 64)) abort();
        }
        struct sigaction sa;
        if (sigaction(SIGUSR1, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
            signal(SIGUSR1, SIG_IGN); /* no library: the signal would end us */
        }
        pthread_t sender;
        pthread_create(&sender, NULL, send_dump_signals, NULL);
        double end = now() + 3e9, worst = 0;
        long slow = 0;
        while (now() < end) {
            double a = now();
            void *p;
            if (cudaMalloc(&p, 256) || cudaFree(p)) abort();
            double d = now() - a;
            if (d > worst) worst = d;
            if (d > 1e6) slow++;
        }
        stall_done = 1;
        pthread_join(sender, NULL);
        printf("pairs over 1 ms: %ld\n%.2f\n", slow, worst / 1e6);
        exit(0); /* what follows (the exit report) is not timed */
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

static void *one_pair(void *arg) {
    (void)arg;
    void *p;
    if (cudaMalloc(&p, 256) || cudaFree(p)) abort();
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
    if (cpu && !strcmp(cpu, "process")) clock_id = CLOCK_PROCESS_CPUTIME_ID;
    CUcontext ctx;
    cudaFree(NULL); /* initialize the runtime and its context */
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    const char *held = getenv("BENCH_HELD_BYTES");
    if (held && atoll(held) > 0) {
        void *p;
        if (cudaMalloc(&p, (size_t)atoll(held))) abort();
    }
    const char *exited = getenv("BENCH_EXITED_THREADS");
    for (int i = 0; exited && i < atoi(exited); i++) {
        pthread_t t;
        pthread_create(&t, NULL, one_pair, NULL);
        pthread_join(t, NULL);
    }
    if (!strcmp(mode, "hold") || !strcmp(mode, "dump") || !strcmp(mode, "oom") || !strcmp(mode, "leaks") ||
        !strcmp(mode, "stall")) {
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
