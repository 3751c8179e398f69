/*
 * cudaleak's simulated CUDA driver, built as libcuda.so.1.
 *
 * It behaves like the real driver where cudaleak depends on it: device,
 * host and managed memory (backed by host memory, so addresses are real
 * and get reused after a free), contexts whose destruction frees their
 * memory, primary contexts with reference counts, the virtual memory
 * management calls (handles, reservations, mappings), streams, stream
 * capture and graphs with memory nodes, error codes, and
 * cuGetProcAddress with versioned names as NVIDIA's driver resolves them
 * (driver_entry_points.h), v1 entry points included. Programs and the
 * simulated runtime use it exactly as they would use the real libcuda.so.1.
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
 *                      "threaded": for benchmarks of many threads only:
 *                      cuMemAlloc and cuMemFree take no lock and keep no
 *                      table (each block carries its context in a header
 *                      before it), so that what scales or not is what is
 *                      preloaded, not the simulation. Blocks allocated so are
 *                      not freed with their context and cuMemGetInfo does
 *                      not count them.
 *   SIMCUDA_ALLOC_SLEEP_US  device-memory allocations (cuMemAlloc_v2 and
 *                      what shares its path: pitched, async, from a pool)
 *                      sleep this many microseconds inside the call, after
 *                      the block is allocated and the driver's lock is let
 *                      go: a program that loops on cudaMalloc/cudaFree then
 *                      spends nearly all its time inside a hook, where the
 *                      tests of the ways a process ends (tests/endings.rs)
 *                      land their signals (default 0: no sleep)
 *   SIMCUDA_ALLOC_TESTCANCEL  "1": the same allocations call
 *                      pthread_testcancel() at that point, so that a pending
 *                      cancellation of the allocating thread acts inside the
 *                      driver call, as one in the real driver (a cancellation
 *                      point such as an ioctl or a futex wait) would; the
 *                      thread unwinds from inside the call through every
 *                      caller, the hooks of a preloaded library included
 *   SIMCUDA_SIGNAL_SAFE  "1": device allocations and frees block every
 *                      signal while they hold the driver's lock (and call
 *                      malloc under it), so that a program's signal handler
 *                      may call cudaMalloc while its thread is inside one:
 *                      what the handler then meets is the preloaded
 *                      library's doing, not the simulation's
 *                      (tests/endings.rs, an allocating SIGALRM handler)
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "driver_entry_points.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* The entry points call each other, and cuGetProcAddress hands them out,
 * directly, as NVIDIA's driver does, never through whatever another
 * library in the process (a preloaded one, a wrapper installed as
 * libcuda.so.1) exports under the same name: through `f_local`, a hidden
 * alias of each entry point `f` (what glibc does; a linker flag would do
 * too, but zig's linker, which builds the wheel's copy, takes no
 * -Bsymbolic-functions). */
#define LOCAL(sym, ...) \
    extern __typeof__(sym) sym##_local __attribute__((alias(#sym), visibility("hidden")));
#define NO_LOCAL(...)
SIMCUDA_ENTRY_POINTS(LOCAL, NO_LOCAL)
SIMCUDA_LOOKUP_ENTRY_POINTS(LOCAL, NO_LOCAL)

#define MAX_DEVICES 8
#define VMM_GRANULARITY (2u << 20)

struct CUctx_st {
    int device;
    int primary;
    int active;
    int usage; /* cuCtxCreate: 1, +1 per cuCtxAttach; cuCtxDetach to 0 destroys */
    /* a green context's CUcontext (cuCtxFromGreenCtx): the primary context
     * whose memory it allocates */
    struct CUctx_st *owner;
};

/* ---- a small open-addressing table: key 0 is empty, ~0 a tombstone ---- */

enum kind { K_DEVICE = 1, K_HOST, K_MANAGED, K_HANDLE, K_RESERVATION, K_MAPPING, K_ARRAY, K_MIPMAPPED,
           K_IMPORTED, K_POOL, K_POOL_IMPORT, K_EXT_BUFFER, K_REGISTERED, K_MULTICAST,
           K_GRAPH /* a graph allocation a launch made live, at its node's address */ };

struct entry {
    uint64_t key;
    uint64_t size;
    uint64_t aux;   /* context, the handle a mapping maps, or a handle's device */
    int kind;
    int refs;       /* handles: references (cuMemCreate 1, +1 per retain); 0 once released */
    int maps;       /* handles: live mappings and multicast binds */
    int low;        /* memory: a v1 (32-bit) allocation, mmap'ed below 4 GiB */
    int takes_device; /* handles: cuMemCreate's, which take device memory (SIMCUDA_DEVICE_BYTES) */
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
/* SIMCUDA_BACKING=threaded: device blocks from malloc, each behind a
 * header, no lock and no table (benchmarks of threads only). */
static int threaded_backing;
#define THREADED_MAGIC 0x5349544852454144ull /* "SITHREAD" */
struct threaded_header {
    uint64_t magic;
    CUcontext ctx;
    uint64_t size;
    uint64_t pad[5]; /* the block stays 64-byte aligned after the header */
};

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
static unsigned long alloc_sleep_us;      /* SIMCUDA_ALLOC_SLEEP_US */
static int alloc_testcancel;              /* SIMCUDA_ALLOC_TESTCANCEL */
static int signal_safe;                   /* SIMCUDA_SIGNAL_SAFE */
static uint64_t device_used[MAX_DEVICES]; /* under the lock */
static __thread CUcontext current;
static struct CUctx_st primary[MAX_DEVICES];
static int primary_refs[MAX_DEVICES];
static struct table memory;       /* K_DEVICE, K_HOST, K_MANAGED by address */
static struct table handles;      /* K_HANDLE by handle */
static struct table reservations; /* K_RESERVATION by address */
static struct table mappings;     /* K_MAPPING by address */
/* The addresses of graph allocation nodes, each fixed for its graph's
 * lifetime: key the address, refs its holders (the graph, each executable
 * graph instantiated from it, a live allocation at it); unmapped at 0. */
static struct table graph_memory;
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
        threaded_backing = b && !strcmp(b, "threaded");
        const char *sl = getenv("SIMCUDA_ALLOC_SLEEP_US");
        if (sl) alloc_sleep_us = strtoul(sl, NULL, 0);
        const char *tc = getenv("SIMCUDA_ALLOC_TESTCANCEL");
        alloc_testcancel = tc && !strcmp(tc, "1");
        const char *ss = getenv("SIMCUDA_SIGNAL_SAFE");
        signal_safe = ss && !strcmp(ss, "1");
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
    return kind == K_DEVICE || kind == K_ARRAY || kind == K_MIPMAPPED || kind == K_HANDLE ||
           kind == K_GRAPH;
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

/* One holder more (delta 1) or less (-1) of a graph allocation node's
 * address; the lock is held. The last one gone unmaps it. */
static void graph_memory_ref(uint64_t addr, int delta) {
    struct entry *e = table_find(&graph_memory, addr);
    if (!e) return;
    e->refs += delta;
    if (e->refs == 0) {
        munmap((void *)(uintptr_t)e->key, e->size);
        table_erase(e);
    }
}

/* Gives back the memory of a block of `memory` and erases it; the lock
 * is held. A registration's memory is the program's own; a graph
 * allocation's address stays its node's. */
static void free_entry(struct entry *e) {
    if (uses_device_memory(e->kind) && e->aux)
        device_give(((CUcontext)(uintptr_t)e->aux)->device, e->kind, e->size);
    if (e->low)
        munmap((void *)(uintptr_t)e->key, e->size);
    else if (e->kind == K_GRAPH)
        graph_memory_ref(e->key, -1);
    else if (e->kind != K_REGISTERED)
        backing_free((void *)(uintptr_t)e->key, e->size);
    table_erase(e);
}

/* Frees everything that belongs to ctx; the lock is held. */
static void release_context_memory(CUcontext ctx) {
    for (size_t i = 0; i < memory.cap; i++) {
        struct entry *e = &memory.e[i];
        if (e->key && e->key != TOMBSTONE && e->aux == (uint64_t)(uintptr_t)ctx) free_entry(e);
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
    c->usage = 1;
    current = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return cuCtxCreate_v2_local(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx || ctx->primary || ctx->owner) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    release_context_memory(ctx);
    pthread_mutex_unlock(&lock);
    if (current == ctx) current = NULL;
    free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2_local(ctx); }

/* The usage count of CUDA 2.0: cuCtxAttach counts one more user of the
 * current context, cuCtxDetach one less, and the last one destroys it. */
CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx || flags) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = current;
    if (!c || c->primary || c->owner) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    c->usage++;
    pthread_mutex_unlock(&lock);
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxDetach(CUcontext ctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx || ctx->primary || ctx->owner) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    int last = --ctx->usage == 0;
    pthread_mutex_unlock(&lock);
    return last ? cuCtxDestroy_v2_local(ctx) : CUDA_SUCCESS;
}

