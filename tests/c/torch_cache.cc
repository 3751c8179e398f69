/* A stand-in for PyTorch's default CUDA caching allocator (issue 21): its
 * segments are allocated under c10::cuda::CUDACachingAllocator, as in
 * libc10_cuda.so, and the reports must call them cache segments (reserved
 * memory), not tensors. Another block is a plain cudaMalloc. */
#include "cuda_runtime_api.h"

#include <stddef.h>

namespace c10 {
namespace cuda {
namespace CUDACachingAllocator {
namespace Native {

struct DeviceCachingAllocator {
    void *malloc(size_t size);
};

__attribute__((noinline)) void *DeviceCachingAllocator::malloc(size_t size) {
    void *p = 0;
    cudaMalloc(&p, size); /* SEGMENT */
    return p;
}

}  // namespace Native
}  // namespace CUDACachingAllocator
}  // namespace cuda
}  // namespace c10

__attribute__((noinline)) static void *plain(size_t size) {
    void *p = 0;
    cudaMalloc(&p, size); /* PLAIN */
    return p;
}

int main() {
    c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator allocator;
    allocator.malloc(20 << 20);
    plain(1 << 20);
    return 0;
}
