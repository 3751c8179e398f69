/*
 * Device resets and the memory they take away. Blocks still live when
 * their context is destroyed stay leaks, but the device no longer holds
 * them: live bytes, the peak, the timeline and an out-of-memory report's
 * holders count only what it holds.
 *
 *   resets reset         1 MiB leaked, cudaDeviceReset, 1 MiB leaked again
 *   resets thread_exit   the same with cudaThreadExit, a reset the library
 *                        sees only at the driver (no runtime hook has it)
 *   resets oom           16 MiB leaked, reset, 8 MiB held, then a request
 *                        larger than what is left fails (run with
 *                        SIMCUDA_DEVICE_BYTES=33554432: 32 MiB)
 *   resets pool_ptsz     3 MiB from cudaMallocFromPoolAsync_ptsz, kept
 */
#include "common.h"

#define MIB (1u << 20)

void *before_reset(size_t n) { void *p; CHECK(cudaMalloc(&p, n)); /* LEAK before */ return p; }

void *after_reset(size_t n) { void *p; CHECK(cudaMalloc(&p, n)); /* LEAK after */ return p; }

void *from_pool_ptsz(void) {
    void *p;
    CHECK(cudaMallocFromPoolAsync_ptsz(&p, 3 * MIB, 0, 0)); /* LEAK pool_ptsz */
    return p;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "reset";
    if (!strcmp(mode, "pool_ptsz")) {
        from_pool_ptsz();
        return 0;
    }
    int oom = !strcmp(mode, "oom");
    before_reset(oom ? 16 * MIB : MIB);
    if (!strcmp(mode, "thread_exit"))
        CHECK(cudaThreadExit());
    else
        CHECK(cudaDeviceReset());
    after_reset(oom ? 8 * MIB : MIB);
    if (oom) {
        void *p;
        /* 32 MiB device, 8 MiB held: 30 MiB cannot be had */
        EXPECT(cudaMalloc(&p, 30 * MIB), cudaErrorMemoryAllocation); /* REQUEST */
    }
    return 0;
}
