/*
 * cudaleak's simulated CUDA driver, built as libcuda.so.1.
 *
 * It behaves like the real driver where cudaleak depends on it: device,
 * host and managed memory (backed by host memory, so addresses are real
 * and get reused after a free), contexts whose destruction frees their
 * memory, primary contexts with reference counts, the virtual memory
 * management calls (handles, reservations, mappings), error codes, and
 * cuGetProcAddress with versioned names. Programs and the simulated
 * runtime use it exactly as they would use the real libcuda.so.1.
 *
 * Environment:
 *   SIMCUDA_DEVICES    number of devices (default 1, at most 8)
 *   SIMCUDA_MAX_ALLOC  larger requests fail with CUDA_ERROR_OUT_OF_MEMORY
 *                      (default 64 GiB)
 *   SIMCUDA_DEVICE_BYTES  each device's memory: device memory, arrays and
 *                      cuMemCreate allocations that do not fit in what is
 *                      left fail with CUDA_ERROR_OUT_OF_MEMORY, and
 *                      cuMemGetInfo reports it (default: unlimited, and
 *                      cuMemGetInfo reports SIMCUDA_MAX_ALLOC as the total)
 *   SIMCUDA_BACKING    "malloc": one malloc/free per allocation, so that a
 *                      malloc tracker (heaptrack, memray) sees each one;
 *                      default: like the real driver, a freed block's
 *                      address is handed out again for the next request of
 *                      the same size.
 */
#define _GNU_SOURCE
#include "cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_DEVICES 8
#define VMM_GRANULARITY (2u << 20)

struct CUctx_st {
    int device;
    int primary;
    int active;
};

/* ---- a small open-addressing table: key 0 is empty, ~0 a tombstone ---- */

enum kind { K_DEVICE = 1, K_HOST, K_MANAGED, K_HANDLE, K_RESERVATION, K_MAPPING, K_ARRAY, K_MIPMAPPED,
           K_IMPORTED, K_POOL };

struct entry {
    uint64_t key;
    uint64_t size;
    uint64_t aux;   /* context, or the handle a mapping maps */
    int kind;
    int released;   /* handles: cuMemRelease seen */
    int maps;       /* handles: live mappings */
};

struct table {
    struct entry *e;
    size_t cap;
    size_t used; /* live + tombstones */
};

#define TOMBSTONE (~(uint64_t)0)

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static struct entry *table_find(struct table *t, uint64_t key) {
    if (!t->cap) return NULL;
    size_t mask = t->cap - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
        if (t->e[i].key == key) return &t->e[i];
        if (t->e[i].key == 0) return NULL;
    }
}

static int table_put(struct table *t, struct entry v);

static int table_grow(struct table *t) {
    struct table n = {0};
    n.cap = t->cap ? t->cap * 2 : 1024;
    n.e = calloc(n.cap, sizeof(struct entry));
    if (!n.e) return -1;
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i].key && t->e[i].key != TOMBSTONE) table_put(&n, t->e[i]);
    free(t->e);
    *t = n;
    return 0;
}

static int table_put(struct table *t, struct entry v) {
    if ((t->used + 1) * 2 > t->cap && table_grow(t)) return -1;
    size_t mask = t->cap - 1;
    for (size_t i = mix(v.key) & mask;; i = (i + 1) & mask) {
        if (t->e[i].key == 0 || t->e[i].key == TOMBSTONE) {
            if (t->e[i].key == 0) t->used++;
            t->e[i] = v;
            return 0;
        }
    }
}

static void table_erase(struct entry *e) { e->key = TOMBSTONE; }

/* ---- backing memory ---- */

/* Freed blocks by rounded size, linked through their first word: the next
 * allocation of that size gets the same address back, as from the real
 * driver. The lock is held. */
static struct table free_lists; /* key: rounded size, aux: head block */
static int plain_malloc;

static void *backing_alloc(size_t size) {
    size_t rounded = (size + 255) & ~(size_t)255;
    if (plain_malloc) return malloc(size);
    struct entry *e = table_find(&free_lists, rounded);
    if (e && e->aux) {
        void *p = (void *)(uintptr_t)e->aux;
        e->aux = *(uint64_t *)p;
        return p;
    }
    return aligned_alloc(256, rounded);
}

static void backing_free(void *p, size_t size) {
    size_t rounded = (size + 255) & ~(size_t)255;
    if (plain_malloc) {
        free(p);
        return;
    }
    struct entry *e = table_find(&free_lists, rounded);
    if (!e) {
        struct entry fresh = {.key = rounded, .aux = 0};
        if (table_put(&free_lists, fresh)) {
            free(p);
            return;
        }
        e = table_find(&free_lists, rounded);
    }
    *(uint64_t *)p = e->aux;
    e->aux = (uint64_t)(uintptr_t)p;
}

