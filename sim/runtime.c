/*
 * cudaleak's simulated CUDA runtime, built as libcudart.so.12 and as an
 * object for static linking (like nvcc's default static cudart); tests
 * build it as libcudart.so.13 with -DSIMCUDART_TRACE=13.
 *
 * Like the real runtime it never binds to the driver by symbol: on first
 * use it dlopen()s libcuda.so.1, dlsym()s "cuGetProcAddress_v2", and then
 * makes every cuGetProcAddress request that NVIDIA's real libcudart 12.9
 * (or 13.2) makes at start-up, with the same names, versions and flags
 * (cudart_lookups.h, generated from the traces in sim/traces/). So it asks
 * for each function at the version that introduced it, not at its own:
 * cuMemAlloc at 3020 (cuMemAlloc_v2), cuDevicePrimaryCtxReset at 7000 (the
 * v1 function), cuMemAllocAsync at 11020 with flags 0 and 2. Its own calls
 * use only what those requests returned. It retains the primary context of
 * device 0 and makes it current on each thread that calls it.
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "cuda_runtime_api.h"
#include "cudart_lookups.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

#ifndef SIMCUDART_TRACE
#define SIMCUDART_TRACE 12
#endif
#define PASTE_(a, b) a##b
#define PASTE(a, b) PASTE_(a, b)
#define SIMCUDART_LOOKUPS PASTE(SIMCUDART_LOOKUPS_, SIMCUDART_TRACE)

/* Every request of the trace, and what the driver answered. */
static struct lookup {
    const char *name;
    int version;
    cuuint64_t flags;
    void *fn;
} lookups[] = {
#define LOOKUP(name, version, flags) {name, version, flags, NULL},
    SIMCUDART_LOOKUPS(LOOKUP)
#undef LOOKUP
};

/* What the driver answered for a request the real runtime makes; a
 * request it does not make is a mistake in this file. */
static void *answered(const char *name, int version, cuuint64_t flags) {
    for (size_t i = 0; i < sizeof lookups / sizeof lookups[0]; i++)
        if (!strcmp(lookups[i].name, name) && lookups[i].version == version &&
            lookups[i].flags == flags)
            return lookups[i].fn;
    fprintf(stderr, "simulated cudart: NVIDIA's runtime never asks for %s at %d, flags %llu\n",
            name, version, (unsigned long long)flags);
    abort();
}

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxReset)(CUdevice);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*MemFreeHost)(void *);
    CUresult (*ArrayCreate)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*ArrayDestroy)(CUarray);
    CUresult (*MipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
                                     unsigned int);
    CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
    CUresult (*HostRegister)(void *, size_t, unsigned int);
    CUresult (*HostUnregister)(void *);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamBeginCapture_ptsz)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*StreamEndCapture_ptsz)(CUstream, CUgraph *);
    CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*StreamIsCapturing_ptsz)(CUstream, CUstreamCaptureStatus *);
    CUresult (*StreamGetCaptureInfo)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                     const CUgraphNode **, size_t *);
    CUresult (*StreamGetCaptureInfo_ptsz)(CUstream, CUstreamCaptureStatus *, cuuint64_t *,
                                          CUgraph *, const CUgraphNode **, size_t *);
    CUresult (*GraphCreate)(CUgraph *, unsigned int);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*GraphAddMemAllocNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                     CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*GraphAddMemFreeNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                    CUdeviceptr);
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphLaunch_ptsz)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*DeviceGraphMemTrim)(CUdevice);
    get_proc_t GetProcAddress; /* from dlsym("cuGetProcAddress_v2") */
    get_proc_t EntryPoint;     /* cuGetProcAddress at 12000: cudaGetDriverEntryPoint's */
} drv;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudaError_t init_error = cudaErrorInitializationError;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary_ctx; /* NULL after cudaDeviceReset until the next call */

/* drv.field = what the driver answered for (name, version, flags); the
 * runtime cannot start without it. */
