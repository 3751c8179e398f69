// Planted leaks for the GPU validation (scripts/gpu-validate.sh), built by
// nvcc with its default static cudart: cudaMalloc & co. are functions of
// this executable, so only the driver underneath can be intercepted.
//
//   leaks [reset]   "reset" ends with cudaDeviceReset(), which
//                   compute-sanitizer's leak check needs
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x)                                                                     \
    do {                                                                             \
        int e_ = (int)(x);                                                           \
        if (e_) {                                                                    \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, e_);        \
            exit(3);                                                                 \
        }                                                                            \
    } while (0)

__global__ void touch(char *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = 1;
}

void leak_malloc() { void *p; CHECK(cudaMalloc(&p, 1 << 20)); /* LEAK cudaMalloc */ }
void leak_malloc_async() { void *p; CHECK(cudaMallocAsync(&p, 2 << 20, 0)); /* LEAK cudaMallocAsync */ CHECK(cudaStreamSynchronize(0)); }
void leak_malloc_host() { void *p; CHECK(cudaMallocHost(&p, 3 << 20)); /* LEAK cudaMallocHost */ }
void leak_malloc_managed() { void *p; CHECK(cudaMallocManaged(&p, 4 << 20)); /* LEAK cudaMallocManaged */ }

size_t granularity(CUmemAllocationProp *prop) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = 0;
    size_t g = 0;
    CHECK(cuMemGetAllocationGranularity(&g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return g;
}

void leak_mem_create() {
    CUmemAllocationProp prop;
    size_t g = granularity(&prop);
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, g, &prop, 0)); /* LEAK cuMemCreate */
}

// Every API again, released properly: none of this may be reported.
void clean() {
    void *p;
    for (int i = 0; i < 10; i++) {
        CHECK(cudaMalloc(&p, 4096));
        touch<<<4, 1024>>>((char *)p, 4096);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaFree(p));
    }
    CHECK(cudaMallocAsync(&p, 4096, 0));
    CHECK(cudaFreeAsync(p, 0));
    CHECK(cudaMallocHost(&p, 4096));
    CHECK(cudaFreeHost(p));
    CHECK(cudaMallocManaged(&p, 4096));
    CHECK(cudaFree(p));
    CUmemAllocationProp prop;
    size_t g = granularity(&prop);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CHECK(cuMemCreate(&h, g, &prop, 0));
    CHECK(cuMemAddressReserve(&va, g, 0, 0, 0));
    CHECK(cuMemMap(va, g, 0, h, 0));
    CHECK(cuMemRelease(h));
    CHECK(cuMemUnmap(va, g));
    CHECK(cuMemAddressFree(va, g));
    CHECK(cudaStreamSynchronize(0));
}

int main(int argc, char **argv) {
    CHECK(cudaFree(0));
    clean();
    leak_malloc();
    leak_malloc_async();
    leak_malloc_host();
    leak_malloc_managed();
    leak_mem_create();
    if (argc > 1 && !strcmp(argv[1], "reset")) CHECK(cudaDeviceReset());
    printf("done\n");
    return 0;
}
