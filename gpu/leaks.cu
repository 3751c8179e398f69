// Planted leaks for the GPU validation (scripts/gpu-validate.sh), built by
// nvcc with its default static cudart: cudaMalloc & co. are functions of
// this executable, so only the driver underneath can be intercepted.
//
//   leaks [reset]   "reset" ends with cudaDeviceReset(), which
//                   compute-sanitizer's leak check needs
//
// Ground truth for gpu/check_report.py (nvcc section): each planted leak is
// one allocation call on a line marked "LEAK <api>" (the checker finds the
// line there), and the program prints its own account of it on stdout,
//   planted <api> <memory> <bytes> <function>
// with the size it really asked for (the cuMemCreate one is the device's
// granularity, known only at run time).
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

static void planted(const char *api, const char *memory, size_t bytes, const char *function) {
    printf("planted %s %s %zu %s\n", api, memory, bytes, function);
    fflush(stdout);
}

void leak_malloc() {
    void *p;
    size_t n = 1 << 20;
    CHECK(cudaMalloc(&p, n)); /* LEAK cudaMalloc */
    planted("cudaMalloc", "device", n, __func__);
}

void leak_malloc_async() {
    void *p;
    size_t n = 2 << 20;
    CHECK(cudaMallocAsync(&p, n, 0)); /* LEAK cudaMallocAsync */
    CHECK(cudaStreamSynchronize(0));
    planted("cudaMallocAsync", "device", n, __func__);
}

void leak_malloc_host() {
    void *p;
    size_t n = 3 << 20;
    CHECK(cudaMallocHost(&p, n)); /* LEAK cudaMallocHost */
    planted("cudaMallocHost", "host", n, __func__);
}

void leak_malloc_managed() {
    void *p;
    size_t n = 4 << 20;
    CHECK(cudaMallocManaged(&p, n)); /* LEAK cudaMallocManaged */
    planted("cudaMallocManaged", "managed", n, __func__);
}

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
    planted("cuMemCreate", "physical", g, __func__);
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
