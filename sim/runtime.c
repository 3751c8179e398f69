/*
 * cudaleak's simulated CUDA runtime, built as libcudart.so.12 and as an
 * object for static linking (like nvcc's default static cudart).
 *
 * Like the real runtime it never binds to the driver by symbol: on first
 * use it dlopen()s libcuda.so.1, dlsym()s "cuGetProcAddress_v2", and takes
 * every other driver function from that (with the per-thread-default-stream
 * flag for the _ptsz entry points). It retains the primary context of
 * device 0 and makes it current on each thread that calls it.
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "cuda_runtime_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxReset)(CUdevice);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemAllocHost)(void **, size_t);
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
    get_proc_t GetProcAddress;
} drv;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudaError_t init_error = cudaErrorInitializationError;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary_ctx; /* NULL after cudaDeviceReset until the next call */

#define GET(field, name, flags)                                                          \
    do {                                                                                 \
        CUdriverProcAddressQueryResult st;                                               \
        if (drv.GetProcAddress(name, (void **)&drv.field, CUDART_VERSION, flags, &st) || \
            st != CU_GET_PROC_ADDRESS_SUCCESS)                                           \
            return;                                                                      \
    } while (0)

static void load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "simulated cudart: cannot load libcuda.so.1: %s\n", dlerror());
        return;
    }
    drv.GetProcAddress = (get_proc_t)dlsym(h, "cuGetProcAddress_v2");
    if (!drv.GetProcAddress) return;
    GET(Init, "cuInit", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", CU_GET_PROC_ADDRESS_DEFAULT);
    {
        /* Optional: a driver built with SIMCUDA_NO_CTX_QUERIES lacks it, as
         * some old or partial drivers do; then the context is set each time. */
        CUdriverProcAddressQueryResult st;
        if (drv.GetProcAddress("cuCtxGetCurrent", (void **)&drv.CtxGetCurrent, CUDART_VERSION,
                               CU_GET_PROC_ADDRESS_DEFAULT, &st))
            drv.CtxGetCurrent = NULL;
    }
    GET(CtxSetCurrent, "cuCtxSetCurrent", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAlloc, "cuMemAlloc", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocPitch, "cuMemAllocPitch", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocManaged, "cuMemAllocManaged", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocAsync, "cuMemAllocAsync", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocAsync_ptsz, "cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemAllocHost, "cuMemAllocHost", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemHostAlloc, "cuMemHostAlloc", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemFree, "cuMemFree", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemFreeAsync, "cuMemFreeAsync", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MemFreeAsync_ptsz, "cuMemFreeAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(MemFreeHost, "cuMemFreeHost", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(ArrayCreate, "cuArrayCreate", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(Array3DCreate, "cuArray3DCreate", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(ArrayDestroy, "cuArrayDestroy", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MipmappedArrayCreate, "cuMipmappedArrayCreate", CU_GET_PROC_ADDRESS_DEFAULT);
    GET(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", CU_GET_PROC_ADDRESS_DEFAULT);
    if (drv.Init(0) == CUDA_SUCCESS) init_error = cudaSuccess;
}

static cudaError_t to_runtime_error(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    default: return cudaErrorUnknown;
    }
}

/* Loads the driver once, then makes the primary context current here. */
static cudaError_t lazy_init(void) {
    pthread_once(&once, load_driver);
    if (init_error) return init_error;
    CUcontext cur = NULL;
    if (drv.CtxGetCurrent) drv.CtxGetCurrent(&cur);
    pthread_mutex_lock(&ctx_lock);
    CUresult r = CUDA_SUCCESS;
    if (!primary_ctx) r = drv.DevicePrimaryCtxRetain(&primary_ctx, 0);
    CUcontext want = primary_ctx;
    pthread_mutex_unlock(&ctx_lock);
    if (r) return to_runtime_error(r);
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
    __atomic_fetch_add(&malloc_calls, 1, __ATOMIC_RELAXED);
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
    return to_runtime_error(drv.MemAllocHost(ptr, size));
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

cudaError_t cudaDeviceReset(void) {
    INIT_OR_RETURN();
    pthread_mutex_lock(&ctx_lock);
    primary_ctx = NULL;
    pthread_mutex_unlock(&ctx_lock);
    return to_runtime_error(drv.DevicePrimaryCtxReset(0));
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus) {
    INIT_OR_RETURN();
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = drv.GetProcAddress(symbol, funcPtr, (int)cudaVersion, flags, &st);
    if (driverStatus) *driverStatus = (enum cudaDriverEntryPointQueryResult)st;
    return to_runtime_error(r);
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *driverStatus) {
    return cudaGetDriverEntryPointByVersion(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}