/* SIMCUDA_NO_CTX_QUERIES builds a driver without cuCtxGetCurrent and
 * cuCtxGetDevice, as an old or partial driver may be: cudaleak must still
 * work on it, without paying a failed lookup per call (docs/decisions.md,
 * "A driver without context queries pays no failed lookup per call"). */
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

/* One more reference to dev's primary context; the lock is held. */
static void primary_retain(CUdevice dev) {
    primary[dev].device = dev;
    primary[dev].primary = 1;
    primary[dev].active = 1;
    primary_refs[dev]++;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    primary_retain(dev);
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
/* CUDA 7.0's entry points, which NVIDIA's runtime still asks for (at 7000):
 * the same calls. */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_teardown(dev, 0); }
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return primary_teardown(dev, 1); }

/* ---- green contexts (CUDA 12.4) ----
 * As NVIDIA documents them: creating one retains the device's primary
 * context and destroying it releases that reference; its CUcontext
 * (cuCtxFromGreenCtx) is "a normal primary context but with the resources
 * of the green context": memory allocated while it is current belongs to
 * the primary context and lives until that one is destroyed. */

struct CUgreenCtx_st {
    struct CUctx_st ctx;
    struct CUgreenCtx_st *next;
};
static struct CUgreenCtx_st *greens; /* live ones */

CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                          unsigned int flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phCtx || !desc || !(flags & CU_GREEN_CTX_DEFAULT_STREAM)) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    CUgreenCtx g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    primary_retain(dev);
    g->ctx.device = dev;
    g->ctx.active = 1;
    g->ctx.owner = &primary[dev];
    g->next = greens;
    greens = g;
    pthread_mutex_unlock(&lock);
    *phCtx = g;
    return CUDA_SUCCESS;
}

/* Whether g is a live green context; the lock is held. Unlinks it when
 * `unlink` is set. */
static int green_live(CUgreenCtx g, int unlink) {
    for (CUgreenCtx *at = &greens; *at; at = &(*at)->next)
        if (*at == g) {
            if (unlink) *at = g->next;
            return 1;
        }
    return 0;
}

CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int live = hCtx && green_live(hCtx, 1);
    pthread_mutex_unlock(&lock);
    if (!live) return CUDA_ERROR_INVALID_CONTEXT;
    if (current == &hCtx->ctx) current = NULL;
    CUdevice dev = hCtx->ctx.device;
    free(hCtx);
    return primary_teardown(dev, 0);
}

CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pContext) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int live = hCtx && green_live(hCtx, 0);
    pthread_mutex_unlock(&lock);
    if (!live) return CUDA_ERROR_INVALID_CONTEXT;
    *pContext = &hCtx->ctx;
    return CUDA_SUCCESS;
}

/* ---- memory ---- */

/* The context that owns memory allocated while `ctx` is current (a green
 * context's primary context), or NULL when there is none to allocate in. */
static CUcontext owning_context(CUcontext ctx) {
    if (ctx && ctx->owner) ctx = ctx->owner;
    return ctx && ctx->active ? ctx : NULL;
}

/* SIMCUDA_SIGNAL_SAFE: the driver's lock, taken with every signal blocked
 * (allocate() and release() only), so that a signal handler that calls
 * cudaMalloc never waits for a lock (or glibc's malloc) its own thread
 * holds. */
static void lock_signal_safe(sigset_t *old) {
    if (signal_safe) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, old);
    }
    pthread_mutex_lock(&lock);
}

static void unlock_signal_safe(const sigset_t *old) {
    pthread_mutex_unlock(&lock);
    if (signal_safe) pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* A device allocation that has its block, on its way back to the caller:
 * SIMCUDA_ALLOC_SLEEP_US and SIMCUDA_ALLOC_TESTCANCEL act here, with no
 * lock of the driver's held. */
static void allocation_in_flight(int kind) {
    if (kind != K_DEVICE) return;
    if (alloc_sleep_us) {
        struct timespec t = {(time_t)(alloc_sleep_us / 1000000), (long)(alloc_sleep_us % 1000000) * 1000L};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {
        }
    }
    if (alloc_testcancel) pthread_testcancel();
}

static CUresult allocate(void **out, size_t size, int kind) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = owning_context(current);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (size > max_alloc) return CUDA_ERROR_OUT_OF_MEMORY;
    if (threaded_backing && kind == K_DEVICE) {
        struct threaded_header *h = malloc(sizeof *h + size);
        if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
        *h = (struct threaded_header){.magic = THREADED_MAGIC, .ctx = ctx, .size = size};
        *out = h + 1;
        allocation_in_flight(kind);
        return CUDA_SUCCESS;
    }
    sigset_t mask;
    lock_signal_safe(&mask);
    if (device_take(ctx->device, kind, size)) {
        unlock_signal_safe(&mask);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *p = backing_alloc(size);
    struct entry e = {.key = (uint64_t)(uintptr_t)p, .size = size,
                      .aux = (uint64_t)(uintptr_t)ctx, .kind = kind};
    if (!p || table_put(&memory, e)) {
        if (p) backing_free(p, size);
        device_give(ctx->device, kind, size);
        unlock_signal_safe(&mask);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    unlock_signal_safe(&mask);
    *out = p;
    allocation_in_flight(kind);
    return CUDA_SUCCESS;
}

/* Whether cuMemFree(Async) frees a block of `kind`: device and managed
 * memory, memory imported from another process's pool, and buffers
 * mapped from external memory (NVIDIA documents cuMemFree for each). */
static int freed_as_device(int kind) {
    return kind == K_DEVICE || kind == K_MANAGED || kind == K_POOL_IMPORT || kind == K_EXT_BUFFER ||
           kind == K_GRAPH;
}

/* Frees a block of `kind`; K_DEVICE: whatever cuMemFree frees. */
static CUresult release(uint64_t addr, int kind) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!addr) return CUDA_ERROR_INVALID_VALUE;
    if (threaded_backing && kind == K_DEVICE) {
        struct threaded_header *h = (struct threaded_header *)(uintptr_t)addr - 1;
        if (h->magic != THREADED_MAGIC) return CUDA_ERROR_INVALID_VALUE;
        h->magic = 0;
        free(h);
        return CUDA_SUCCESS;
    }
    sigset_t mask;
    lock_signal_safe(&mask);
    struct entry *e = table_find(&memory, addr);
    if (!e || !(e->kind == kind || (kind == K_DEVICE && freed_as_device(e->kind)))) {
        unlock_signal_safe(&mask);
        return CUDA_ERROR_INVALID_VALUE;
    }
    free_entry(e);
    unlock_signal_safe(&mask);
    return CUDA_SUCCESS;
}

