/*
 * Context teardown: blocks still live when their context is destroyed
 * (cuCtxDestroy_v2, cudaDeviceReset) are leaks, and the driver's reuse of
 * their addresses afterwards must not be mistaken for them.
 */
#include "common.h"

void leak_in_context(CUcontext *out) {
    CUdeviceptr a, b;
    CHECK(cuCtxCreate_v2(out, 0, 0));
    CHECK(cuMemAlloc_v2(&a, 300)); /* LEAK context */
    CHECK(cuMemAlloc_v2(&b, 300)); /* LEAK context */
}

void *leak_before_reset(void) { void *p; CHECK(cudaMalloc(&p, 500)); /* LEAK reset */ return p; }

int main(void) {
    CUcontext primary, mine;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    leak_in_context(&mine);
    CHECK(cuCtxDestroy_v2(mine));
    CHECK(cuCtxSetCurrent(primary));
    for (int i = 0; i < 8; i++) { /* likely the same addresses again */
        CUdeviceptr x;
        CHECK(cuMemAlloc_v2(&x, 300));
        CHECK(cuMemFree_v2(x));
    }
    void *stale = leak_before_reset();
    CHECK(cudaDeviceReset());
    void *p;
    CHECK(cudaMalloc(&p, 700));
    CHECK(cudaFree(p));
    EXPECT(cudaFree(stale), cudaErrorInvalidValue); /* gone with the context */
    return 0;
}
