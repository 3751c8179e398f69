/*
 * Planted leaks of the allocation kinds hooked with the driver's versioned
 * entry points, each leaked, used cleanly, or released wrongly:
 *
 *   kinds MODE retain     a VMM handle retained by address and released
 *                         once more (NCCL, PyTorch's expandable segments):
 *                         leak: the creator's reference is never given back,
 *                         and the retain/release pair must not hide it
 *   kinds MODE pool       memory imported from another process's pool
 *                         (cuMemPoolImportPointer), freed with cuMemFree,
 *                         and a pool another process shared
 *                         (cuMemPoolImportFromShareableHandle)
 *   kinds MODE multicast  a multicast object, memory bound to it and
 *                         released while bound (the bind keeps it alive)
 *   kinds MODE external   external memory (Vulkan, DMA-BUF), a buffer and a
 *                         mipmapped array mapped from it
 *   kinds MODE register   host memory pinned by cuMemHostRegister_v2 and by
 *                         cudaHostRegister
 *   kinds MODE green      memory allocated in a green context, which holds
 *                         the primary context after the program released it
 *
 * MODE: leak, clean (everything given back), or bad (one release too many).
 * Exit 0, or 3 when a CUDA call did not return what it should.
 */
#include "common.h"

static int leak, bad;

static CUmemAllocationProp device0(void) {
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    return prop;
}

__attribute__((noinline)) static CUmemGenericAllocationHandle create_handle(size_t size) {
    CUmemAllocationProp prop = device0();
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, size, &prop, 0)); /* LEAK retained */
    return h;
}

static void retain(void) {
    const size_t size = 2u << 20;
    CUmemGenericAllocationHandle h = create_handle(size), again;
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(cuMemMap(va, size, 0, h, 0));
    CHECK(cuMemRetainAllocationHandle(&again, (void *)(va + 4096)));
    if (again != h) exit(4);
    CHECK(cuMemRelease(again)); /* the retain's reference */
    CHECK(cuMemUnmap(va, size));
    CHECK(cuMemAddressFree(va, size));
    if (!leak) CHECK(cuMemRelease(h)); /* the creator's: the memory goes */
    if (bad) EXPECT(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
}

__attribute__((noinline)) static CUdeviceptr import_from_pool(CUmemoryPool pool,
                                                              CUmemPoolPtrExportData *data) {
    CUdeviceptr p;
    CHECK(cuMemPoolImportPointer(&p, pool, data)); /* LEAK pool import */
    return p;
}

__attribute__((noinline)) static CUmemoryPool import_pool(CUmemoryPool pool) {
    uint64_t fd;
    const CUmemAllocationHandleType fd_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CHECK(cuMemPoolExportToShareableHandle(&fd, pool, fd_type, 0));
    CUmemoryPool shared;
    CHECK(cuMemPoolImportFromShareableHandle(&shared, (void *)(uintptr_t)fd, fd_type, 0)); /* LEAK shared pool */
    return shared;
}

static void pool(void) {
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &props));
    CUdeviceptr exported;
    CHECK(cuMemAllocFromPoolAsync(&exported, 4096, pool, 0)); /* the "other process's" block */
    CUmemPoolPtrExportData data;
    CHECK(cuMemPoolExportPointer(&data, exported));
    CUdeviceptr imported = import_from_pool(pool, &data);
    CUdeviceptr freed_async = import_from_pool(pool, &data);
    CHECK(cuMemFreeAsync(freed_async, 0));
    if (!leak) CHECK(cuMemFree_v2(imported));
    if (bad) {
        EXPECT(cuMemFree_v2(imported), CUDA_ERROR_INVALID_VALUE);
        /* memory opened from a pool is not closed like an IPC mapping */
        CUdeviceptr again = import_from_pool(pool, &data);
        EXPECT(cuIpcCloseMemHandle(again), CUDA_ERROR_INVALID_VALUE);
        CHECK(cuMemFree_v2(again));
    }
    CHECK(cuMemFree_v2(exported));
    CUmemoryPool shared = import_pool(pool);
    if (!leak) CHECK(cuMemPoolDestroy(shared));
    if (bad) EXPECT(cuMemPoolDestroy(shared), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemPoolDestroy(pool));
}

__attribute__((noinline)) static CUmemGenericAllocationHandle make_multicast(size_t size) {
    CUmulticastObjectProp prop = {.numDevices = 1, .size = size};
    CUmemGenericAllocationHandle mc;
    CHECK(cuMulticastCreate(&mc, &prop)); /* LEAK multicast */
    CHECK(cuMulticastAddDevice(mc, 0));
    return mc;
}

__attribute__((noinline)) static CUmemGenericAllocationHandle bound_memory(size_t size) {
    CUmemAllocationProp prop = device0();
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, size, &prop, 0)); /* LEAK bound */
    return h;
}

