/*
 * A libcuda.so.1 that wraps the driver, as GPU-sharing and quota shims on
 * Kubernetes clusters and API remoting layers do: it loads the real driver
 * by its full path (SIMCUDA_WRAPPED_DRIVER) and forwards every entry point
 * of the simulated driver (driver_entry_points.h), each resolved at its
 * first call. The tests build it and put it first on LD_LIBRARY_PATH.
 *
 * SIMCUDA_WRAPPER_MODE says how it reaches the driver below it:
 *   dlsym    (default) each forwarder looks its function up with
 *            dlsym(driver, symbol); cuGetProcAddress asks the driver and
 *            hands out the wrapper's own forwarder of the answer
 *   getproc  each forwarder asks the driver's cuGetProcAddress_v2 (itself
 *            found with dlsym) by name and version; cuGetProcAddress passes
 *            the driver's answer through
 *   both     forwarders by dlsym, cuGetProcAddress passing the driver's
 *            answer through
 * Under cudaleak, none of these lookups may get a hook back: the hook's
 * real function is this wrapper, which would call the hook again, forever.
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "driver_entry_points.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

enum { BY_DLSYM, BY_GETPROC, BOTH };
static int mode;
static void *driver;
static get_proc_t driver_getproc;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *m = getenv("SIMCUDA_WRAPPER_MODE");
    mode = !m || !strcmp(m, "dlsym") ? BY_DLSYM : !strcmp(m, "getproc") ? BY_GETPROC : BOTH;
    const char *path = getenv("SIMCUDA_WRAPPED_DRIVER");
    if (!path || !strchr(path, '/')) {
        fprintf(stderr, "wrapper libcuda: SIMCUDA_WRAPPED_DRIVER must be the driver's full path\n");
        return;
    }
    driver = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        fprintf(stderr, "wrapper libcuda: %s\n", dlerror());
        return;
    }
    driver_getproc = (get_proc_t)dlsym(driver, "cuGetProcAddress_v2");
}

/* The driver's function for one of the wrapper's entry points. */
static void *below(const char *symbol, const char *name, int version, int per_thread) {
    pthread_once(&once, load);
    if (!driver) return NULL;
    if (mode != BY_GETPROC) return dlsym(driver, symbol);
    void *f = NULL;
    CUdriverProcAddressQueryResult st;
    if (!driver_getproc ||
        driver_getproc(name, &f, version,
                       per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st))
        return NULL;
    return f;
}

#define FORWARD(sym, name, version, per_thread, params, args)              \
    CUresult sym params {                                                    \
        static void *real;                                                   \
        void *f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);                 \
        if (!f) {                                                            \
            f = below(#sym, #name, version, per_thread);                     \
            if (!f) return CUDA_ERROR_NOT_FOUND;                             \
            __atomic_store_n(&real, f, __ATOMIC_RELEASE);                    \
        }                                                                    \
        return ((CUresult(*) params)f) args;                                 \
    }
#define NOT_FORWARDED(...)
SIMCUDA_ENTRY_POINTS(FORWARD, NOT_FORWARDED)

/* The wrapper's own forwarders, by symbol (linked -Bsymbolic-functions, so
 * these are its functions, not whatever a preloaded library exports). */
static const struct {
    const char *symbol;
    void *fn;
} own[] = {
#define OWN(sym, ...) {#sym, (void *)sym},
    SIMCUDA_ENTRY_POINTS(OWN, NOT_FORWARDED)
#undef OWN
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    pthread_once(&once, load);
    if (!driver_getproc) return CUDA_ERROR_NOT_FOUND;
    CUresult r = driver_getproc(symbol, pfn, cudaVersion, flags, status);
    if (r != CUDA_SUCCESS || mode != BY_DLSYM || !pfn || !*pfn) return r;
    /* Hand out this wrapper's forwarder of the driver's function. */
    Dl_info info;
    if (!dladdr(*pfn, &info) || !info.dli_sname) return r;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (!strcmp(own[i].symbol, info.dli_sname)) {
            *pfn = own[i].fn;
            break;
        }
    return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* The simulated driver's test helper, forwarded too. */
const char *simcuda_proc_symbol(const char *name, int version, unsigned long long flags) {
    pthread_once(&once, load);
    const char *(*f)(const char *, int, unsigned long long) =
        driver ? (const char *(*)(const char *, int, unsigned long long))dlsym(
                     driver, "simcuda_proc_symbol")
               : NULL;
    return f ? f(name, version, flags) : NULL;
}
