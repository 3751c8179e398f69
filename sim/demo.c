/*
 * The program `cudaleak demo` runs on the simulated driver: a small
 * "training loop" with three planted leaks, and memory it frees properly.
 */
#include "cuda_runtime_api.h"

#include <stdio.h>

static void *weights;

/* Leak 1: weights loaded once and never freed (64 MiB of device memory). */
static void load_weights(void) {
    cudaMalloc(&weights, 64u << 20);
}

/* Leak 2: a scratch buffer per step that is never freed (1 MiB × steps). */
static void *make_scratch(void) {
    void *scratch = NULL;
    cudaMalloc(&scratch, 1u << 20);
    return scratch;
}

/* Leak 3: a pinned staging buffer (4 MiB of host memory). */
static void *pinned_staging(void) {
    void *host = NULL;
    cudaMallocHost(&host, 4u << 20);
    return host;
}

static void train_step(int step) {
    void *activations = NULL;
    cudaMalloc(&activations, 8u << 20); /* freed below: not a leak */
    make_scratch();
    cudaFree(activations);
    printf("step %d done\n", step);
}

int main(void) {
    load_weights();
    pinned_staging();
    for (int step = 1; step <= 3; step++) {
        train_step(step);
        /* A step takes time, so that the report's timeline shows the
         * scratch leak growing. Declared here, not included, to keep the
         * line numbers of the frames above as the README shows them. */
        extern int usleep(unsigned int);
        usleep(150 * 1000);
    }
    return 0;
}
