/*
 * A quota shim, as GPU-sharing layers on shared clusters are: it counts
 * allocation calls and refuses those past QUOTA_SHIM_MAX (default 1000)
 * with an out-of-memory error. At exit it prints on stderr
 * "quota shim: N calls, M refused" (QUOTA_SHIM_NAME names it, when two
 * are loaded). tests/endings.rs builds it two ways:
 *
 *   -DQUOTA_DRIVER  a libcuda.so.1 put first on LD_LIBRARY_PATH: it loads
 *                   the real driver (SIMCUDA_WRAPPED_DRIVER, a full path)
 *                   with RTLD_GLOBAL, exports only cuGetProcAddress(_v2),
 *                   which passes the driver's answers through except for
 *                   cuMemAlloc_v2, for which it hands out its own
 *                   function. That function has no exported name: a caller
 *                   reaches it through cuGetProcAddress or not at all.
 *   -DQUOTA_PRELOAD a library preloaded beside cudaleak (before it or after
 *                   it in LD_PRELOAD) that exports cudaMalloc and forwards
 *                   to the next definition (dlsym(RTLD_NEXT)).
 *
 * Either way, the program's calls must reach the shim as they do without
 * cudaleak, so that the quota holds.
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "cuda_runtime_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long calls, refused;

static int over_quota(void) {
    static long max = -1;
    if (max < 0) {
        const char *m = getenv("QUOTA_SHIM_MAX");
        max = m ? atol(m) : 1000;
    }
    long n = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (n > max) {
        __atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

__attribute__((destructor)) static void say_count(void) {
    const char *name = getenv("QUOTA_SHIM_NAME");
    fprintf(stderr, "quota %s: %ld calls, %ld refused\n", name ? name : "shim", calls, refused);
}

#ifdef QUOTA_DRIVER
typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
typedef CUresult (*mem_alloc_t)(CUdeviceptr *, size_t);

static void *driver;
static get_proc_t driver_getproc;
static mem_alloc_t driver_mem_alloc;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *path = getenv("SIMCUDA_WRAPPED_DRIVER");
    if (!path || !strchr(path, '/')) {
        fprintf(stderr, "quota shim: SIMCUDA_WRAPPED_DRIVER must be the driver's full path\n");
        return;
    }
    driver = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!driver) {
        fprintf(stderr, "quota shim: %s\n", dlerror());
        return;
    }
    driver_getproc = (get_proc_t)dlsym(driver, "cuGetProcAddress_v2");
    driver_mem_alloc = (mem_alloc_t)dlsym(driver, "cuMemAlloc_v2");
}

/* The shim's own cuMemAlloc_v2: not exported. */
static CUresult quota_mem_alloc(CUdeviceptr *dptr, size_t bytesize) {
    if (over_quota()) return CUDA_ERROR_OUT_OF_MEMORY;
    return driver_mem_alloc(dptr, bytesize);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    pthread_once(&once, load);
    if (!driver_getproc) return CUDA_ERROR_NOT_FOUND;
    CUresult r = driver_getproc(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn && *pfn == (void *)driver_mem_alloc) *pfn = (void *)quota_mem_alloc;
    return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
#endif

#ifdef QUOTA_PRELOAD
cudaError_t cudaMalloc(void **devPtr, size_t size) {
    static cudaError_t (*next)(void **, size_t);
    if (!next) next = (cudaError_t(*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMalloc");
    if (over_quota()) return cudaErrorMemoryAllocation;
    return next ? next(devPtr, size) : (cudaError_t)35; /* cudaErrorInsufficientDriver */
}
#endif
