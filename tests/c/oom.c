/* Running out of device memory on the simulated driver, which
 * the tests give SIMCUDA_DEVICE_BYTES = 64 MiB.
 *
 *   oom [SECS]  weights (32 MiB, kept) and a cache of 4 x 6 MiB; a request
 *               of 40 MiB fails (8 MiB free); the cache is freed and the
 *               request tried again, which fails again (32 MiB free); exit 1.
 *               With SECS, sleeps that long before exiting.
 *   recover     the same request fails once; everything is freed; exit 0.
 *   driver      cuMemAlloc_v2 of 40 MiB fails once, with no runtime above.
 *   vmm         cuMemCreate of 80 MiB on device 0 fails once.
 *   peak        weights (10 MiB, kept); a burst of 8 activations of 1 MiB,
 *               freed; then a small block (64 KiB, kept).
 *   storm SECS  8 threads fail cudaMalloc(1 GiB) in a loop for SECS
 *               seconds; prints the number of failed calls.
 *   kind K      one request of allocation kind K that does not fit: async,
 *               pool, managed and host (1 PiB, past SIMCUDA_MAX_ALLOC),
 *               pitch (100 rows of 1 MiB), array (4096 x 8192 floats).
 *
 * Every status and errno the program sees is printed: the output must be
 * the same with the library and without.
 */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024 * 1024)

static void *load_weights(size_t bytes) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, bytes)); /* WEIGHTS */
    return p;
}

static void fill_cache(void **cache, int n) {
    for (int i = 0; i < n; i++) CHECK(cudaMalloc(&cache[i], 6 * MIB)); /* CACHE */
}

static int request(void **out, size_t bytes) {
    errno = 1234;
    int rc = cudaMalloc(out, bytes); /* REQUEST */
    printf("request of %zu bytes: rc=%d errno=%d out=%p\n", bytes, rc, errno, *out);
    return rc;
}

static void *forward(void) {
    void *act[8];
    for (int i = 0; i < 8; i++) CHECK(cudaMalloc(&act[i], MIB)); /* ACTIVATION */
    for (int i = 0; i < 8; i++) CHECK(cudaFree(act[i]));
    return NULL;
}

static void *later(void) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, 64 * 1024)); /* LATER */
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double storm_seconds;
static long storm_failures[8];

static void *storm_worker(void *arg) {
    long i = (long)arg;
    double end = now_s() + storm_seconds;
    while (now_s() < end) {
        void *p = NULL;
        if (cudaMalloc(&p, 1024L * MIB) == cudaErrorMemoryAllocation) storm_failures[i]++; /* STORM */
        else
            exit(4);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "oom";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(mode, "oom") || !strcmp(mode, "recover")) {
        void *weights = load_weights(32 * MIB);
        void *cache[4];
        fill_cache(cache, 4);
        void *want = NULL;
        int rc = request(&want, 40 * MIB);
        for (int i = 0; i < 4; i++) CHECK(cudaFree(cache[i]));
        if (!strcmp(mode, "recover")) {
            CHECK(cudaFree(weights));
            return rc == cudaErrorMemoryAllocation ? 0 : 2;
        }
        rc = request(&want, 40 * MIB);
        if (argc > 2) sleep(atoi(argv[2]));
        return rc == cudaErrorMemoryAllocation ? 1 : 2;
    }
    if (!strcmp(mode, "driver")) {
        driver_context();
        CUdeviceptr p = 0;
        errno = 77;
        CUresult r = cuMemAlloc_v2(&p, 80 * MIB); /* DRIVER REQUEST */
        printf("cuMemAlloc_v2: rc=%d errno=%d\n", r, errno);
        return 0;
    }
    if (!strcmp(mode, "vmm")) {
        driver_context();
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemGenericAllocationHandle h = 0;
        CUresult r = cuMemCreate(&h, 80 * MIB, &prop, 0); /* VMM REQUEST */
        printf("cuMemCreate: rc=%d\n", r);
        return 0;
    }
    if (!strcmp(mode, "peak")) {
        load_weights(10 * MIB);
        forward();
        later();
        return 0;
    }
    if (!strcmp(mode, "kind") && argc > 2) {
        const char *k = argv[2];
        void *p = NULL;
        size_t pitch = 0;
        cudaArray_t a = NULL;
        const struct cudaChannelFormatDesc one_float = {32, 0, 0, 0, cudaChannelFormatKindFloat};
        int rc;
        if (!strcmp(k, "async")) rc = cudaMallocAsync(&p, 80 * MIB, 0); /* KIND async */
        else if (!strcmp(k, "pool")) rc = cudaMallocFromPoolAsync(&p, 80 * MIB, 0, 0); /* KIND pool */
        else if (!strcmp(k, "managed")) rc = cudaMallocManaged(&p, 1ULL << 50, 1); /* KIND managed */
        else if (!strcmp(k, "host")) rc = cudaMallocHost(&p, 1ULL << 50); /* KIND host */
        else if (!strcmp(k, "pitch")) rc = cudaMallocPitch(&p, &pitch, MIB, 100); /* KIND pitch */
        else if (!strcmp(k, "array")) rc = cudaMallocArray(&a, &one_float, 4096, 8192, 0); /* KIND array */
        else return 2;
        printf("%s: rc=%d\n", k, rc);
        return 0;
    }
    if (!strcmp(mode, "storm")) {
        storm_seconds = argc > 2 ? atof(argv[2]) : 1.0;
        pthread_t t[8];
        for (long i = 0; i < 8; i++) pthread_create(&t[i], NULL, storm_worker, (void *)i);
        long total = 0;
        for (int i = 0; i < 8; i++) {
            pthread_join(t[i], NULL);
            total += storm_failures[i];
        }
        printf("failed calls: %ld\n", total);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
