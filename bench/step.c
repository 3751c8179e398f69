/*
 * Benchmark program: real shapes, on the simulated runtime (docs/decisions.md,
 * "The keep rule: a mechanism stays only if it saves 5 % on a real shape").
 * Each shape does the program's own work between its calls (a busy loop
 * of BENCH_WORK_ITERS iterations per op, calibrated to 10 µs by
 * `step calibrate` once, outside the measured runs, so that every run and
 * every configuration does the same work: under callgrind too). The
 * measured part is timed by the process's CPU time (getrusage, user +
 * system, every thread); start-up, two warm-up steps and exit are not.
 *
 *   step calibrate                      iterations of the work loop per 10 µs
 *   step train STEPS OPS DEPTH          training step: 2 GiB of weights held
 *                                       (4 blocks of 512 MiB); a forward pass
 *                                       on the main thread allocates one
 *                                       activation per op (4 KiB .. 2 MiB); a
 *                                       backward pass on a second, lasting
 *                                       thread (as autograd's), per op in
 *                                       reverse, allocates and frees a
 *                                       gradient and frees the forward's
 *                                       activation. 10 µs of work per op in
 *                                       each pass. 2 pairs per op.
 *   step cache STEPS OPS DEPTH          caching-allocator step: the same two
 *                                       passes, but ops take their memory
 *                                       from the program's cache (no call);
 *                                       a step grows 3 segments (20 MiB and
 *                                       2 MiB in the forward, 2 MiB in the
 *                                       backward) and the main thread
 *                                       releases them at the step's end.
 *                                       3 pairs per step.
 *   step xfree PAIRS DEPTH THREADS      cross-thread frees: THREADS = 1: one
 *                                       thread allocates and frees; THREADS =
 *                                       2k: k producers allocate, each hands
 *                                       its pointers in batches of 256 over a
 *                                       double buffer to its consumer, which
 *                                       frees them. No work; 2 GiB held.
 *                                       PAIRS per producer.
 *   step async REQUESTS LAYERS DEPTH    inference loop, one thread: per
 *                                       request, per layer, cudaMallocAsync
 *                                       of its output, 10 µs of work,
 *                                       cudaFreeAsync of its input. 2 GiB
 *                                       held. 1 pair per layer.
 *
 * DEPTH counts the frames above the allocating call: DEPTH - 4 of nesting
 * and 4 that depend on the op (16 call sites per pass, as layers differ).
 * Prints "incall X" (ns per pair inside the allocation calls, by the TSC,
 * calls over 200 µs left out: a preempted call), "long_calls N" (those
 * left out), "pairs N" (pairs measured), "units N" (steps, pairs or
 * requests), then, last, the CPU ns per unit.
 */
#include "cuda_runtime_api.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
/* The TSC: a few ns to read, the same rate on every CPU. */
static inline uint64_t ticks(void) { return __rdtsc(); }
#else
static inline uint64_t ticks(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
#endif

static long work_iters;
static volatile uint64_t sink;

/* The program's own work: a dependent chain the compiler cannot fold. */
__attribute__((noinline)) static void op_work(long iters) {
    uint64_t x = sink;
    for (long i = 0; i < iters; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}

static double cpu_ns(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e9 + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e3;
}

static size_t op_size(long op) { return (size_t)4096 << (op % 10); }

/* The time inside the allocation calls, by the TSC (elsewhere the
 * monotonic clock), while the measured part runs: the library's cost
 * without the noise of the work loop. A call over 200 µs (the thread was
 * preempted in it, or waited for a lock another thread held while
 * preempted) is left out and counted. */
static volatile int timing;
static uint64_t long_call = ~0ull; /* 200 µs in ticks */
static __thread uint64_t my_cycles;
static __thread long my_long;
static uint64_t all_cycles;
static long all_long;

static void add_call_time(void) {
    __atomic_fetch_add(&all_cycles, my_cycles, __ATOMIC_RELAXED);
    __atomic_fetch_add(&all_long, my_long, __ATOMIC_RELAXED);
    my_cycles = 0;
    my_long = 0;
}

static double tsc_t0, mono_t0;
static double mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
/* At start-up: 200 µs in ticks, from 1 ms of both clocks. */
static void calibrate_ticks(void) {
    double m0 = mono_ns(), m;
    uint64_t t0 = ticks();
    while ((m = mono_ns()) - m0 < 1e6) {
    }
    long_call = (uint64_t)((double)(ticks() - t0) / (m - m0) * 200e3);
}

static void timing_start(void) {
    mono_t0 = mono_ns();
    tsc_t0 = (double)ticks();
    timing = 1;
}
/* Prints the in-call time per pair (ns) and the calls left out. */
static void timing_end(long pairs) {
    timing = 0;
    double per_ns = ((double)ticks() - tsc_t0) / (mono_ns() - mono_t0);
    add_call_time();
    printf("incall %.1f\nlong_calls %ld\n", (double)all_cycles / per_ns / pairs, all_long);
}

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s failed: %d\n", what, (int)e);
        abort();
    }
}