/* ---- state ---- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int device_count = 1;
static uint64_t max_alloc = 64ULL << 30;
static uint64_t device_bytes;             /* 0: unlimited */
static uint64_t device_used[MAX_DEVICES]; /* under the lock */
static __thread CUcontext current;
static struct CUctx_st primary[MAX_DEVICES];
static int primary_refs[MAX_DEVICES];
static struct table memory;       /* K_DEVICE, K_HOST, K_MANAGED by address */
static struct table handles;      /* K_HANDLE by handle */
static struct table reservations; /* K_RESERVATION by address */
static struct table mappings;     /* K_MAPPING by address */
static uint64_t next_handle = 0x1000;

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!initialized) {
        const char *d = getenv("SIMCUDA_DEVICES");
        if (d && atoi(d) > 0) device_count = atoi(d) > MAX_DEVICES ? MAX_DEVICES : atoi(d);
        const char *m = getenv("SIMCUDA_MAX_ALLOC");
        if (m && strtoull(m, NULL, 0) > 0) max_alloc = strtoull(m, NULL, 0);
        const char *cap = getenv("SIMCUDA_DEVICE_BYTES");
        if (cap && strtoull(cap, NULL, 0) > 0) device_bytes = strtoull(cap, NULL, 0);
        const char *b = getenv("SIMCUDA_BACKING");
        plain_malloc = b && !strcmp(b, "malloc");
        initialized = 1;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 12040;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

/* Device memory of a device (SIMCUDA_DEVICE_BYTES): kinds that live in it
 * take from it; a request that does not fit fails. The lock is held. */
static int uses_device_memory(int kind) {
    return kind == K_DEVICE || kind == K_ARRAY || kind == K_MIPMAPPED || kind == K_HANDLE;
}

static int device_take(int dev, int kind, uint64_t size) {
    if (!uses_device_memory(kind) || dev < 0 || dev >= MAX_DEVICES) return 0;
    if (device_bytes && (size > device_bytes || device_used[dev] > device_bytes - size)) return -1;
    device_used[dev] += size;
    return 0;
}

static void device_give(int dev, int kind, uint64_t size) {
    if (uses_device_memory(kind) && dev >= 0 && dev < MAX_DEVICES) device_used[dev] -= size;
}

/* Frees everything that belongs to ctx; the lock is held. */
static void release_context_memory(CUcontext ctx) {
    for (size_t i = 0; i < memory.cap; i++) {
        struct entry *e = &memory.e[i];
        if (e->key && e->key != TOMBSTONE && e->aux == (uint64_t)(uintptr_t)ctx) {
            device_give(ctx->device, e->kind, e->size);
            backing_free((void *)(uintptr_t)e->key, e->size);
            table_erase(e);
        }
    }
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    CUcontext c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->device = dev;
    c->active = 1;
    current = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    release_context_memory(ctx);
    pthread_mutex_unlock(&lock);
    if (current == ctx) current = NULL;
    free(ctx);
    return CUDA_SUCCESS;
}

/* SIMCUDA_NO_CTX_QUERIES builds a driver without cuCtxGetCurrent and
 * cuCtxGetDevice, as an old or partial driver may be: cudaleak must still
 * work on it, without paying a failed lookup per call (issue 11). */
#ifndef SIMCUDA_NO_CTX_QUERIES
CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = current;
    return CUDA_SUCCESS;
}
#endif

CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    current = ctx;
    return CUDA_SUCCESS;
}

#ifndef SIMCUDA_NO_CTX_QUERIES
CUresult cuCtxGetDevice(CUdevice *device) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    *device = current->device;
    return CUDA_SUCCESS;
}
#endif

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    primary[dev].device = dev;
    primary[dev].primary = 1;
    primary[dev].active = 1;
    primary_refs[dev]++;
    pthread_mutex_unlock(&lock);
    *pctx = &primary[dev];
    return CUDA_SUCCESS;
}

static CUresult primary_teardown(CUdevice dev, int reset) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    if (!reset && primary_refs[dev] == 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    primary_refs[dev] = reset ? 0 : primary_refs[dev] - 1;
    if (primary_refs[dev] == 0) {
        release_context_memory(&primary[dev]);
        primary[dev].active = 0;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_teardown(dev, 0); }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_teardown(dev, 1); }

/* ---- memory ---- */