/* ---- the 32-bit entry points of CUDA < 3.2 ----
 * Their device pointers are 32 bits wide. Whether NVIDIA's driver ever
 * succeeds with them in a 64-bit process is not documented; the simulation
 * succeeds whenever it can place the block below 4 GiB (MAP_32BIT, x86-64),
 * so that what a hook does with a successful v1 call is tested, and
 * returns CUDA_ERROR_NOT_SUPPORTED elsewhere. */
static CUresult allocate_low(CUdeviceptr_v1 *out, size_t size) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = owning_context(current);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (size > max_alloc) return CUDA_ERROR_OUT_OF_MEMORY;
#if defined(MAP_32BIT)
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    if ((uint64_t)(uintptr_t)p + size > UINT32_MAX) {
        munmap(p, size);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&lock);
    struct entry e = {.key = (uint64_t)(uintptr_t)p, .size = size,
                      .aux = (uint64_t)(uintptr_t)ctx, .kind = K_DEVICE, .low = 1};
    int failed = device_take(ctx->device, K_DEVICE, size);
    if (!failed) {
        failed = table_put(&memory, e);
        if (failed) device_give(ctx->device, K_DEVICE, size);
    }
    pthread_mutex_unlock(&lock);
    if (failed) {
        munmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr_v1)(uintptr_t)p;
    return CUDA_SUCCESS;
#else
    return CUDA_ERROR_NOT_SUPPORTED;
#endif
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    return allocate_low(dptr, bytesize);
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width_bytes,
                         unsigned int height, unsigned int element_size) {
    if (!pitch || width_bytes == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (element_size != 4 && element_size != 8 && element_size != 16)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned int p = (width_bytes + 511) & ~511u;
    CUresult r = allocate_low(dptr, (size_t)p * height);
    if (r == CUDA_SUCCESS) *pitch = p;
    return r;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr) { return release(dptr, K_DEVICE); }

CUresult cuMemAllocHost(void **pp, unsigned int bytesize) { return allocate(pp, bytesize, K_HOST); }

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

static int captured_alloc(CUdeviceptr *dptr, size_t size, CUstream h, int per_thread,
                          CUresult *r);
static int captured_free(CUdeviceptr dptr, CUstream h, int per_thread, CUresult *r);

/* Stream-ordered allocation: on a capturing stream, a node of the graph
 * being captured instead (per_thread: stream 0 is the thread's own). */
static CUresult allocate_async(CUdeviceptr *dptr, size_t bytesize, CUstream stream,
                               int per_thread) {
    CUresult r;
    if (captured_alloc(dptr, bytesize, stream, per_thread, &r)) return r;
    return allocate((void **)dptr, bytesize, K_DEVICE);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    return allocate_async(dptr, bytesize, stream, 0);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    return allocate_async(dptr, bytesize, stream, 1);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream) {
    (void)pool;
    return allocate_async(dptr, bytesize, stream, 0);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream) {
    (void)pool;
    return allocate_async(dptr, bytesize, stream, 1);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return allocate(pp, bytesize, K_HOST); }

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    if (flags & ~0xfu) return CUDA_ERROR_INVALID_VALUE;
    return allocate(pp, bytesize, K_HOST);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(dptr, K_DEVICE); }
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    CUresult r;
    if (captured_free(dptr, stream, 0, &r)) return r;
    return release(dptr, K_DEVICE);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    CUresult r;
    if (captured_free(dptr, stream, 1, &r)) return r;
    return release(dptr, K_DEVICE);
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

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *a) {
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    return create_array((void **)pHandle, a->Width, a->Height, 0, a->Format, a->NumChannels, 1,
                        K_ARRAY);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *a) {
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    return create_array((void **)pHandle, a->Width, a->Height, a->Depth, a->Format,
                        a->NumChannels, 1, K_ARRAY);
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
    CUresult r = cuMemGetAddressRange_v2_local(NULL, &size, dptr);
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

/* CUDA 4.1's entry point, which NVIDIA's runtime asks for at 4010 besides
 * the _v2 at 11000: the same call here. */
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    return cuIpcOpenMemHandle_v2_local(pdptr, handle, flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) { return release(dptr, K_IMPORTED); }

/* Memory exported from a pool: the "export data" carries the address and
 * size; importing maps a new block of that size, freed with cuMemFree. */
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr) {
    size_t size = 0;
    CUresult r = cuMemGetAddressRange_v2_local(NULL, &size, ptr);
    if (r || !shareData_out) return r ? r : CUDA_ERROR_INVALID_VALUE;
    memset(shareData_out, 0, sizeof *shareData_out);
    memcpy(shareData_out->reserved, &ptr, sizeof ptr);
    memcpy(shareData_out->reserved + 8, &size, sizeof size);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                CUmemPoolPtrExportData *shareData) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!shareData || !pool) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct entry *p = table_find(&memory, (uint64_t)(uintptr_t)pool);
    int is_pool = p && p->kind == K_POOL;
    pthread_mutex_unlock(&lock);
    size_t size;
    memcpy(&size, shareData->reserved + 8, sizeof size);
    if (!is_pool || !size) return CUDA_ERROR_INVALID_VALUE;
    return allocate((void **)ptr_out, size, K_POOL_IMPORT);
}

/* ---- external memory: an imported object, and what is mapped from it ---- */

struct CUextMemory_st {
    unsigned long long size;
    struct CUextMemory_st *next;
};
static struct CUextMemory_st *externals; /* live ones */

/* Whether m is live; the lock is held. Unlinks it when `unlink` is set. */
static int external_live(CUexternalMemory m, int unlink) {
    for (CUexternalMemory *at = &externals; *at; at = &(*at)->next)
        if (*at == m) {
            if (unlink) *at = m->next;
            return 1;
        }
    return 0;
}

CUresult cuImportExternalMemory(CUexternalMemory *extMem_out,
                                const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!extMem_out || !desc || !desc->size || desc->type != CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD)
        return CUDA_ERROR_INVALID_VALUE;
    CUexternalMemory m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    m->size = desc->size;
    pthread_mutex_lock(&lock);
    m->next = externals;
    externals = m;
    pthread_mutex_unlock(&lock);
    *extMem_out = m;
    return CUDA_SUCCESS;
}

CUresult cuDestroyExternalMemory(CUexternalMemory extMem) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int live = extMem && external_live(extMem, 1);
    pthread_mutex_unlock(&lock);
    if (!live) return CUDA_ERROR_INVALID_VALUE;
    free(extMem);
    return CUDA_SUCCESS;
}

/* The mapped size of extMem, or 0 when it is not live. */
static unsigned long long external_size(CUexternalMemory extMem) {
    pthread_mutex_lock(&lock);
    unsigned long long size = extMem && external_live(extMem, 0) ? extMem->size : 0;
    pthread_mutex_unlock(&lock);
    return size;
}

CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *devPtr, CUexternalMemory extMem,
                                         const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *desc) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    unsigned long long size = external_size(extMem);
    if (!desc || !size || !desc->size || desc->offset + desc->size > size)
        return CUDA_ERROR_INVALID_VALUE;
    return allocate((void **)devPtr, desc->size, K_EXT_BUFFER);
}

CUresult cuExternalMemoryGetMappedMipmappedArray(
    CUmipmappedArray *mipmap, CUexternalMemory extMem,
    const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC *desc) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!desc || !external_size(extMem)) return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *a = &desc->arrayDesc;
    return create_array((void **)mipmap, a->Width, a->Height, a->Depth, a->Format, a->NumChannels,
                        desc->numLevels, K_MIPMAPPED);
}

/* ---- page-locked host memory the program allocated itself ---- */

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || !bytesize || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = owning_context(current);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    CUresult r = CUDA_SUCCESS;
    if (table_find(&memory, (uint64_t)(uintptr_t)p)) {
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    } else {
        struct entry e = {.key = (uint64_t)(uintptr_t)p, .size = bytesize,
                          .aux = (uint64_t)(uintptr_t)ctx, .kind = K_REGISTERED};
        if (table_put(&memory, e)) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* CUDA 4.0's entry point (6.5 added flags): the same call here. */
CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int flags) {
    return cuMemHostRegister_v2_local(p, bytesize, flags);
}

CUresult cuMemHostUnregister(void *p) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct entry *e = p ? table_find(&memory, (uint64_t)(uintptr_t)p) : NULL;
    CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (e && e->kind == K_REGISTERED) {
        free_entry(e);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

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
        struct entry e = {.key = next_handle++, .size = src->size, .aux = src->aux,
                          .kind = K_HANDLE, .refs = 1};
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

/* A pool shared with another process: the "file descriptor" is the pool's
 * address; importing makes a pool of this process, destroyed on its own. */
CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                          CUmemAllocationHandleType type, unsigned long long flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle_out || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct entry *p = table_find(&memory, (uint64_t)(uintptr_t)pool);
    int is_pool = p && p->kind == K_POOL;
    pthread_mutex_unlock(&lock);
    if (!is_pool) return CUDA_ERROR_INVALID_VALUE;
    *(uint64_t *)handle_out = (uint64_t)(uintptr_t)pool;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                            CUmemAllocationHandleType type,
                                            unsigned long long flags) {
    if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags)
        return CUDA_ERROR_INVALID_VALUE;
    return allocate((void **)pool_out, 64, K_POOL);
}

/* ---- virtual memory management ---- */

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       int option) {
    (void)option;
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
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
    struct entry e = {.key = next_handle++, .size = size, .aux = (uint64_t)prop->location.id,
                      .kind = K_HANDLE, .refs = 1, .takes_device = 1};
    int failed = table_put(&handles, e);
    if (failed) device_give(prop->location.id, K_HANDLE, size);
    pthread_mutex_unlock(&lock);
    if (failed) return CUDA_ERROR_OUT_OF_MEMORY;
    *handle = e.key;
    return CUDA_SUCCESS;
}

/* Multicast binds: memory handle `mem` is bound to multicast object `mc`
 * at `offset` for device `dev`. A bind keeps the memory alive, as a
 * mapping does. */
struct bind {
    uint64_t mc, offset, mem;
    int dev;
};
static struct bind *binds;
static size_t n_binds, cap_binds;

static void drop_reference(struct entry *h);

/* Ends bind i (the lock is held): its memory may go. */
static void unbind_at(size_t i) {
    struct entry *m = table_find(&handles, binds[i].mem);
    binds[i] = binds[--n_binds];
    if (m) {
        m->maps--;
        if (m->maps == 0 && m->refs == 0) drop_reference(m);
    }
}

/* Erases handle h once nothing refers to it (the lock is held); a
 * multicast object takes its binds with it. */