/* ---- an op's call, made through 4 frames that depend on the op (one of
 * two functions per level): 16 call sites ---- */
enum call { C_ALLOC, C_FREE, C_ALLOC_ASYNC, C_FREE_ASYNC };
struct req {
    enum call call;
    void **p;
    size_t size;
};

static void route_a(int bits, int level, struct req *r);
static void route_b(int bits, int level, struct req *r);

static inline __attribute__((always_inline)) void descend(int bits, int level, struct req *r) {
    if (level == 4) {
        uint64_t t = ticks();
        switch (r->call) {
        case C_ALLOC: check(cudaMalloc(r->p, r->size), "cudaMalloc"); break;
        case C_FREE: check(cudaFree(*r->p), "cudaFree"); break;
        case C_ALLOC_ASYNC: check(cudaMallocAsync(r->p, r->size, 0), "cudaMallocAsync"); break;
        case C_FREE_ASYNC: check(cudaFreeAsync(*r->p, 0), "cudaFreeAsync"); break;
        }
        t = ticks() - t;
        if (timing) {
            if (t < long_call)
                my_cycles += t;
            else
                my_long++;
        }
    } else if (bits & (1 << level)) {
        route_a(bits, level + 1, r);
    } else {
        route_b(bits, level + 1, r);
    }
}
/* One frame per level, each level one of two functions. */
__attribute__((noinline)) static void route_a(int bits, int level, struct req *r) {
    descend(bits, level, r);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) static void route_b(int bits, int level, struct req *r) {
    descend(bits, level, r);
    __asm__ volatile("" ::: "memory");
}

static inline __attribute__((always_inline)) void call(enum call c, long op, void **p, size_t size) {
    struct req r = {c, p, size};
    descend((int)(op % 16), 0, &r);
}

static void nest(int d, void (*fn)(void));
__attribute__((noinline)) static void nest(int d, void (*fn)(void)) {
    if (d > 1) {
        nest(d - 1, fn);
        __asm__ volatile("" ::: "memory");
    } else {
        fn();
    }
}

static int depth;
static long steps, ops;
static int caching;

/* ---- train / cache ---- */
static void **acts;
static sem_t go, done;
static volatile int stop;
static void *segs[3];

static void forward(void) {
    for (long op = 0; op < ops; op++) {
        op_work(work_iters);
        if (!caching) {
            call(C_ALLOC, op, &acts[op], op_size(op));
        } else if (op == 0) {
            call(C_ALLOC, op, &segs[0], 20 << 20);
        } else if (op == ops / 2) {
            call(C_ALLOC, op, &segs[1], 2 << 20);
        }
    }
}