static void multicast(void) {
    const size_t size = 2u << 20;
    CUmemGenericAllocationHandle mc = make_multicast(2 * size);
    /* bound by handle, then released: the bind keeps the memory alive */
    CUmemGenericAllocationHandle by_handle = bound_memory(size);
    CHECK(cuMulticastBindMem(mc, 0, by_handle, 0, size, 0));
    CHECK(cuMemRelease(by_handle));
    /* bound by address (cuMulticastBindAddr_v2), unbound, released */
    CUmemGenericAllocationHandle by_addr = bound_memory(size);
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(cuMemMap(va, size, 0, by_addr, 0));
    CHECK(cuMulticastBindAddr_v2(mc, 0, size, va, size, 0));
    CHECK(cuMemUnmap(va, size));
    CHECK(cuMemAddressFree(va, size));
    CHECK(cuMemRelease(by_addr));
    CHECK(cuMulticastUnbind(mc, 0, size, size)); /* by_addr goes now */
    if (!leak) CHECK(cuMemRelease(mc)); /* and by_handle with the object */
    if (bad) EXPECT(cuMemRelease(mc), CUDA_ERROR_INVALID_VALUE);
}

__attribute__((noinline)) static CUexternalMemory import_external(void) {
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC desc = {.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
                                             .handle = {.fd = 42}, .size = 1u << 20};
    CUexternalMemory ext;
    CHECK(cuImportExternalMemory(&ext, &desc)); /* LEAK external */
    return ext;
}

__attribute__((noinline)) static CUdeviceptr map_buffer(CUexternalMemory ext) {
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC desc = {.offset = 4096, .size = 65536};
    CUdeviceptr p;
    CHECK(cuExternalMemoryGetMappedBuffer(&p, ext, &desc)); /* LEAK external buffer */
    return p;
}

__attribute__((noinline)) static CUmipmappedArray map_mipmap(CUexternalMemory ext) {
    CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC desc = {
        .arrayDesc = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1},
        .numLevels = 2};
    CUmipmappedArray a;
    CHECK(cuExternalMemoryGetMappedMipmappedArray(&a, ext, &desc)); /* LEAK external mipmap */
    return a;
}

static void external(void) {
    CUexternalMemory ext = import_external();
    CUdeviceptr buffer = map_buffer(ext);
    CUmipmappedArray mipmap = map_mipmap(ext);
    if (!leak) {
        CHECK(cuMemFree_v2(buffer));
        CHECK(cuMipmappedArrayDestroy(mipmap));
        CHECK(cuDestroyExternalMemory(ext));
    }
    if (bad) {
        EXPECT(cuMemFree_v2(buffer), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuDestroyExternalMemory(ext), CUDA_ERROR_INVALID_VALUE);
    }
}

static char pinned_by_driver[3 << 12], pinned_by_runtime[5 << 12];

static void register_host(void) {
    const unsigned int portable = CU_MEMHOSTREGISTER_PORTABLE;
    CHECK(cuMemHostRegister_v2(pinned_by_driver, sizeof pinned_by_driver, portable)); /* LEAK cuMemHostRegister_v2 */
    CHECK(cudaHostRegister(pinned_by_runtime, sizeof pinned_by_runtime, 0)); /* LEAK cudaHostRegister */
    if (!leak) {
        CHECK(cuMemHostUnregister(pinned_by_driver));
        CHECK(cudaHostUnregister(pinned_by_runtime));
    }
    if (bad) EXPECT(cudaHostUnregister(pinned_by_runtime), cudaErrorHostMemoryNotRegistered);
}

__attribute__((noinline)) static CUdeviceptr allocate_in_green(CUgreenCtx green) {
    CUcontext ctx;
    CHECK(cuCtxFromGreenCtx(&ctx, green));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 1500)); /* LEAK green */
    return p;
}

static void green(void) {
    CUcontext primary;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    CUgreenCtx green;
    CUdevResourceDesc desc = (CUdevResourceDesc)&green; /* any descriptor, for the simulation */
    CHECK(cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    /* The program's own reference goes; the green context holds the
     * primary context, and its memory, alive. */
    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    CUdeviceptr p = allocate_in_green(green);
    CUdeviceptr q;
    CHECK(cuMemAlloc_v2(&q, 2500)); /* still in the green context: freed below */
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuMemFree_v2(q));
    if (!leak) CHECK(cuMemFree_v2(p));
    CHECK(cuGreenCtxDestroy(green)); /* the last reference: the primary context goes */
    if (bad) EXPECT(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    leak = !strcmp(argv[1], "leak");
    bad = !strcmp(argv[1], "bad");
    if (strcmp(argv[2], "green")) driver_context();
    if (!strcmp(argv[2], "retain")) retain();
    else if (!strcmp(argv[2], "pool")) pool();
    else if (!strcmp(argv[2], "multicast")) multicast();
    else if (!strcmp(argv[2], "external")) external();
    else if (!strcmp(argv[2], "register")) register_host();
    else if (!strcmp(argv[2], "green")) green();
    else return 2;
    return 0;
}