static void drop_reference(struct entry *h) {
    uint64_t key = h->key;
    int multicast = h->kind == K_MULTICAST;
    /* A physical allocation gone: its device memory is free again
     * (imported handles took none). */
    if (h->takes_device) device_give((int)h->aux, K_HANDLE, h->size);
    table_erase(h);
    if (!multicast) return;
    for (size_t i = 0; i < n_binds;)
        if (binds[i].mc == key)
            unbind_at(i);
        else
            i++;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct entry *e = table_find(&handles, handle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (e && e->refs > 0) {
        e->refs--;
        if (e->refs == 0 && e->maps == 0) drop_reference(e);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* The handle mapped at addr (anywhere in its mapping), or 0; the lock is
 * held. */
static uint64_t handle_mapped_at(uint64_t addr) {
    for (size_t i = 0; i < mappings.cap; i++) {
        struct entry *m = &mappings.e[i];
        if (m->key && m->key != TOMBSTONE && addr >= m->key && addr < m->key + m->size)
            return m->aux;
    }
    return 0;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    uint64_t h = handle_mapped_at((uint64_t)(uintptr_t)addr);
    struct entry *e = h ? table_find(&handles, h) : NULL;
    if (e) e->refs++;
    pthread_mutex_unlock(&lock);
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    *handle = h;
    return CUDA_SUCCESS;
}

/* ---- multicast objects: handles of their own, released by cuMemRelease ---- */

CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!mcHandle || !prop || !prop->numDevices || !prop->size || prop->size % VMM_GRANULARITY ||
        prop->flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct entry e = {.key = next_handle++, .size = prop->size, .kind = K_MULTICAST, .refs = 1};
    int failed = table_put(&handles, e);
    pthread_mutex_unlock(&lock);
    if (failed) return CUDA_ERROR_OUT_OF_MEMORY;
    *mcHandle = e.key;
    return CUDA_SUCCESS;
}

CUresult cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop,
                                   CUmulticastGranularity_flags option) {
    (void)option;
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

/* A live multicast object (the lock is held). */
static struct entry *multicast(uint64_t mc) {
    struct entry *e = table_find(&handles, mc);
    return e && e->kind == K_MULTICAST && e->refs > 0 ? e : NULL;
}

CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    int ok = multicast(mcHandle) != NULL;
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Binds memory handle mem (its device when dev < 0) to mc at mcOffset. */
static CUresult bind(uint64_t mc, int dev, size_t mcOffset, uint64_t mem, size_t memOffset,
                     size_t size, unsigned long long flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (flags || !size) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct entry *o = multicast(mc), *m = table_find(&handles, mem);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (o && m && m->kind == K_HANDLE && m->refs > 0 && mcOffset + size <= o->size &&
        memOffset + size <= m->size) {
        if (n_binds == cap_binds) {
            size_t cap = cap_binds ? cap_binds * 2 : 16;
            struct bind *b = realloc(binds, cap * sizeof *b);
            if (!b) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            binds = b, cap_binds = cap;
        }
        binds[n_binds++] = (struct bind){mc, mcOffset, mem, dev < 0 ? (int)m->aux : dev};
        m->maps++;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                            CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
                            unsigned long long flags) {
    return bind(mcHandle, -1, mcOffset, memHandle, memOffset, size, flags);
}

CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
                               CUmemGenericAllocationHandle memHandle, size_t memOffset,
                               size_t size, unsigned long long flags) {
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    return bind(mcHandle, dev, mcOffset, memHandle, memOffset, size, flags);
}

/* The handle mapped at memptr, bound like cuMulticastBindMem. */
static CUresult bind_addr(uint64_t mc, int dev, size_t mcOffset, CUdeviceptr memptr, size_t size,
                          unsigned long long flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    uint64_t mem = handle_mapped_at(memptr);
    pthread_mutex_unlock(&lock);
    if (!mem) return CUDA_ERROR_INVALID_VALUE;
    return bind(mc, dev, mcOffset, mem, 0, size, flags);
}

CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                             CUdeviceptr memptr, size_t size, unsigned long long flags) {
    return bind_addr(mcHandle, -1, mcOffset, memptr, size, flags);
}

CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                size_t mcOffset, CUdeviceptr memptr, size_t size,
                                unsigned long long flags) {
    if (dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    return bind_addr(mcHandle, dev, mcOffset, memptr, size, flags);
}

CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
                           size_t size) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int found = 0;
    for (size_t i = 0; i < n_binds;) {
        struct bind *b = &binds[i];
        if (b->mc == mcHandle && b->dev == dev && b->offset >= mcOffset &&
            b->offset < mcOffset + size) {
            unbind_at(i);
            found = 1;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
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
    if (h && h->refs > 0 && offset + size <= h->size && inside_reservation(ptr, size) &&
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
        table_erase(m);
        if (h && --h->maps == 0 && h->refs == 0) drop_reference(h);
        found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- streams, stream capture and graphs ----
 * As NVIDIA documents them, for the memory they move: a stream is a
 * handle; capturing one (cuStreamBeginCapture) makes its stream-ordered
 * allocations and frees nodes of a graph instead of doing them. A graph's
 * allocation node has an address fixed for the graph's lifetime (mapped
 * here, charged to no device); launching an executable graph runs its
 * nodes in the order they were added: an allocation node makes its
 * address a live allocation that takes device memory (K_GRAPH), a free
 * node frees what it names. Graphs have memory nodes only: other kinds
 * are CUDA_ERROR_NOT_SUPPORTED. */

struct CUgraphNode_st {
    CUgraphNodeType type; /* CU_GRAPH_NODE_TYPE_MEM_ALLOC or _MEM_FREE */
    uint64_t addr;        /* the allocation's address, or the address freed */
    uint64_t size;        /* allocations: their size and device */
    int dev;
    struct CUgraphNode_st *next;
};

struct CUgraph_st {
    struct CUgraphNode_st *first, *last;
    int execs;    /* live executable graphs instantiated from it */
    int captured; /* a stream is capturing into it */
    struct CUgraph_st *next;
};

struct CUgraphExec_st {
    struct CUgraphNode_st *nodes; /* copies of the graph's, in order */
    size_t n;
    unsigned long long flags;
    CUgraph graph; /* NULL once destroyed */
    struct CUgraphExec_st *next;
};

struct CUstream_st {
    CUcontext ctx;
    unsigned int flags;
    CUstreamCaptureStatus status;
    CUstreamCaptureMode mode;
    cuuint64_t capture_id;
    CUgraph graph;    /* being captured into */
    CUgraphNode tail; /* the last node captured: what the next depends on */
    struct CUstream_st *next;
};

/* All under the lock. */
static struct CUstream_st *streams;      /* created, not destroyed */
static __thread struct CUstream_st per_thread_stream;
static struct CUgraph_st *graphs;        /* live */
static struct CUgraphExec_st *graph_execs; /* live */
static cuuint64_t next_capture_id = 1;
/* Streams capturing, read without the lock so that an allocation on a
 * process with none takes no lock more. */
static int captures;

/* The stream handle h names, for an entry point of the per-thread default
 * stream or not (the lock is held): a created stream, the calling thread's
 * per-thread default stream (CU_STREAM_PER_THREAD, and 0 for a _ptsz entry
 * point), or NULL: the legacy default stream (*legacy set), which NVIDIA's
 * driver never captures, or no stream. */
static struct CUstream_st *stream_of(CUstream h, int per_thread, int *legacy) {
    *legacy = 0;
    if (h == CU_STREAM_PER_THREAD || (!h && per_thread)) return &per_thread_stream;
    if (!h || h == CU_STREAM_LEGACY) {
        *legacy = 1;
        return NULL;
    }
    for (struct CUstream_st *s = streams; s; s = s->next)
        if (s == h) return s;
    return NULL;
}

static int graph_live(CUgraph g) {
    for (CUgraph at = graphs; at; at = at->next)
        if (at == g) return 1;
    return 0;
}

/* Whether every one of deps is a node of g (the lock is held). */
static int nodes_of(CUgraph g, const CUgraphNode *deps, size_t n) {
    if (n && !deps) return 0;
    for (size_t i = 0; i < n; i++) {
        CUgraphNode at = g->first;
        while (at && at != deps[i]) at = at->next;
        if (!at) return 0;
    }
    return 1;
}

/* Destroys g and its nodes (the lock is held); what its launches
 * allocated stays. */
static void destroy_graph(CUgraph g) {
    for (CUgraph *at = &graphs; *at; at = &(*at)->next)
        if (*at == g) {
            *at = g->next;
            break;
        }
    for (CUgraphExec x = graph_execs; x; x = x->next)
        if (x->graph == g) x->graph = NULL;
    for (CUgraphNode n = g->first, next; n; n = next) {
        next = n->next;
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) graph_memory_ref(n->addr, -1);
        free(n);
    }
    free(g);
}

/* Adds a memory node to g, after deps (the lock is held): an allocation
 * of size bytes on dev gets its address, fixed until g and what was made
 * from it are gone; a free of addr may not repeat one of g's. */
static CUresult add_memory_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                CUgraphNodeType type, uint64_t addr, uint64_t size, int dev) {
    if (!graph_live(g) || !nodes_of(g, deps, n)) return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
        if (!addr) return CUDA_ERROR_INVALID_VALUE;
        for (CUgraphNode at = g->first; at; at = at->next)
            if (at->type == CU_GRAPH_NODE_TYPE_MEM_FREE && at->addr == addr)
                return CUDA_ERROR_INVALID_VALUE;
    }
    CUgraphNode node = calloc(1, sizeof *node);
    if (!node) return CUDA_ERROR_OUT_OF_MEMORY;
    if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
        /* the address only: pages come with use, device memory at launch */
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        struct entry e = {.key = (uint64_t)(uintptr_t)p, .size = size, .refs = 1};
        if (p == MAP_FAILED || table_put(&graph_memory, e)) {
            if (p != MAP_FAILED) munmap(p, size);
            free(node);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        addr = e.key;
    }
    *node = (struct CUgraphNode_st){.type = type, .addr = addr, .size = size, .dev = dev};
    if (g->last)
        g->last->next = node;
    else
        g->first = node;
    g->last = node;
    *out = node;
    return CUDA_SUCCESS;
}