static void backward_loop(void) {
    for (;;) {
        sem_wait(&go);
        if (stop) return;
        for (long op = ops - 1; op >= 0; op--) {
            op_work(work_iters);
            if (!caching) {
                void *g;
                call(C_ALLOC, op, &g, op_size(op));
                call(C_FREE, op, &g, 0);
                call(C_FREE, op, &acts[op], 0);
            } else if (op == ops / 2) {
                call(C_ALLOC, op, &segs[2], 2 << 20);
            }
        }
        sem_post(&done);
    }
}

static void *backward_thread(void *arg) {
    (void)arg;
    nest(depth - 4, backward_loop);
    add_call_time();
    return NULL;
}

static void one_step(void) {
    nest(depth - 4, forward);
    sem_post(&go);
    sem_wait(&done);
    if (caching) {
        for (int i = 0; i < 3; i++) call(C_FREE, i, &segs[i], 0);
    }
}

static void *weights[4];

static void hold_weights(void) {
    for (int i = 0; i < 4; i++) check(cudaMalloc(&weights[i], (size_t)512 << 20), "cudaMalloc (weights)");
}

static void release_weights(void) {
    for (int i = 0; i < 4; i++) check(cudaFree(weights[i]), "cudaFree (weights)");
}

static int train(void) {
    acts = calloc(ops, sizeof *acts);
    sem_init(&go, 0, 0);
    sem_init(&done, 0, 0);
    hold_weights();
    pthread_t bw;
    pthread_create(&bw, NULL, backward_thread, NULL);
    for (int i = 0; i < 2; i++) one_step(); /* warm-up */
    timing_start();
    double t0 = cpu_ns();
    for (long s = 0; s < steps; s++) one_step();
    double t1 = cpu_ns();
    timing = 0;
    stop = 1;
    sem_post(&go);
    pthread_join(bw, NULL);
    release_weights();
    long pairs = steps * (caching ? 3 : 2 * ops);
    timing_end(pairs);
    printf("pairs %ld\nunits %ld\n%.0f\n", pairs, steps, (t1 - t0) / steps);
    return 0;
}

/* ---- xfree ---- */
#define BATCH 256
struct lane {
    void *buf[2][BATCH];
    sem_t full[2], empty[2];
    long pairs;
} __attribute__((aligned(64)));
static struct lane *lanes;
static __thread struct lane *my_lane;
static long xpairs;

static void produce(void) {
    struct lane *l = my_lane;
    long i = 0;
    for (long b = 0; i < l->pairs; b++) {
        int k = b & 1;
        sem_wait(&l->empty[k]);
        for (int j = 0; j < BATCH; j++, i++) call(C_ALLOC, i, &l->buf[k][j], op_size(i));
        sem_post(&l->full[k]);
    }
}

static void consume(void) {
    struct lane *l = my_lane;
    long i = 0;
    for (long b = 0; i < l->pairs; b++) {
        int k = b & 1;
        sem_wait(&l->full[k]);
        for (int j = 0; j < BATCH; j++, i++) call(C_FREE, i, &l->buf[k][j], 0);
        sem_post(&l->empty[k]);
    }
}

static void alone(void) {
    for (long i = 0; i < xpairs; i++) {
        void *p;
        call(C_ALLOC, i, &p, op_size(i));
        call(C_FREE, i, &p, 0);
    }
}

static void *producer(void *arg) {
    my_lane = arg;
    nest(depth - 4, produce);
    add_call_time();
    return NULL;
}

static void *consumer(void *arg) {
    my_lane = arg;
    nest(depth - 4, consume);
    add_call_time();
    return NULL;
}

