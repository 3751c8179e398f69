/*
 * NVIDIA's real libcudart (the nvidia-cuda-runtime-cu12 wheel), linked
 * dynamically or statically (libcudart_static.a): the codes of the calls a
 * program makes first. Declares what it calls itself: the simulated
 * runtime's header (on the include path) is not NVIDIA's.
 *
 * Prints one line per call, `name=code`, frees what it got, exits 0.
 */
#include <stddef.h>
#include <stdio.h>

typedef int real_cudaError_t;
real_cudaError_t cudaGetDeviceCount(int *count);
real_cudaError_t cudaMalloc(void **devPtr, size_t size);
real_cudaError_t cudaMallocAsync(void **devPtr, size_t size, void *stream);
real_cudaError_t cudaMallocHost(void **ptr, size_t size);
real_cudaError_t cudaFree(void *devPtr);
real_cudaError_t cudaFreeAsync(void *devPtr, void *stream);
real_cudaError_t cudaFreeHost(void *ptr);
real_cudaError_t cudaDeviceSynchronize(void);

int main(void) {
    int count = -1;
    void *d = NULL, *a = NULL, *h = NULL;
    int e;
    printf("cudaGetDeviceCount=%d\n", cudaGetDeviceCount(&count));
    printf("cudaMalloc=%d\n", e = cudaMalloc(&d, 1 << 20));
    if (!e) cudaFree(d);
    printf("cudaMallocAsync=%d\n", e = cudaMallocAsync(&a, 1 << 20, NULL));
    if (!e) {
        cudaFreeAsync(a, NULL);
        cudaDeviceSynchronize();
    }
    printf("cudaMallocHost=%d\n", e = cudaMallocHost(&h, 1 << 16));
    if (!e) cudaFreeHost(h);
    return 0;
}
