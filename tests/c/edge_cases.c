/*
 * Edge cases with exact expectations: 3 failed allocations, 5 invalid
 * frees, one leak (the second owner of a reused address), and error codes
 * passed through unchanged (EXPECT checks each one).
 */
#include "common.h"

#include <stdint.h>

static void *first;

void first_owner(void) { CHECK(cudaMalloc(&first, 4096)); CHECK(cudaFree(first)); }
void *second_owner(void) { void *p; CHECK(cudaMalloc(&p, 4096)); /* LEAK reuse */ return p; }

int main(void) {
    void *p;
    CUdeviceptr d;
    CHECK(cudaFree(NULL)); /* the context-initialization idiom: not a bad free */
    EXPECT(cudaMalloc(&p, 1ULL << 50), cudaErrorMemoryAllocation);
    driver_context();
    EXPECT(cuMemAlloc_v2(&d, 1ULL << 50), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuMemAlloc_v2(&d, 0), CUDA_ERROR_INVALID_VALUE);

    EXPECT(cudaFree((void *)0xdead0000), cudaErrorInvalidValue);
    CHECK(cudaMalloc(&p, 64));
    CHECK(cudaFree(p));
    EXPECT(cudaFree(p), cudaErrorInvalidValue);              /* double free */
    CHECK(cudaMalloc(&p, 128));
    EXPECT(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);      /* wrong kind: the block stays */
    CHECK(cudaFree(p));
    EXPECT(cuMemRelease(0x99999), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAddressFree(0x1234000, 4096), CUDA_ERROR_INVALID_VALUE);

    first_owner();
    void *second = second_owner();
    printf("reused=%d\n", first == second);
    return 0;
}
