/*
 * The driver's entry points as NVIDIA's runtime reaches them: by
 * version. Linked with the simulated runtime statically (nvcc's default,
 * CuPy 14's), so no runtime hook sees its calls, and with libcuda.
 *
 *   versioned reset    cudaDeviceReset reaches the CUDA 7.0
 *                      cuDevicePrimaryCtxReset: the block it freed is a
 *                      leak, and the address the driver hands out again is a
 *                      new block, freed cleanly; the stale free is invalid
 *   versioned release  the same through the v1 cuDevicePrimaryCtxRelease
 *                      (cuGetProcAddress at 7000)
 *   versioned ipc      cudaIpcOpenMemHandle reaches the CUDA 4.1
 *                      cuIpcOpenMemHandle: one mapping left open, one closed
 *   versioned v1       the 32-bit entry points of CUDA < 3.2 (cuGetProcAddress
 *                      at 2000): one leak each, and one v1 allocation freed
 *                      with the v1 cuMemFree
 *   versioned attach   CUDA 2.0's usage count: a context attached once is
 *                      destroyed by its second cuCtxDetach, with its leak
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>

typedef CUresult (*release_fn)(CUdevice);

static void *entry(const char *name, int version) {
    void *f = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress_v2(name, &f, version, 0, &st));
    return f;
}

__attribute__((noinline)) static void *leak_before_reset(void) {
    void *p;
    CHECK(cudaMalloc(&p, 500)); /* LEAK before reset */
    return p;
}

static void reset(void) {
    void *stale = leak_before_reset();
    CHECK(cudaDeviceReset());
    for (int i = 0; i < 4; i++) { /* the driver hands the address out again */
        void *q;
        CHECK(cudaMalloc(&q, 500));
        if (i == 0 && q == stale) printf("reused\n");
        CHECK(cudaFree(q));
    }
    EXPECT(cudaFree(stale), cudaErrorInvalidValue);
}

__attribute__((noinline)) static CUdeviceptr leak_before_release(void) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 600)); /* LEAK before release */
    return p;
}

static void release(void) {
    release_fn release_v1 = (release_fn)entry("cuDevicePrimaryCtxRelease", 7000);
    if (release_v1 == (release_fn)dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxRelease_v2")) exit(7);
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr stale = leak_before_release();
    CHECK(release_v1(0)); /* the last reference: the context and its memory go */
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    for (int i = 0; i < 4; i++) {
        CUdeviceptr q;
        CHECK(cuMemAlloc_v2(&q, 600));
        if (i == 0 && q == stale) printf("reused\n");
        CHECK(cuMemFree_v2(q));
    }
    EXPECT(cuMemFree_v2(stale), CUDA_ERROR_INVALID_VALUE);
    CHECK(release_v1(0));
}

__attribute__((noinline)) static void *open_peer(void *peer) {
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, peer));
    void *p;
    CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess)); /* LEAK ipc open */
    return p;
}

static void ipc(void) {
    void *peer;
    CHECK(cudaMalloc(&peer, 3000)); /* the "other process's" memory, freed below */
    void *leaked = open_peer(peer);
    void *closed = open_peer(peer);
    CHECK(cudaIpcCloseMemHandle(closed));
    EXPECT(cudaFree(leaked), cudaErrorInvalidValue); /* not freed with cudaFree */
    CHECK(cudaFree(peer));
}

typedef CUresult (*alloc_v1_fn)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*pitch_v1_fn)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int,
                                unsigned int);
typedef CUresult (*free_v1_fn)(CUdeviceptr_v1);
typedef CUresult (*host_v1_fn)(void **, unsigned int);
typedef CUresult (*array_v1_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *);
typedef CUresult (*array3d_v1_fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *);

static void v1(void) {
    alloc_v1_fn alloc = (alloc_v1_fn)entry("cuMemAlloc", 2000);
    pitch_v1_fn pitch_alloc = (pitch_v1_fn)entry("cuMemAllocPitch", 2000);
    free_v1_fn free_v1 = (free_v1_fn)entry("cuMemFree", 2000);
    host_v1_fn host = (host_v1_fn)entry("cuMemAllocHost", 2000);
    array_v1_fn array = (array_v1_fn)entry("cuArrayCreate", 2000);
    array3d_v1_fn array3d = (array3d_v1_fn)entry("cuArray3DCreate", 2000);
    driver_context();
    CUdeviceptr_v1 d, freed;
    unsigned int pitch;
    void *h;
    CUarray a, a3;
    CUDA_ARRAY_DESCRIPTOR_v1 desc = {.Width = 10, .Height = 10, .Format = CU_AD_FORMAT_FLOAT,
                                     .NumChannels = 1};
    CUDA_ARRAY3D_DESCRIPTOR_v1 desc3 = {.Width = 4, .Height = 4, .Depth = 4,
                                        .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 2};
    CHECK(alloc(&d, 7000)); /* LEAK v1 cuMemAlloc */
    CHECK(pitch_alloc(&d, &pitch, 100, 3, 4)); /* LEAK v1 cuMemAllocPitch */
    CHECK(host(&h, 900)); /* LEAK v1 cuMemAllocHost */
    CHECK(array(&a, &desc)); /* LEAK v1 cuArrayCreate */
    CHECK(array3d(&a3, &desc3)); /* LEAK v1 cuArray3DCreate */
    CHECK(alloc(&freed, 1234));
    CHECK(free_v1(freed));
    EXPECT(free_v1(freed), CUDA_ERROR_INVALID_VALUE);
}

__attribute__((noinline)) static void leak_in_attached(CUcontext *ctx) {
    CUdeviceptr p;
    CHECK(cuCtxCreate_v2(ctx, 0, 0));
    CHECK(cuMemAlloc_v2(&p, 800)); /* LEAK attached */
}

static void attach(void) {
    CUcontext ctx, again, primary;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    leak_in_attached(&ctx);
    CHECK(cuCtxAttach(&again, 0));
    if (again != ctx) exit(8);
    CHECK(cuCtxDetach(ctx)); /* one user left: the memory stays */
    CUdeviceptr live;
    CHECK(cuMemAlloc_v2(&live, 100));
    CHECK(cuMemFree_v2(live));
    CHECK(cuCtxDetach(ctx)); /* the last: the context and its memory go */
    CHECK(cuCtxSetCurrent(primary));
    for (int i = 0; i < 4; i++) {
        CUdeviceptr q;
        CHECK(cuMemAlloc_v2(&q, 800));
        CHECK(cuMemFree_v2(q));
    }
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (!strcmp(argv[1], "reset")) reset();
    else if (!strcmp(argv[1], "release")) release();
    else if (!strcmp(argv[1], "ipc")) ipc();
    else if (!strcmp(argv[1], "v1")) v1();
    else if (!strcmp(argv[1], "attach")) attach();
    else return 2;
    return 0;
}
