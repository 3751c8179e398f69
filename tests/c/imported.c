/*
 * Planted leaks of memory opened from another process and of memory
 * pools. The simulated driver lets a
 * process open its own IPC and shareable handles, standing in for a peer.
 *
 *   imported leak    an IPC mapping never closed, an imported handle never
 *                    released, a pool never destroyed
 *   imported clean   the same, each closed, released or destroyed
 *   imported bad     closing, releasing and destroying what is not live:
 *                    the driver's errors come back, counted as invalid frees
 */
#include "common.h"

__attribute__((noinline)) static CUdeviceptr open_ipc(CUdeviceptr peer) {
    CUipcMemHandle h;
    CHECK(cuIpcGetMemHandle(&h, peer));
    CUdeviceptr p;
    CHECK(cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)); /* LEAK ipc */
    return p;
}

__attribute__((noinline)) static CUmemGenericAllocationHandle import_handle(int fd) {
    CUmemGenericAllocationHandle h;
    void *os = (void *)(intptr_t)fd;
    const CUmemAllocationHandleType fd_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CHECK(cuMemImportFromShareableHandle(&h, os, fd_type)); /* LEAK import */
    return h;
}

__attribute__((noinline)) static CUmemoryPool make_pool(void) {
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &props)); /* LEAK pool */
    return pool;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    driver_context();
    int leak = !strcmp(argv[1], "leak"), bad = !strcmp(argv[1], "bad");

    /* The "peer's" memory, allocated and freed here: not a leak. */
    CUdeviceptr peer;
    CHECK(cuMemAlloc_v2(&peer, 3000));
    CUdeviceptr opened = open_ipc(peer);

    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle exported;
    CHECK(cuMemCreate(&exported, 2u << 20, &prop, 0));
    int fd;
    CHECK(cuMemExportToShareableHandle(&fd, exported, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CUmemGenericAllocationHandle imported = import_handle(fd);
    CHECK(cuMemRelease(exported));

    CUmemoryPool pool = make_pool();

    if (!leak) {
        CHECK(cuIpcCloseMemHandle(opened));
        CHECK(cuMemRelease(imported));
        CHECK(cuMemPoolDestroy(pool));
    }
    if (bad) {
        EXPECT(cuIpcCloseMemHandle(opened), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemRelease(imported), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
        /* memory opened from a peer is not freed with cuMemFree */
        CUdeviceptr again = open_ipc(peer);
        EXPECT(cuMemFree_v2(again), CUDA_ERROR_INVALID_VALUE);
        CHECK(cuIpcCloseMemHandle(again));
    }
    CHECK(cuMemFree_v2(peer));
    return 0;
}
