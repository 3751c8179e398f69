/*
 * Planted leaks of CUDA arrays through every API that makes one, a clean create/destroy of each, and a
 * bad release of each kind of handle.
 *
 *   arrays leak    leaks one array per API (sizes in tests/loading.rs)
 *   arrays clean   creates and destroys each: no leak
 *   arrays bad     destroys handles that are not live: the driver's errors
 *                  come back unchanged and are counted as invalid frees
 */
#include "common.h"

static const struct cudaChannelFormatDesc float4_desc = {32, 32, 32, 32, cudaChannelFormatKindFloat};
static const struct cudaChannelFormatDesc uchar_desc = {8, 0, 0, 0, cudaChannelFormatKindUnsigned};

__attribute__((noinline)) static CUarray driver_array(int leak) {
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 100, .Height = 10, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 2};
    CUarray a;
    CHECK(cuArrayCreate_v2(&a, &d)); /* LEAK cuArrayCreate_v2 */
    if (!leak) CHECK(cuArrayDestroy(a));
    return a;
}

__attribute__((noinline)) static CUarray driver_array_3d(int leak) {
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 16, .Height = 8, .Depth = 4,
                                 .Format = CU_AD_FORMAT_UNSIGNED_INT16, .NumChannels = 1};
    CUarray a;
    CHECK(cuArray3DCreate_v2(&a, &d)); /* LEAK cuArray3DCreate_v2 */
    if (!leak) CHECK(cuArrayDestroy(a));
    return a;
}

__attribute__((noinline)) static CUmipmappedArray driver_mipmapped(int leak) {
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 64, .Height = 64, .Depth = 0,
                                 .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 4};
    CUmipmappedArray m;
    CHECK(cuMipmappedArrayCreate(&m, &d, 3)); /* LEAK cuMipmappedArrayCreate */
    if (!leak) CHECK(cuMipmappedArrayDestroy(m));
    return m;
}

__attribute__((noinline)) static void runtime_array(int leak) {
    cudaArray_t a;
    CHECK(cudaMallocArray(&a, &float4_desc, 50, 2, 0)); /* LEAK cudaMallocArray */
    if (!leak) CHECK(cudaFreeArray(a));
}

__attribute__((noinline)) static void runtime_array_3d(int leak) {
    cudaArray_t a;
    struct cudaExtent e = {10, 10, 10};
    CHECK(cudaMalloc3DArray(&a, &uchar_desc, e, 0)); /* LEAK cudaMalloc3DArray */
    if (!leak) CHECK(cudaFreeArray(a));
}

__attribute__((noinline)) static void runtime_mipmapped(int leak) {
    cudaMipmappedArray_t m;
    struct cudaExtent e = {32, 32, 0};
    CHECK(cudaMallocMipmappedArray(&m, &float4_desc, e, 2, 0)); /* LEAK cudaMallocMipmappedArray */
    if (!leak) CHECK(cudaFreeMipmappedArray(m));
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *init;
    CHECK(cudaMalloc(&init, 16)); /* the runtime makes the primary context current */
    CHECK(cudaFree(init));
    int leak = !strcmp(argv[1], "leak");
    if (!strcmp(argv[1], "bad")) {
        CUarray a = driver_array(0);                /* destroyed: a dangling handle */
        CUmipmappedArray m = driver_mipmapped(0);
        EXPECT(cuArrayDestroy(a), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMipmappedArrayDestroy(m), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cudaFreeArray((cudaArray_t)a), cudaErrorInvalidValue);
        return 0;
    }
    driver_array(leak);
    driver_array_3d(leak);
    driver_mipmapped(leak);
    runtime_array(leak);
    runtime_array_3d(leak);
    runtime_mipmapped(leak);
    return 0;
}