static CUresult allocate(void **out, size_t size, int kind) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = current;
    if (!ctx || !ctx->active) return CUDA_ERROR_INVALID_CONTEXT;
    if (size > max_alloc) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (device_take(ctx->device, kind, size)) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *p = backing_alloc(size);
    struct entry e = {.key = (uint64_t)(uintptr_t)p, .size = size,
                      .aux = (uint64_t)(uintptr_t)ctx, .kind = kind};
    if (!p || table_put(&memory, e)) {
        if (p) backing_free(p, size);
        device_give(ctx->device, kind, size);
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    *out = p;
    return CUDA_SUCCESS;
}

/* Frees a block of `kind`; K_DEVICE also frees managed memory. */
static CUresult release(uint64_t addr, int kind) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!addr) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct entry *e = table_find(&memory, addr);
    if (!e || !(e->kind == kind || (kind == K_DEVICE && e->kind == K_MANAGED))) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    table_erase(e);
    device_give(((CUcontext)(uintptr_t)e->aux)->device, e->kind, e->size);
    backing_free((void *)(uintptr_t)addr, e->size);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    /* The 32-bit API of CUDA < 3.2 cannot hold a 64-bit address. */
    (void)dptr;
    (void)bytesize;
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    return allocate((void **)dptr, bytesize, K_DEVICE);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width_bytes, size_t height,
                            unsigned int element_size) {
    if (!pitch || width_bytes == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (element_size != 4 && element_size != 8 && element_size != 16)
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width_bytes + 511) & ~(size_t)511;
    CUresult r = allocate((void **)dptr, p * height, K_DEVICE);
    if (r == CUDA_SUCCESS) *pitch = p;
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    (void)flags;
    return allocate((void **)dptr, bytesize, K_MANAGED);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    (void)stream;
    return allocate((void **)dptr, bytesize, K_DEVICE);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    return cuMemAllocAsync(dptr, bytesize, stream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream) {
    (void)pool;
    return cuMemAllocAsync(dptr, bytesize, stream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream) {
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return allocate(pp, bytesize, K_HOST); }

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    if (flags & ~0xfu) return CUDA_ERROR_INVALID_VALUE;
    return allocate(pp, bytesize, K_HOST);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(dptr, K_DEVICE); }
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    (void)stream;
    return release(dptr, K_DEVICE);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    return cuMemFreeAsync(dptr, stream);
}
CUresult cuMemFreeHost(void *p) { return release((uint64_t)(uintptr_t)p, K_HOST); }

/* ---- CUDA arrays: the handle is the address of the array's memory ---- */

static size_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static size_t at_least_1(size_t v) { return v ? v : 1; }

static CUresult create_array(void **out, size_t w, size_t h, size_t d, CUarray_format f,
                             unsigned int channels, unsigned int levels, int kind) {
    size_t elem = format_bytes(f) * channels;
    if (!out || !w || !elem || (channels != 1 && channels != 2 && channels != 4) || !levels)
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0;
    for (unsigned int l = 0; l < levels; l++) {
        bytes += w * at_least_1(h) * at_least_1(d) * elem;
        w = at_least_1(w / 2), h /= 2, d /= 2;
    }
    return allocate(out, bytes, kind);
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *a) {
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    return create_array((void **)pHandle, a->Width, a->Height, 0, a->Format, a->NumChannels, 1,
                        K_ARRAY);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a) {
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    return create_array((void **)pHandle, a->Width, a->Height, a->Depth, a->Format,
                        a->NumChannels, 1, K_ARRAY);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a,
                                unsigned int levels) {
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    return create_array((void **)pHandle, a->Width, a->Height, a->Depth, a->Format,
                        a->NumChannels, levels, K_MIPMAPPED);
}

CUresult cuArrayDestroy(CUarray a) { return release((uint64_t)(uintptr_t)a, K_ARRAY); }
CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    return release((uint64_t)(uintptr_t)a, K_MIPMAPPED);
}