static int xfree(int threads) {
    hold_weights();
    double t0, t1;
    long total;
    if (threads <= 1) {
        long n = xpairs;
        xpairs = 1000;
        nest(depth - 4, alone); /* warm-up */
        xpairs = n;
        timing_start();
        t0 = cpu_ns();
        nest(depth - 4, alone);
        t1 = cpu_ns();
        total = xpairs;
    } else {
        int k = threads / 2;
        lanes = aligned_alloc(64, k * sizeof *lanes);
        pthread_t th[64];
        for (int i = 0; i < k; i++) {
            lanes[i].pairs = (xpairs + BATCH - 1) / BATCH * BATCH;
            for (int j = 0; j < 2; j++) {
                sem_init(&lanes[i].full[j], 0, 0);
                sem_init(&lanes[i].empty[j], 0, 1);
            }
        }
        timing_start();
        t0 = cpu_ns();
        for (int i = 0; i < k; i++) {
            pthread_create(&th[2 * i], NULL, producer, &lanes[i]);
            pthread_create(&th[2 * i + 1], NULL, consumer, &lanes[i]);
        }
        for (int i = 0; i < 2 * k; i++) pthread_join(th[i], NULL);
        t1 = cpu_ns();
        total = lanes[0].pairs * k;
    }
    release_weights();
    timing_end(total);
    printf("pairs %ld\nunits %ld\n%.1f\n", total, total, (t1 - t0) / total);
    return 0;
}

/* ---- async ---- */
static long requests, layers;

static void infer(long n) {
    for (long r = 0; r < n; r++) {
        void *in = NULL, *out;
        call(C_ALLOC_ASYNC, 0, &in, op_size(r));
        for (long l = 0; l < layers; l++) {
            call(C_ALLOC_ASYNC, l, &out, op_size(l + r));
            op_work(work_iters);
            call(C_FREE_ASYNC, l, &in, 0);
            in = out;
        }
        call(C_FREE_ASYNC, 0, &in, 0);
    }
}

static void infer_warm(void) { infer(2); }
static void infer_all(void) { infer(requests); }

static int async_loop(void) {
    hold_weights();
    nest(depth - 4, infer_warm);
    timing_start();
    double t0 = cpu_ns();
    nest(depth - 4, infer_all);
    double t1 = cpu_ns();
    release_weights();
    timing_end(requests * (layers + 1));
    printf("pairs %ld\nunits %ld\n%.0f\n", requests * (layers + 1), requests, (t1 - t0) / requests);
    return 0;
}

static void usage(const char *me) {
    fprintf(stderr,
            "usage: %s calibrate | train|cache STEPS OPS DEPTH | xfree PAIRS DEPTH THREADS |"
            " async REQUESTS LAYERS DEPTH\n",
            me);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) usage(argv[0]);
    const char *mode = argv[1];
    if (!strcmp(mode, "calibrate")) {
        /* The fastest of 20 runs of 1M iterations, by the thread's CPU clock. */
        double best = 1e30;
        for (int i = 0; i < 20; i++) {
            struct timespec a, b;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
            op_work(1000000);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
            double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
            if (ns < best) best = ns;
        }
        printf("%.0f\n", 1e6 * 10e3 / best);
        return 0;
    }
    const char *w = getenv("BENCH_WORK_ITERS");
    work_iters = w ? atol(w) : 0;
    calibrate_ticks();
    check(cudaFree(NULL), "cudaFree(NULL)"); /* initialize the runtime */
    if (!strcmp(mode, "train") || !strcmp(mode, "cache")) {
        if (argc < 5) usage(argv[0]);
        caching = !strcmp(mode, "cache");
        steps = atol(argv[2]);
        ops = atol(argv[3]);
        depth = atoi(argv[4]);
        return train();
    }
    if (!strcmp(mode, "xfree")) {
        if (argc < 5) usage(argv[0]);
        xpairs = atol(argv[2]);
        depth = atoi(argv[3]);
        return xfree(atoi(argv[4]));
    }
    if (!strcmp(mode, "async")) {
        if (argc < 5) usage(argv[0]);
        requests = atol(argv[2]);
        layers = atol(argv[3]);
        depth = atoi(argv[4]);
        return async_loop();
    }
    usage(argv[0]);
}
