/*
 * One planted leak through every allocation API cudaleak hooks, each in
 * its own function. Every leaking call is on a line marked "LEAK <api>":
 * the tests find those lines and expect exactly these blocks and bytes.
 * Linked against libcudart.so.12 and libcuda.so.1 (direct symbol binding).
 */
#include "common.h"

#define GRAN (2u << 20)

void runtime_malloc(void) { void *p; CHECK(cudaMalloc(&p, 1000)); /* LEAK cudaMalloc */ }
void runtime_malloc_async(void) { void *p; CHECK(cudaMallocAsync(&p, 2000, 0)); /* LEAK cudaMallocAsync */ }
void runtime_malloc_async_ptsz(void) { void *p; CHECK(cudaMallocAsync_ptsz(&p, 2100, 0)); /* LEAK cudaMallocAsync_ptsz */ }
void runtime_malloc_host(void) { void *p; CHECK(cudaMallocHost(&p, 3000)); /* LEAK cudaMallocHost */ }
void runtime_host_alloc(void) { void *p; CHECK(cudaHostAlloc(&p, 4000, cudaHostAllocPortable)); /* LEAK cudaHostAlloc */ }
void runtime_malloc_managed(void) { void *p; CHECK(cudaMallocManaged(&p, 5000, cudaMemAttachGlobal)); /* LEAK cudaMallocManaged */ }
void runtime_malloc_pitch(void) { void *p; size_t pitch; CHECK(cudaMallocPitch(&p, &pitch, 100, 10)); /* LEAK cudaMallocPitch */ }
void runtime_malloc_3d(void) { struct cudaPitchedPtr p; struct cudaExtent e = {100, 10, 2}; CHECK(cudaMalloc3D(&p, e)); /* LEAK cudaMalloc3D */ }

void driver_alloc(void) { CUdeviceptr p; CHECK(cuMemAlloc_v2(&p, 6000)); /* LEAK cuMemAlloc_v2 */ }
void driver_alloc_pitch(void) { CUdeviceptr p; size_t pitch; CHECK(cuMemAllocPitch_v2(&p, &pitch, 200, 3, 4)); /* LEAK cuMemAllocPitch_v2 */ }
void driver_alloc_managed(void) { CUdeviceptr p; CHECK(cuMemAllocManaged(&p, 7000, CU_MEM_ATTACH_GLOBAL)); /* LEAK cuMemAllocManaged */ }
void driver_alloc_async(void) { CUdeviceptr p; CHECK(cuMemAllocAsync(&p, 8000, 0)); /* LEAK cuMemAllocAsync */ }
void driver_alloc_async_ptsz(void) { CUdeviceptr p; CHECK(cuMemAllocAsync_ptsz(&p, 8100, 0)); /* LEAK cuMemAllocAsync_ptsz */ }
void driver_alloc_pool(void) { CUdeviceptr p; CHECK(cuMemAllocFromPoolAsync(&p, 8200, 0, 0)); /* LEAK cuMemAllocFromPoolAsync */ }
void driver_alloc_pool_ptsz(void) { CUdeviceptr p; CHECK(cuMemAllocFromPoolAsync_ptsz(&p, 8300, 0, 0)); /* LEAK cuMemAllocFromPoolAsync_ptsz */ }
void driver_alloc_host(void) { void *p; CHECK(cuMemAllocHost_v2(&p, 9000)); /* LEAK cuMemAllocHost_v2 */ }
void driver_host_alloc(void) { void *p; CHECK(cuMemHostAlloc(&p, 9100, CU_MEMHOSTALLOC_PORTABLE)); /* LEAK cuMemHostAlloc */ }

static CUmemAllocationProp device_prop(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

/* A handle that is never released. */
void vmm_create(void) { CUmemGenericAllocationHandle h; CUmemAllocationProp prop = device_prop(); CHECK(cuMemCreate(&h, GRAN, &prop, 0)); /* LEAK cuMemCreate */ }
/* A reservation that is never freed. */
void vmm_reserve(void) { CUdeviceptr va; CHECK(cuMemAddressReserve(&va, 2 * GRAN, 0, 0, 0)); /* LEAK cuMemAddressReserve */ }

/* Released while still mapped: the physical memory lives on through the
 * mapping, which is never unmapped (nor the reservation freed). */
void vmm_released_but_mapped(void) {
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CUmemAllocationProp prop = device_prop();
    CHECK(cuMemCreate(&h, 2 * GRAN, &prop, 0)); /* LEAK cuMemCreate mapped */
    CHECK(cuMemAddressReserve(&va, 4 * GRAN, 0, 0, 0)); /* LEAK cuMemAddressReserve mapped */
    CHECK(cuMemMap(va, 2 * GRAN, 0, h, 0));
    CHECK(cuMemRelease(h));
}

/* The full, correct VMM sequence: nothing leaks. */
void vmm_clean(void) {
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CUmemAllocationProp prop = device_prop();
    CHECK(cuMemCreate(&h, GRAN, &prop, 0));
    CHECK(cuMemAddressReserve(&va, GRAN, 0, 0, 0));
    CHECK(cuMemMap(va, GRAN, 0, h, 0));
    CHECK(cuMemRelease(h)); /* still mapped: memory stays */
    CHECK(cuMemUnmap(va, GRAN)); /* last mapping gone: memory freed */
    CHECK(cuMemAddressFree(va, GRAN));
}

/* Allocated and freed through every API: no leak. */
void everything_freed(void) {
    void *p;
    CUdeviceptr d;
    CHECK(cudaMalloc(&p, 11)); CHECK(cudaFree(p));
    CHECK(cudaMallocAsync(&p, 12, 0)); CHECK(cudaFreeAsync(p, 0));
    CHECK(cudaMallocAsync_ptsz(&p, 13, 0)); CHECK(cudaFreeAsync_ptsz(p, 0));
    CHECK(cudaMallocHost(&p, 14)); CHECK(cudaFreeHost(p));
    CHECK(cudaHostAlloc(&p, 15, 0)); CHECK(cudaFreeHost(p));
    CHECK(cudaMallocManaged(&p, 16, cudaMemAttachGlobal)); CHECK(cudaFree(p));
    CHECK(cuMemAlloc_v2(&d, 17)); CHECK(cuMemFree_v2(d));
    CHECK(cuMemAllocAsync(&d, 18, 0)); CHECK(cuMemFreeAsync(d, 0));
    CHECK(cuMemAllocAsync_ptsz(&d, 19, 0)); CHECK(cuMemFreeAsync_ptsz(d, 0));
    CHECK(cuMemAllocHost_v2(&p, 20)); CHECK(cuMemFreeHost(p));
}

int main(void) {
    CHECK(cudaFree(NULL)); /* context initialization idiom */
    driver_context();
    runtime_malloc();
    runtime_malloc_async();
    runtime_malloc_async_ptsz();
    runtime_malloc_host();
    runtime_host_alloc();
    runtime_malloc_managed();
    runtime_malloc_pitch();
    runtime_malloc_3d();
    driver_alloc();
    driver_alloc_pitch();
    driver_alloc_managed();
    driver_alloc_async();
    driver_alloc_async_ptsz();
    driver_alloc_pool();
    driver_alloc_pool_ptsz();
    driver_alloc_host();
    driver_host_alloc();
    vmm_create();
    vmm_reserve();
    vmm_released_but_mapped();
    vmm_clean();
    everything_freed();
    return 0;
}