/* ---- memory shared between processes ----
 * The simulation lets a process open its own handles (the real driver
 * refuses that, and tests have one process): opening maps a new block of
 * the exported block's size, as a second process would see it. */

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct entry *e = table_find(&memory, dptr);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (e && e->kind != K_POOL) {
        if (pbase) *pbase = e->key;
        if (psize) *psize = e->size;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    size_t size = 0;
    CUresult r = cuMemGetAddressRange_v2(NULL, &size, dptr);
    if (r || !pHandle) return r ? r : CUDA_ERROR_INVALID_VALUE;
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &dptr, sizeof dptr);
    memcpy(pHandle->reserved + 8, &size, sizeof size);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    size_t size;
    (void)flags;
    memcpy(&size, handle.reserved + 8, sizeof size);
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    return allocate((void **)pdptr, size, K_IMPORTED);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) { return release(dptr, K_IMPORTED); }

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type, unsigned long long flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!shareableHandle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int live = table_find(&handles, handle) != NULL;
    pthread_mutex_unlock(&lock);
    if (!live) return CUDA_ERROR_INVALID_VALUE;
    *(int *)shareableHandle = (int)handle; /* the "file descriptor" */
    return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType type) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct entry *src = table_find(&handles, (uint64_t)(uintptr_t)osHandle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (src) {
        struct entry e = {.key = next_handle++, .size = src->size, .kind = K_HANDLE};
        if (table_put(&handles, e) == 0) {
            *handle = e.key;
            r = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- stream-ordered memory pools: a pool is a small block of its own ---- */

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    if (!props) return CUDA_ERROR_INVALID_VALUE;
    return allocate((void **)pool, 64, K_POOL);
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) { return release((uint64_t)(uintptr_t)pool, K_POOL); }

/* ---- virtual memory management ---- */

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       int option) {
    (void)option;
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

/* A physical allocation gone: its device memory is free again (imported
 * handles, aux 0, took none). The lock is held. */
static void handle_erase(struct entry *h) {
    if (h->aux) device_give((int)(h->aux - 1), K_HANDLE, h->size);
    table_erase(h);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || !prop || flags || size == 0 || size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    if (size > max_alloc) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (device_take(prop->location.id, K_HANDLE, size)) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* aux: the device + 1, whose memory the handle takes */
    struct entry e = {.key = next_handle++, .size = size, .kind = K_HANDLE,
                      .aux = (uint64_t)prop->location.id + 1};
    int failed = table_put(&handles, e);
    if (failed) device_give(prop->location.id, K_HANDLE, size);
    pthread_mutex_unlock(&lock);
    if (failed) return CUDA_ERROR_OUT_OF_MEMORY;
    *handle = e.key;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct entry *e = table_find(&handles, handle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (e && !e->released) {
        e->released = 1;
        if (e->maps == 0) handle_erase(e);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)alignment;
    (void)addr;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || flags || size == 0 || size % VMM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    struct entry e = {.key = (uint64_t)(uintptr_t)p, .size = size, .kind = K_RESERVATION};
    table_put(&reservations, e);
    pthread_mutex_unlock(&lock);
    *ptr = e.key;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct entry *e = table_find(&reservations, ptr);
    if (!e || e->size != size) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    table_erase(e);
    pthread_mutex_unlock(&lock);
    munmap((void *)(uintptr_t)ptr, size);
    return CUDA_SUCCESS;
}

static int inside_reservation(uint64_t ptr, uint64_t size) {
    for (size_t i = 0; i < reservations.cap; i++) {
        struct entry *r = &reservations.e[i];
        if (r->key && r->key != TOMBSTONE && ptr >= r->key && ptr + size <= r->key + r->size)
            return 1;
    }
    return 0;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (flags || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct entry *h = table_find(&handles, handle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (h && !h->released && offset + size <= h->size && inside_reservation(ptr, size) &&
        !table_find(&mappings, ptr)) {
        struct entry m = {.key = ptr, .size = size, .aux = handle, .kind = K_MAPPING};
        if (table_put(&mappings, m) == 0) {
            h->maps++;
            r = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int found = 0;
    for (size_t i = 0; i < mappings.cap; i++) {
        struct entry *m = &mappings.e[i];
        if (!m->key || m->key == TOMBSTONE || m->key < ptr || m->key + m->size > ptr + size)
            continue;
        struct entry *h = table_find(&handles, m->aux);
        if (h && --h->maps == 0 && h->released) handle_erase(h);
        table_erase(m);
        found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- how much device memory is left ---- */

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx = current;
    if (!ctx || !ctx->active) return CUDA_ERROR_INVALID_CONTEXT;
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    uint64_t total = device_bytes ? device_bytes : max_alloc;
    uint64_t used = device_used[ctx->device];
    pthread_mutex_unlock(&lock);
    *total_bytes = total;
    *free_bytes = used < total ? total - used : 0;
    return CUDA_SUCCESS;
}

/* The API of CUDA < 3.2, with 32-bit sizes. */
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r) return r;
    *free_bytes = f > 0xffffffffu ? 0xffffffffu : (unsigned int)f;
    *total_bytes = t > 0xffffffffu ? 0xffffffffu : (unsigned int)t;
    return CUDA_SUCCESS;
}

/* ---- entry points ---- */

CUresult cuGetErrorName(CUresult error, const char **pstr) {
    static const struct { CUresult code; const char *name; } names[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
    };
    if (!pstr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == error) {
            *pstr = names[i].name;
            return CUDA_SUCCESS;
        }
    *pstr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

#define SYM(f) {#f, (void *)f}
static const struct { const char *name; void *fn; } symbols[] = {
    SYM(cuInit), SYM(cuDriverGetVersion), SYM(cuDeviceGet), SYM(cuDeviceGetCount),
    SYM(cuCtxCreate_v2), SYM(cuCtxDestroy_v2), SYM(cuCtxSetCurrent),
#ifndef SIMCUDA_NO_CTX_QUERIES
    SYM(cuCtxGetCurrent), SYM(cuCtxGetDevice),
#endif
    SYM(cuDevicePrimaryCtxRetain), SYM(cuDevicePrimaryCtxRelease_v2),
    SYM(cuDevicePrimaryCtxReset_v2), SYM(cuMemAlloc), SYM(cuMemAlloc_v2),
    SYM(cuMemAllocPitch_v2), SYM(cuMemAllocManaged), SYM(cuMemAllocAsync),
    SYM(cuMemAllocAsync_ptsz), SYM(cuMemAllocFromPoolAsync), SYM(cuMemAllocFromPoolAsync_ptsz),
    SYM(cuMemAllocHost_v2), SYM(cuMemHostAlloc), SYM(cuMemFree_v2), SYM(cuMemFreeAsync),
    SYM(cuMemFreeAsync_ptsz), SYM(cuMemFreeHost), SYM(cuMemCreate), SYM(cuMemRelease),
    SYM(cuMemMap), SYM(cuMemUnmap), SYM(cuMemAddressReserve), SYM(cuMemAddressFree),
    SYM(cuMemGetAllocationGranularity), SYM(cuGetProcAddress), SYM(cuGetProcAddress_v2),
    SYM(cuArrayCreate_v2), SYM(cuArray3DCreate_v2), SYM(cuArrayDestroy),
    SYM(cuMipmappedArrayCreate), SYM(cuMipmappedArrayDestroy),
    SYM(cuMemGetAddressRange_v2), SYM(cuIpcGetMemHandle), SYM(cuIpcOpenMemHandle_v2),
    SYM(cuIpcCloseMemHandle), SYM(cuMemExportToShareableHandle),
    SYM(cuMemImportFromShareableHandle), SYM(cuMemPoolCreate), SYM(cuMemPoolDestroy),
    SYM(cuGetErrorName), SYM(cuMemGetInfo), SYM(cuMemGetInfo_v2),
};

/* Which versioned symbol a base name means at a given CUDA version, as the
 * driver's cuGetProcAddress resolves it ("cuMemAlloc" at >= 3020 is
 * cuMemAlloc_v2), and the per-thread-default-stream variants. */
static const struct { const char *base; int since; const char *suffix; } versions[] = {
    {"cuMemAlloc", 3020, "_v2"},
    {"cuMemAllocPitch", 3020, "_v2"},
    {"cuMemFree", 3020, "_v2"},
    {"cuMemAllocHost", 3020, "_v2"},
    {"cuCtxCreate", 3020, "_v2"},
    {"cuCtxDestroy", 4000, "_v2"},
    {"cuDevicePrimaryCtxRelease", 11000, "_v2"},
    {"cuDevicePrimaryCtxReset", 11000, "_v2"},
    {"cuGetProcAddress", 12000, "_v2"},
    {"cuArrayCreate", 3020, "_v2"},
    {"cuIpcOpenMemHandle", 11000, "_v2"},
    {"cuMemGetAddressRange", 3020, "_v2"},
    {"cuArray3DCreate", 3020, "_v2"},
    {"cuMemGetInfo", 3020, "_v2"},
};
static const char *per_thread[] = {"cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync"};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    char name[128];
    if (strlen(symbol) > 100) return CUDA_ERROR_INVALID_VALUE;
    strcpy(name, symbol);
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++)
        if (!strcmp(symbol, versions[i].base) && cudaVersion >= versions[i].since)
            strcat(name, versions[i].suffix);
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        for (size_t i = 0; i < sizeof per_thread / sizeof per_thread[0]; i++)
            if (!strcmp(symbol, per_thread[i])) strcat(name, "_ptsz");
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++)
        if (!strcmp(name, symbols[i].name)) {
            *pfn = symbols[i].fn;
            if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    *pfn = NULL;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