/* An allocation node's parameters, checked as NVIDIA's driver does. */
static CUresult alloc_params_ok(const CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    if (!p || !p->bytesize || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        (p->accessDescCount && !p->accessDescs))
        return CUDA_ERROR_INVALID_VALUE;
    if (p->poolProps.location.id < 0 || p->poolProps.location.id >= device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    if (p->bytesize > max_alloc) return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phStream || (Flags & ~(unsigned int)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = owning_context(current);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    CUstream s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = ctx;
    s->flags = Flags;
    pthread_mutex_lock(&lock);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&lock);
    *phStream = s;
    return CUDA_SUCCESS;
}

/* Ends s's capture, if any, and gives back its graph (the lock is held). */
static CUgraph end_capture(struct CUstream_st *s) {
    CUgraph g = s->graph;
    if (s->status != CU_STREAM_CAPTURE_STATUS_NONE) __atomic_fetch_sub(&captures, 1, __ATOMIC_RELAXED);
    if (g) g->captured = 0;
    s->status = CU_STREAM_CAPTURE_STATUS_NONE;
    s->graph = NULL;
    s->tail = NULL;
    return g;
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    CUstream *at = &streams;
    while (*at && *at != hStream) at = &(*at)->next;
    CUstream s = *at;
    if (s) {
        *at = s->next;
        /* a capture cut short: nobody ends it, its graph goes too */
        CUgraph g = end_capture(s);
        if (g) destroy_graph(g);
    }
    pthread_mutex_unlock(&lock);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    free(s);
    return CUDA_SUCCESS;
}

/* CUDA 2.0's entry point, still exported: the same call. */
CUresult cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2_local(hStream); }

static CUresult begin_capture(CUstream h, int per_thread, CUstreamCaptureMode mode) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int legacy;
    struct CUstream_st *s = stream_of(h, per_thread, &legacy);
    CUresult r = legacy ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
                 : !s ? CUDA_ERROR_INVALID_HANDLE
                 : s->status != CU_STREAM_CAPTURE_STATUS_NONE ? CUDA_ERROR_ILLEGAL_STATE
                 : CUDA_SUCCESS;
    /* the per-thread stream belongs to the context current on its thread */
    if (!r && s == &per_thread_stream && !(s->ctx = owning_context(current)))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (!r) {
        g->next = graphs;
        graphs = g;
        g->captured = 1;
        s->status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        s->mode = mode;
        s->capture_id = next_capture_id++;
        s->graph = g;
        s->tail = NULL;
        __atomic_fetch_add(&captures, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&lock);
    if (r) free(g);
    return r;
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, 0, mode);
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, 1, mode);
}
/* CUDA 10.0's, before capture modes: global capture. */
CUresult cuStreamBeginCapture(CUstream hStream) {
    return begin_capture(hStream, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
    return begin_capture(hStream, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

static CUresult stream_end_capture(CUstream h, int per_thread, CUgraph *phGraph) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int legacy;
    struct CUstream_st *s = stream_of(h, per_thread, &legacy);
    CUresult r = !s && !legacy ? CUDA_ERROR_INVALID_HANDLE
                 : !s || s->status != CU_STREAM_CAPTURE_STATUS_ACTIVE ? CUDA_ERROR_ILLEGAL_STATE
                 : CUDA_SUCCESS;
    if (!r) *phGraph = end_capture(s);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    return stream_end_capture(hStream, 0, phGraph);
}
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    return stream_end_capture(hStream, 1, phGraph);
}

/* What cuStreamGetCaptureInfo reports; every output may be NULL. */
static CUresult capture_info(CUstream h, int per_thread, CUstreamCaptureStatus *status,
                             cuuint64_t *id, CUgraph *graph, const CUgraphNode **deps,
                             const CUgraphEdgeData **edges, size_t *n) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int legacy;
    struct CUstream_st *s = stream_of(h, per_thread, &legacy);
    if (!s && !legacy) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    int active = s && s->status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (status) *status = s ? s->status : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id) *id = active ? s->capture_id : 0;
    if (graph) *graph = active ? s->graph : NULL;
    /* valid until the stream's next captured call, as NVIDIA's */
    if (deps) *deps = active && s->tail ? &s->tail : NULL;
    if (edges) *edges = NULL; /* all edges are default ones */
    if (n) *n = active && s->tail ? 1 : 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
    return capture_info(hStream, 0, captureStatus, NULL, NULL, NULL, NULL, NULL);
}
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
    return capture_info(hStream, 1, captureStatus, NULL, NULL, NULL, NULL, NULL);
}
CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                cuuint64_t *id_out) {
    return capture_info(hStream, 0, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}
CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                     cuuint64_t *id_out) {
    return capture_info(hStream, 1, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                   cuuint64_t *id_out, CUgraph *graph_out,
                                   const CUgraphNode **dependencies_out,
                                   size_t *numDependencies_out) {
    return capture_info(hStream, 0, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                        numDependencies_out);
}
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **dependencies_out,
                                        size_t *numDependencies_out) {
    return capture_info(hStream, 1, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                        numDependencies_out);
}
CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                   cuuint64_t *id_out, CUgraph *graph_out,
                                   const CUgraphNode **dependencies_out,
                                   const CUgraphEdgeData **edgeData_out,
                                   size_t *numDependencies_out) {
    return capture_info(hStream, 0, captureStatus_out, id_out, graph_out, dependencies_out,
                        edgeData_out, numDependencies_out);
}
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **dependencies_out,
                                        const CUgraphEdgeData **edgeData_out,
                                        size_t *numDependencies_out) {
    return capture_info(hStream, 1, captureStatus_out, id_out, graph_out, dependencies_out,
                        edgeData_out, numDependencies_out);
}

/* The capturing stream h names, or NULL (the lock is held). */
static struct CUstream_st *capturing(CUstream h, int per_thread) {
    int legacy;
    struct CUstream_st *s = stream_of(h, per_thread, &legacy);
    return s && s->status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? s : NULL;
}

/* cuMemAllocAsync on a capturing stream: 1, and *r, when it is one (an
 * allocation node, after the stream's last node, at whose address *dptr
 * is); 0 when the allocation is to be made now. */
static int captured_alloc(CUdeviceptr *dptr, size_t size, CUstream h, int per_thread,
                          CUresult *r) {
    if (!__atomic_load_n(&captures, __ATOMIC_RELAXED)) return 0;
    sigset_t mask;
    lock_signal_safe(&mask);
    struct CUstream_st *s = capturing(h, per_thread);
    if (s) {
        CUgraphNode node;
        *r = !dptr || !size ? CUDA_ERROR_INVALID_VALUE
             : size > max_alloc ? CUDA_ERROR_OUT_OF_MEMORY
             : add_memory_node(&node, s->graph, &s->tail, s->tail ? 1 : 0,
                               CU_GRAPH_NODE_TYPE_MEM_ALLOC, 0, size, s->ctx->device);
        if (!*r) {
            s->tail = node;
            *dptr = node->addr;
        }
    }
    unlock_signal_safe(&mask);
    return s != NULL;
}

/* cuMemFreeAsync on a capturing stream: a free node, the memory untouched. */
static int captured_free(CUdeviceptr dptr, CUstream h, int per_thread, CUresult *r) {
    if (!__atomic_load_n(&captures, __ATOMIC_RELAXED)) return 0;
    sigset_t mask;
    lock_signal_safe(&mask);
    struct CUstream_st *s = capturing(h, per_thread);
    if (s) {
        CUgraphNode node;
        *r = add_memory_node(&node, s->graph, &s->tail, s->tail ? 1 : 0,
                             CU_GRAPH_NODE_TYPE_MEM_FREE, dptr, 0, 0);
        if (!*r) s->tail = node;
    }
    unlock_signal_safe(&mask);
    return s != NULL;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph || flags) return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    g->next = graphs;
    graphs = g;
    pthread_mutex_unlock(&lock);
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    /* a graph a stream is capturing into is the capture's until it ends */
    CUresult r = !graph_live(hGraph) ? CUDA_ERROR_INVALID_VALUE
                 : hGraph->captured ? CUDA_ERROR_ILLEGAL_STATE
                 : CUDA_SUCCESS;
    if (!r) destroy_graph(hGraph);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraphNode) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = alloc_params_ok(nodeParams);
    if (r) return r;
    CUgraphNode node;
    pthread_mutex_lock(&lock);
    r = add_memory_node(&node, hGraph, dependencies, numDependencies, CU_GRAPH_NODE_TYPE_MEM_ALLOC,
                        0, nodeParams->bytesize, nodeParams->poolProps.location.id);
    pthread_mutex_unlock(&lock);
    if (r) return r;
    nodeParams->dptr = node->addr;
    *phGraphNode = node;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraphNode) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult r = add_memory_node(phGraphNode, hGraph, dependencies, numDependencies,
                                 CU_GRAPH_NODE_TYPE_MEM_FREE, dptr, 0, 0);
    pthread_mutex_unlock(&lock);
    return r;
}