#define GET(field, name, version, flags)                                 \
    do {                                                                 \
        if (!(*(void **)&drv.field = answered(name, version, flags))) { \
            fprintf(stderr, "simulated cudart: the driver has no %s\n", name); \
            return;                                                      \
        }                                                                \
    } while (0)

/* SIMCUDA_BACKING=threaded (driver.c): write no shared line per call. */
static int threaded_backing;

static void load_driver(void) {
    const char *backing = getenv("SIMCUDA_BACKING");
    threaded_backing = backing && !strcmp(backing, "threaded");
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "simulated cudart: cannot load libcuda.so.1: %s\n", dlerror());
        return;
    }
    drv.GetProcAddress = (get_proc_t)dlsym(h, "cuGetProcAddress_v2");
    if (!drv.GetProcAddress) return;
    /* Every request NVIDIA's runtime makes, whether or not this one uses
     * the answer; the simulated driver lacks most of them (NULL). */
    for (size_t i = 0; i < sizeof lookups / sizeof lookups[0]; i++) {
        CUdriverProcAddressQueryResult st;
        struct lookup *l = &lookups[i];
        if (drv.GetProcAddress(l->name, &l->fn, l->version, l->flags, &st) ||
            st != CU_GET_PROC_ADDRESS_SUCCESS)
            l->fn = NULL;
    }
    GET(EntryPoint, "cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(Init, "cuInit", 2000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(DeviceGetCount, "cuDeviceGetCount", 2000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, CU_GET_PROC_ADDRESS_DEFAULT);
    /* Optional: a driver built with SIMCUDA_NO_CTX_QUERIES lacks it, as
     * some old or partial drivers do; then the context is set each time. */
    drv.CtxGetCurrent = answered("cuCtxGetCurrent", 4000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(CtxSetCurrent, "cuCtxSetCurrent", 4000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAlloc, "cuMemAlloc", 3020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocPitch, "cuMemAllocPitch", 3020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocManaged, "cuMemAllocManaged", 6000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocAsync, "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocAsync_ptsz, "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    /* NVIDIA's runtime does not ask for cuMemAllocHost: pinned memory comes
     * from cuMemHostAlloc. */
    GET(MemHostAlloc, "cuMemHostAlloc", 2020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemFree, "cuMemFree", 3020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemFreeAsync, "cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemFreeAsync_ptsz, "cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(MemFreeHost, "cuMemFreeHost", 2000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(ArrayCreate, "cuArrayCreate", 3020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(Array3DCreate, "cuArray3DCreate", 3020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(ArrayDestroy, "cuArrayDestroy", 2000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(HostRegister, "cuMemHostRegister", 6050, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(HostUnregister, "cuMemHostUnregister", 4000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(IpcGetMemHandle, "cuIpcGetMemHandle", 4010, CU_GET_PROC_ADDRESS_DEFAULT);
    /* NVIDIA's runtime asks for cuIpcOpenMemHandle at 4010 and at 11000;
     * which one cudaIpcOpenMemHandle calls is not known (docs/gpu-validation.md).
     * This one calls the CUDA 4.1 entry point, the one a hook table of _v2
     * names alone would miss. */
    GET(IpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(IpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(StreamCreate, "cuStreamCreate", 2000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(StreamDestroy, "cuStreamDestroy", 4000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(StreamBeginCapture, "cuStreamBeginCapture", 10010, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(StreamBeginCapture_ptsz, "cuStreamBeginCapture", 10010,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(StreamEndCapture, "cuStreamEndCapture", 10000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(StreamEndCapture_ptsz, "cuStreamEndCapture", 10000,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(StreamIsCapturing, "cuStreamIsCapturing", 10000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(StreamIsCapturing_ptsz, "cuStreamIsCapturing", 10000,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(StreamGetCaptureInfo, "cuStreamGetCaptureInfo", 11030, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(StreamGetCaptureInfo_ptsz, "cuStreamGetCaptureInfo", 11030,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(GraphCreate, "cuGraphCreate", 10000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(GraphDestroy, "cuGraphDestroy", 10000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(GraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(GraphAddMemFreeNode, "cuGraphAddMemFreeNode", 11040, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040,
        CU_GET_PROC_ADDRESS_DEFAULT);
    GET(GraphLaunch, "cuGraphLaunch", 10000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(GraphLaunch_ptsz, "cuGraphLaunch", 10000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(GraphExecDestroy, "cuGraphExecDestroy", 10000, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(DeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040, CU_GET_PROC_ADDRESS_DEFAULT);
    if (drv.Init(0) == CUDA_SUCCESS) init_error = cudaSuccess;
}

static cudaError_t to_runtime_error(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    default: return cudaErrorUnknown;
    }
}

/* Loads the driver once, then makes the primary context current here. */
static cudaError_t lazy_init(void) {
    pthread_once(&once, load_driver);
    if (init_error) return init_error;
    CUcontext cur = NULL;
    if (drv.CtxGetCurrent) drv.CtxGetCurrent(&cur);
    /* Once retained, the primary context is read without the lock: a lock
     * taken by every call would serialize threads (the real runtime takes
     * none), and benchmarks of threads would measure it. */
    CUcontext want = __atomic_load_n(&primary_ctx, __ATOMIC_ACQUIRE);
    if (!want) {
        pthread_mutex_lock(&ctx_lock);
        CUresult r = CUDA_SUCCESS;
        if (!primary_ctx) {
            CUcontext retained = NULL;
            r = drv.DevicePrimaryCtxRetain(&retained, 0);
            if (!r) __atomic_store_n(&primary_ctx, retained, __ATOMIC_RELEASE);
        }
        want = primary_ctx;
        pthread_mutex_unlock(&ctx_lock);
        if (r) return to_runtime_error(r);
    }
    if (cur != want) drv.CtxSetCurrent(want);
    return cudaSuccess;
}

#define INIT_OR_RETURN()                   \
    do {                                   \
        cudaError_t e_ = lazy_init();      \
        if (e_ != cudaSuccess) return e_;  \
    } while (0)

/* How many cudaMalloc calls this copy of the runtime served: tests that
 * load two copies check that each program call reached its own copy. */
static int malloc_calls;
int simcudart_malloc_calls(void) { return __atomic_load_n(&malloc_calls, __ATOMIC_RELAXED); }

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    /* not with SIMCUDA_BACKING=threaded: a line every thread writes */
    if (!threaded_backing) __atomic_fetch_add(&malloc_calls, 1, __ATOMIC_RELAXED);
    INIT_OR_RETURN();
    if (!devPtr) return cudaErrorInvalidValue;
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    return to_runtime_error(drv.MemAlloc((CUdeviceptr *)devPtr, size));
}

cudaError_t cudaFree(void *devPtr) {
    INIT_OR_RETURN();
    if (!devPtr) return cudaSuccess; /* the context-initialization idiom */
    return to_runtime_error(drv.MemFree((CUdeviceptr)devPtr));
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
    INIT_OR_RETURN();
    if (!devPtr) return cudaErrorInvalidValue;
    return to_runtime_error(drv.MemAllocAsync((CUdeviceptr *)devPtr, size, stream));
}

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream) {
    INIT_OR_RETURN();
    if (!devPtr) return cudaErrorInvalidValue;
    return to_runtime_error(drv.MemAllocAsync_ptsz((CUdeviceptr *)devPtr, size, stream));
}

cudaError_t cudaMallocFromPoolAsync(void **devPtr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t stream) {
    INIT_OR_RETURN();
    if (!devPtr) return cudaErrorInvalidValue;
    return to_runtime_error(drv.MemAllocFromPoolAsync((CUdeviceptr *)devPtr, size,
                                                      (CUmemoryPool)pool, stream));
}

/* The per-thread default-stream variant NVIDIA's runtime exports (nvcc's
 * --default-stream per-thread maps cudaMallocFromPoolAsync to it). */
cudaError_t cudaMallocFromPoolAsync_ptsz(void **devPtr, size_t size, cudaMemPool_t pool,
                                         cudaStream_t stream) {
    INIT_OR_RETURN();
    if (!devPtr) return cudaErrorInvalidValue;
    return to_runtime_error(drv.MemAllocFromPoolAsync_ptsz((CUdeviceptr *)devPtr, size,
                                                           (CUmemoryPool)pool, stream));
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.MemFreeAsync((CUdeviceptr)devPtr, stream));
}

cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.MemFreeAsync_ptsz((CUdeviceptr)devPtr, stream));
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.MemHostAlloc(ptr, size, 0));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.MemHostAlloc(pHost, size, flags));
}

cudaError_t cudaFreeHost(void *ptr) {
    INIT_OR_RETURN();
    if (!ptr) return cudaSuccess;
    return to_runtime_error(drv.MemFreeHost(ptr));
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.MemAllocManaged((CUdeviceptr *)devPtr, size, flags));
}

cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.MemAllocPitch((CUdeviceptr *)devPtr, pitch, width, height, 4));
}

cudaError_t cudaMalloc3D(struct cudaPitchedPtr *p, struct cudaExtent extent) {
    INIT_OR_RETURN();
    if (!p) return cudaErrorInvalidValue;
    size_t pitch = 0;
    CUdeviceptr d = 0;
    CUresult r = drv.MemAllocPitch(&d, &pitch, extent.width, extent.height * extent.depth, 4);
    if (r) return to_runtime_error(r);
    p->ptr = (void *)d;
    p->pitch = pitch;
    p->xsize = extent.width;
    p->ysize = extent.height;
    return cudaSuccess;
}

/* ---- CUDA arrays, over the driver's ---- */

/* The driver's format and channel count of a channel description (all
 * channels of one size, as cudaCreateChannelDesc makes them). */
static int array_format(const struct cudaChannelFormatDesc *d, CUarray_format *f,
                        unsigned int *channels) {
    if (!d) return 0;
    *channels = (d->x > 0) + (d->y > 0) + (d->z > 0) + (d->w > 0);
    switch (d->f * 100 + d->x) {
    case 108: *f = CU_AD_FORMAT_UNSIGNED_INT8; return 1;
    case 116: *f = CU_AD_FORMAT_UNSIGNED_INT16; return 1;
    case 132: *f = CU_AD_FORMAT_UNSIGNED_INT32; return 1;
    case 8: *f = CU_AD_FORMAT_SIGNED_INT8; return 1;
    case 16: *f = CU_AD_FORMAT_SIGNED_INT16; return 1;
    case 32: *f = CU_AD_FORMAT_SIGNED_INT32; return 1;
    case 216: *f = CU_AD_FORMAT_HALF; return 1;
    case 232: *f = CU_AD_FORMAT_FLOAT; return 1;
    default: return 0;
    }
}

cudaError_t cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                            size_t width, size_t height, unsigned int flags) {
    INIT_OR_RETURN();
    (void)flags;
    CUDA_ARRAY_DESCRIPTOR a = {.Width = width, .Height = height};
    if (!array_format(desc, &a.Format, &a.NumChannels)) return cudaErrorInvalidValue;
    return to_runtime_error(drv.ArrayCreate((CUarray *)array, &a));
}

cudaError_t cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                              struct cudaExtent extent, unsigned int flags) {
    INIT_OR_RETURN();
    CUDA_ARRAY3D_DESCRIPTOR a = {.Width = extent.width, .Height = extent.height,
                                 .Depth = extent.depth, .Flags = flags};
    if (!array_format(desc, &a.Format, &a.NumChannels)) return cudaErrorInvalidValue;
    return to_runtime_error(drv.Array3DCreate((CUarray *)array, &a));
}

cudaError_t cudaMallocMipmappedArray(cudaMipmappedArray_t *mipmappedArray,
                                     const struct cudaChannelFormatDesc *desc,
                                     struct cudaExtent extent, unsigned int numLevels,
                                     unsigned int flags) {
    INIT_OR_RETURN();
    CUDA_ARRAY3D_DESCRIPTOR a = {.Width = extent.width, .Height = extent.height,
                                 .Depth = extent.depth, .Flags = flags};
    if (!array_format(desc, &a.Format, &a.NumChannels)) return cudaErrorInvalidValue;
    return to_runtime_error(
        drv.MipmappedArrayCreate((CUmipmappedArray *)mipmappedArray, &a, numLevels));
}

cudaError_t cudaFreeArray(cudaArray_t array) {
    INIT_OR_RETURN();
    if (!array) return cudaSuccess;
    return to_runtime_error(drv.ArrayDestroy((CUarray)array));
}

cudaError_t cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray) {
    INIT_OR_RETURN();
    if (!mipmappedArray) return cudaSuccess;
    return to_runtime_error(drv.MipmappedArrayDestroy((CUmipmappedArray)mipmappedArray));
}

/* How many cudaDeviceReset calls this copy served: a hooked runtime
 * function must reach the copy the caller's lookup names. */
static int reset_calls;
int simcudart_reset_calls(void) { return __atomic_load_n(&reset_calls, __ATOMIC_RELAXED); }

cudaError_t cudaDeviceReset(void) {
    __atomic_fetch_add(&reset_calls, 1, __ATOMIC_RELAXED);
    INIT_OR_RETURN();
    pthread_mutex_lock(&ctx_lock);
    __atomic_store_n(&primary_ctx, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ctx_lock);
    return to_runtime_error(drv.DevicePrimaryCtxReset(0));
}

/* What the simulation can answer of the rest of NVIDIA's exports (the
 * others are runtime_stubs.c's: cudaErrorNotSupported). */
cudaError_t cudaDriverGetVersion(int *version) {
    if (!version) return cudaErrorInvalidValue;
    *version = 12040; /* the simulated driver's cuDriverGetVersion */
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
    if (!version) return cudaErrorInvalidValue;
    *version = SIMCUDART_TRACE == 13 ? 13020 : CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return cudaErrorInvalidValue;
    *count = 0;
    INIT_OR_RETURN();
    return to_runtime_error(drv.DeviceGetCount(count));
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return cudaErrorInvalidValue;
    INIT_OR_RETURN();
    *device = 0;
    return cudaSuccess;
}

/* This runtime allocates on device 0's primary context only. */
cudaError_t cudaSetDevice(int device) {
    INIT_OR_RETURN();
    return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

const char *cudaGetErrorName(cudaError_t error) {
    return error == cudaSuccess ? "cudaSuccess" : "cudaErrorSimulated";
}

const char *cudaGetErrorString(cudaError_t error) {
    return error == cudaSuccess ? "no error" : "error (simulated CUDA runtime)";
}

struct cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w,
                                                   enum cudaChannelFormatKind f) {
    struct cudaChannelFormatDesc d = {x, y, z, w, f};
    return d;
}

/* Deprecated since CUDA 4.0, still exported: the same reset as
 * cudaDeviceReset, which reaches the library only at the driver (no runtime
 * hook has this name). */
cudaError_t cudaThreadExit(void) {
    INIT_OR_RETURN();
    pthread_mutex_lock(&ctx_lock);
    __atomic_store_n(&primary_ctx, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ctx_lock);
    return to_runtime_error(drv.DevicePrimaryCtxReset(0));
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus) {
    INIT_OR_RETURN();
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = drv.EntryPoint(symbol, funcPtr, (int)cudaVersion, flags, &st);
    if (driverStatus) *driverStatus = (enum cudaDriverEntryPointQueryResult)st;
    return to_runtime_error(r);
}

/* ---- page-locked memory the program allocated ---- */

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    INIT_OR_RETURN();
    CUresult r = drv.HostRegister(ptr, size, flags);
    if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) return cudaErrorHostMemoryAlreadyRegistered;
    return to_runtime_error(r);
}

cudaError_t cudaHostUnregister(void *ptr) {
    INIT_OR_RETURN();
    CUresult r = drv.HostUnregister(ptr);
    if (r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) return cudaErrorHostMemoryNotRegistered;
    return to_runtime_error(r);
}

/* ---- memory shared between processes ---- */

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
    INIT_OR_RETURN();
    if (!handle) return cudaErrorInvalidValue;
    return to_runtime_error(drv.IpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)devPtr));
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
    INIT_OR_RETURN();
    CUipcMemHandle h;
    memcpy(&h, &handle, sizeof h);
    return to_runtime_error(drv.IpcOpenMemHandle((CUdeviceptr *)devPtr, h, flags));
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.IpcCloseMemHandle((CUdeviceptr)devPtr));
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *driverStatus) {
    return cudaGetDriverEntryPointByVersion(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}

/* ---- streams, stream capture and graphs, over the driver's ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    INIT_OR_RETURN();
    if (!pStream) return cudaErrorInvalidValue;
    return to_runtime_error(drv.StreamCreate((CUstream *)pStream, flags));
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamDestroy(stream));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamBeginCapture(stream, (CUstreamCaptureMode)mode));
}

cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamBeginCapture_ptsz(stream, (CUstreamCaptureMode)mode));
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamEndCapture(stream, pGraph));
}

cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamEndCapture_ptsz(stream, pGraph));
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamIsCapturing(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                       enum cudaStreamCaptureStatus *pCaptureStatus) {
    INIT_OR_RETURN();
    return to_runtime_error(
        drv.StreamIsCapturing_ptsz(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream,
                                        enum cudaStreamCaptureStatus *captureStatus_out,
                                        unsigned long long *id_out, cudaGraph_t *graph_out,
                                        const cudaGraphNode_t **dependencies_out,
                                        size_t *numDependencies_out) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamGetCaptureInfo(
        stream, (CUstreamCaptureStatus *)captureStatus_out, (cuuint64_t *)id_out, graph_out,
        dependencies_out, numDependencies_out));
}

cudaError_t cudaStreamGetCaptureInfo_v2_ptsz(cudaStream_t stream,
                                             enum cudaStreamCaptureStatus *captureStatus_out,
                                             unsigned long long *id_out, cudaGraph_t *graph_out,
                                             const cudaGraphNode_t **dependencies_out,
                                             size_t *numDependencies_out) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.StreamGetCaptureInfo_ptsz(
        stream, (CUstreamCaptureStatus *)captureStatus_out, (cuuint64_t *)id_out, graph_out,
        dependencies_out, numDependencies_out));
}

cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.GraphCreate(pGraph, flags));
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.GraphDestroy(graph));
}

_Static_assert(sizeof(struct cudaMemAllocNodeParams) == sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) &&
                   sizeof(struct cudaMemPoolProps) == sizeof(CUmemPoolProps),
               "the runtime's and the driver's allocation node layouts");

cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                     const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                     struct cudaMemAllocNodeParams *nodeParams) {
    INIT_OR_RETURN();
    if (!nodeParams) return cudaErrorInvalidValue;
    /* the same layout: the driver's fields are the runtime's */
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memcpy(&p, nodeParams, sizeof p);
    CUresult r = drv.GraphAddMemAllocNode(pGraphNode, graph, pDependencies, numDependencies, &p);
    if (!r) nodeParams->dptr = (void *)(uintptr_t)p.dptr;
    return to_runtime_error(r);
}

cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                    const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                    void *dptr) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.GraphAddMemFreeNode(pGraphNode, graph, pDependencies,
                                                    numDependencies, (CUdeviceptr)dptr));
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                          unsigned long long flags) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.GraphInstantiateWithFlags(pGraphExec, graph, flags));
}

/* CUDA 12's signature (flags, no error node or log). */
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
    return cudaGraphInstantiateWithFlags(pGraphExec, graph, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.GraphLaunch(graphExec, stream));
}

cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.GraphLaunch_ptsz(graphExec, stream));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.GraphExecDestroy(graphExec));
}

cudaError_t cudaDeviceGraphMemTrim(int device) {
    INIT_OR_RETURN();
    return to_runtime_error(drv.DeviceGraphMemTrim(device));
}