/* CUDA 12.2's generic node: the memory nodes' parameters only. */
static CUresult add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                         CUgraphNodeParams *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    if (params->type == CU_GRAPH_NODE_TYPE_MEM_FREE)
        return cuGraphAddMemFreeNode_local(out, g, deps, n, params->free.dptr);
    if (params->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_NOT_SUPPORTED;
    CUDA_MEM_ALLOC_NODE_PARAMS a; /* the same layout, another type */
    memcpy(&a, &params->alloc, sizeof a);
    CUresult r = cuGraphAddMemAllocNode_local(out, g, deps, n, &a);
    if (!r) params->alloc.dptr = a.dptr;
    return r;
}

CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams) {
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

/* CUDA 12.3's, with edge data: every edge of the simulation is a default
 * one, whatever is asked. */
CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                           const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                           size_t numDependencies, CUgraphNodeParams *nodeParams) {
    (void)dependencyData;
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

/* An executable graph of g: a copy of its nodes. NVIDIA: a graph with
 * memory nodes has at most one at a time. */
static CUresult instantiate(CUgraphExec *out, CUgraph g, unsigned long long flags,
                            CUgraphInstantiateResult *result) {
    if (result) *result = CUDA_GRAPH_INSTANTIATE_ERROR;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || (flags & ~0xfull)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult r = graph_live(g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    size_t n = 0;
    if (!r)
        for (CUgraphNode at = g->first; at; at = at->next) n++;
    if (!r && n && g->execs) r = CUDA_ERROR_NOT_SUPPORTED; /* all nodes are memory nodes */
    CUgraphExec x = NULL;
    if (!r) {
        x = calloc(1, sizeof *x);
        if (x) x->nodes = calloc(n ? n : 1, sizeof *x->nodes);
        if (!x || !x->nodes) {
            free(x);
            x = NULL;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (!r) {
        for (CUgraphNode at = g->first; at; at = at->next) {
            x->nodes[x->n] = *at;
            x->nodes[x->n++].next = NULL;
            if (at->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) graph_memory_ref(at->addr, 1);
        }
        x->flags = flags;
        x->graph = g;
        g->execs++;
        x->next = graph_execs;
        graph_execs = x;
        *out = x;
        if (result) *result = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags) {
    return instantiate(phGraphExec, hGraph, flags, NULL);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    if (!instantiateParams) return CUDA_ERROR_INVALID_VALUE;
    instantiateParams->hErrNode_out = NULL;
    return instantiate(phGraphExec, hGraph, instantiateParams->flags,
                       &instantiateParams->result_out);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    return cuGraphInstantiateWithParams_local(phGraphExec, hGraph, instantiateParams);
}

/* CUDA 10.0's and 11.0's, without flags: no error node, an empty log. */
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize) {
    if (phErrorNode) *phErrorNode = NULL;
    if (logBuffer && bufferSize) logBuffer[0] = 0;
    return instantiate(phGraphExec, hGraph, 0, NULL);
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize) {
    return cuGraphInstantiate_v2_local(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

static int exec_live(CUgraphExec x) {
    for (CUgraphExec at = graph_execs; at; at = at->next)
        if (at == x) return 1;
    return 0;
}

/* Whether addr is live just before x's node i runs, the nodes before it
 * having run after `freed` (x's allocations freed first, AUTO_FREE) did;
 * the lock is held. *e: its block in `memory` when it was live before. */
static int live_before(CUgraphExec x, size_t i, uint64_t addr, int freed, struct entry **e) {
    *e = table_find(&memory, addr);
    int live = *e && !(freed && (*e)->kind == K_GRAPH);
    for (size_t j = 0; j < i; j++)
        if (x->nodes[j].addr == addr) live = x->nodes[j].type == CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    return live;
}

/* Runs x's nodes in order, all or none (the lock is held). */
static CUresult run_graph(CUgraphExec x, CUcontext ctx) {
    int auto_free = (x->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
    long long delta[MAX_DEVICES] = {0};
    /* A launch's allocations still live: an error, or freed first. */
    for (size_t i = 0; i < x->n; i++) {
        struct entry *e = table_find(&memory, x->nodes[i].addr);
        if (x->nodes[i].type != CU_GRAPH_NODE_TYPE_MEM_ALLOC || !e) continue;
        if (!auto_free || e->kind != K_GRAPH) return CUDA_ERROR_INVALID_VALUE;
        delta[x->nodes[i].dev] -= (long long)e->size;
    }
    for (size_t i = 0; i < x->n; i++) {
        struct CUgraphNode_st *n = &x->nodes[i];
        struct entry *e;
        int live = live_before(x, i, n->addr, auto_free, &e);
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            delta[n->dev] += (long long)n->size;
            if (device_bytes && (long long)device_used[n->dev] + delta[n->dev] > (long long)device_bytes)
                return CUDA_ERROR_OUT_OF_MEMORY;
            continue;
        }
        if (!live) return CUDA_ERROR_INVALID_VALUE;
        /* what was live before the launch, unless a node of it made it */
        int made_here = 0;
        for (size_t j = 0; j < i; j++)
            if (x->nodes[j].addr == n->addr) made_here = j + 1;
        if (made_here) {
            delta[x->nodes[made_here - 1].dev] -= (long long)x->nodes[made_here - 1].size;
        } else {
            if (!freed_as_device(e->kind)) return CUDA_ERROR_INVALID_VALUE;
            if (uses_device_memory(e->kind))
                delta[((CUcontext)(uintptr_t)e->aux)->device] -= (long long)e->size;
        }
    }
    /* Checked: now done. */
    if (auto_free)
        for (size_t i = 0; i < x->n; i++) {
            struct entry *e = table_find(&memory, x->nodes[i].addr);
            if (x->nodes[i].type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && e) free_entry(e);
        }
    for (size_t i = 0; i < x->n; i++) {
        struct CUgraphNode_st *n = &x->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
            free_entry(table_find(&memory, n->addr));
            continue;
        }
        /* the launch's context, or the node's device's primary one */
        CUcontext owner = ctx->device == n->dev ? ctx : &primary[n->dev];
        struct entry e = {.key = n->addr, .size = n->size, .aux = (uint64_t)(uintptr_t)owner,
                          .kind = K_GRAPH};
        if (table_put(&memory, e)) return CUDA_ERROR_OUT_OF_MEMORY;
        device_used[n->dev] += n->size;
        graph_memory_ref(n->addr, 1);
    }
    return CUDA_SUCCESS;
}

static CUresult launch(CUgraphExec x, CUstream h, int per_thread) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    sigset_t mask;
    lock_signal_safe(&mask);
    int legacy;
    struct CUstream_st *s = stream_of(h, per_thread, &legacy);
    /* the per-thread stream's context is the one current on the thread */
    CUcontext ctx = s && s != &per_thread_stream ? s->ctx : owning_context(current);
    CUresult r = !exec_live(x) ? CUDA_ERROR_INVALID_VALUE
                 : !s && !legacy ? CUDA_ERROR_INVALID_HANDLE
                 /* a graph launched into a capture: not simulated */
                 : s && s->status != CU_STREAM_CAPTURE_STATUS_NONE ? CUDA_ERROR_NOT_SUPPORTED
                 : !ctx ? CUDA_ERROR_INVALID_CONTEXT
                 : run_graph(x, ctx);
    unlock_signal_safe(&mask);
    return r;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return launch(hGraphExec, hStream, 0);
}
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return launch(hGraphExec, hStream, 1);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    CUgraphExec *at = &graph_execs;
    while (*at && *at != hGraphExec) at = &(*at)->next;
    CUgraphExec x = *at;
    if (x) {
        *at = x->next;
        if (x->graph) x->graph->execs--;
        for (size_t i = 0; i < x->n; i++)
            if (x->nodes[i].type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) graph_memory_ref(x->nodes[i].addr, -1);
    }
    pthread_mutex_unlock(&lock);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    free(x->nodes);
    free(x);
    return CUDA_SUCCESS;
}

/* Gives back the memory graphs keep cached for their next launch; the
 * simulation keeps none, and live allocations stay. */
CUresult cuDeviceGraphMemTrim(CUdevice device) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
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
    CUresult r = cuMemGetInfo_v2_local(&f, &t);
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
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
        {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
        {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
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

/* Every entry point with the name and version it is handed out by
 * (driver_entry_points.h); fn is NULL for NVIDIA's variants that the
 * simulation lacks. */
struct entry_point {
    const char *symbol, *name;
    int version, per_thread;
    void *fn;
};
#define SIM_ENTRY(sym, name, version, per_thread, params, args) \
    {#sym, #name, version, per_thread, (void *)sym##_local},
#define SIM_ABSENT(sym, name, version, per_thread, ...) {#sym, #name, version, per_thread, NULL},
static const struct entry_point entry_points[] = {
    SIMCUDA_ENTRY_POINTS(SIM_ENTRY, SIM_ABSENT)
    SIMCUDA_LOOKUP_ENTRY_POINTS(SIM_ENTRY, SIM_ABSENT)
};

/* What cuGetProcAddress(name, version, flags) resolves to, as NVIDIA's
 * driver does it: the newest variant of `name` introduced at or before
 * `version`; with the per-thread-default-stream flag, the newest such
 * _ptsz/_ptds variant when the name has one. NULL with *status set when
 * there is none: no such name, or only newer variants. */
static const struct entry_point *resolve_entry_point(const char *name, int version,
                                                     cuuint64_t flags,
                                                     CUdriverProcAddressQueryResult *status) {
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct entry_point *best = NULL, *best_pt = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++) {
        const struct entry_point *e = &entry_points[i];
        if (strcmp(e->name, name)) continue;
        known = 1;
        if (e->version > version) continue;
        const struct entry_point **slot = e->per_thread ? &best_pt : &best;
        if (!*slot || (*slot)->version < e->version) *slot = e;
    }
    if (per_thread && best_pt) best = best_pt;
    *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                   : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                           : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (best && !best->fn) {
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return NULL;
    }
    return best;
}

/* For the tests: the exported symbol cuGetProcAddress hands out for
 * (name, version, flags), or NULL. Not part of any CUDA API. */
const char *simcuda_proc_symbol(const char *name, int version, unsigned long long flags) {
    CUdriverProcAddressQueryResult status;
    const struct entry_point *e = name ? resolve_entry_point(name, version, flags, &status) : NULL;
    return e ? e->symbol : NULL;
}

/* For the tests (the wrapper driver): the name, version and per-thread
 * flag a symbol is handed out by; 0 when the symbol is not an entry point. */
int simcuda_symbol_version(const char *symbol, const char **name, int *version, int *per_thread) {
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++) {
        const struct entry_point *e = &entry_points[i];
        if (e->fn && !strcmp(e->symbol, symbol)) {
            *name = e->name;
            *version = e->version;
            *per_thread = e->per_thread;
            return 1;
        }
    }
    return 0;
}

/* ---- modules and libraries ----
 * A loaded module or library is a handle until it is unloaded; the
 * simulation keeps no code and charges nothing to the device. A module
 * needs a current context (its globals live in it); a library does not.
 * An image is accepted when it is a cubin (ELF), a fatbin, or text (PTX);
 * a file when it can be opened. */
struct CUmod_st {
    int library;
    struct CUmod_st *next;
};
struct CUlib_st {
    int unused;
};
static struct CUmod_st *loaded_modules;

static int image_ok(const void *image) {
    const unsigned char *p = image;
    if (!p) return 0;
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') return 1;
    if (p[0] == 0x50 && p[1] == 0xed && p[2] == 0x55 && p[3] == 0xba) return 1;
    /* the runtime's wrapper of a fatbin (__cudaRegisterFatBinary's) */
    if (p[0] == 0xb1 && p[1] == 0x43 && p[2] == 0x62 && p[3] == 0x46) return 1;
    return p[0] == '/' || p[0] == '.' || p[0] == '\n' || p[0] == ' ';
}

static CUresult load_module(void **out, const void *image, const char *file, int library) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (!library && !current) return CUDA_ERROR_INVALID_CONTEXT;
    if (file) {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return CUDA_ERROR_FILE_NOT_FOUND;
        close(fd);
    } else if (!image_ok(image)) {
        return CUDA_ERROR_INVALID_IMAGE;
    }
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    m->library = library;
    pthread_mutex_lock(&lock);
    m->next = loaded_modules;
    loaded_modules = m;
    pthread_mutex_unlock(&lock);
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult unload_module(void *handle, int library) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    struct CUmod_st **at = &loaded_modules;
    while (*at && (*at != handle || (*at)->library != library)) at = &(*at)->next;
    struct CUmod_st *m = *at;
    if (m) *at = m->next;
    pthread_mutex_unlock(&lock);
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    free(m);
    return CUDA_SUCCESS;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    if (!fname) return CUDA_ERROR_INVALID_VALUE;
    return load_module((void **)module, NULL, fname, 0);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    return load_module((void **)module, image, NULL, 0);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            CUjit_option *options, void **optionValues) {
    (void)numOptions, (void)options, (void)optionValues;
    return load_module((void **)module, image, NULL, 0);
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    return load_module((void **)module, fatCubin, NULL, 0);
}

CUresult cuModuleUnload(CUmodule hmod) { return unload_module(hmod, 0); }

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           CUlibraryOption *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions) {
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    return load_module((void **)library, code, NULL, 1);
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions) {
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    if (!fileName) return CUDA_ERROR_INVALID_VALUE;
    return load_module((void **)library, NULL, fileName, 1);
}

CUresult cuLibraryUnload(CUlibrary library) { return unload_module(library, 1); }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st;
    const struct entry_point *e = resolve_entry_point(symbol, cudaVersion, flags, &st);
    if (status) *status = st;
    *pfn = e ? e->fn : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2_local(symbol, pfn, cudaVersion, flags, NULL);
}
