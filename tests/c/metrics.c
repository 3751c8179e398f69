/*
 * A program for the metrics file (CUDALEAK_METRICS_DIR).
 *
 *   metrics grow STEPS MS   holds 1 MiB at steady_site, then adds 1 MiB at
 *                           growing_site every MS milliseconds, STEPS
 *                           times, printing "step N" after each; frees
 *                           what it grew and leaks the steady MiB; with
 *                           "pause" among the arguments it stops halfway,
 *                           prints "paused", and goes on after a line on
 *                           stdin
 *   metrics many N          N distinct call sites (N <= 16384), 256 bytes
 *                           each, then "many done"; leaks them all
 *   metrics devices         1 MiB on device 0, 2 MiB on device 1 and 3 MiB of
 *                           pinned host memory, then "devices held"; after a
 *                           line on stdin frees device 1's, prints "freed",
 *                           and after another line exits, leaking the rest
 *                           (SIMCUDA_DEVICES=2)
 *   metrics wait            after grow or many, with "wait" as the last argument,
 *                           it waits for a line on stdin before exiting
 */
#include "common.h"

#include <unistd.h>

void *steady_site(void) { void *p; CHECK(cudaMalloc(&p, 1 << 20)); return p; } /* SITE steady */
void *growing_site(void) { void *p; CHECK(cudaMalloc(&p, 1 << 20)); return p; } /* SITE growing */

/* Fourteen levels of two functions each: the bits of N choose the path,
 * so that N gives a stack of its own (2^14 of them). The empty asm after
 * each call keeps the compiler from making it a jump. */
static void leaf(unsigned bits) {
    void *p;
    (void)bits;
    CHECK(cudaMalloc(&p, 256));
}
#define LEVEL(n, next)                                                              \
    __attribute__((noinline)) static void a##n(unsigned bits) { next(bits); __asm__ volatile(""); } \
    __attribute__((noinline)) static void b##n(unsigned bits) { next(bits); __asm__ volatile(""); } \
    __attribute__((noinline)) static void d##n(unsigned bits) {                  \
        if (bits & (1u << n)) a##n(bits); else b##n(bits);                          \
        __asm__ volatile("");                                                       \
    }
LEVEL(0, leaf)
LEVEL(1, d0)
LEVEL(2, d1)
LEVEL(3, d2)
LEVEL(4, d3)
LEVEL(5, d4)
LEVEL(6, d5)
LEVEL(7, d6)
LEVEL(8, d7)
LEVEL(9, d8)
LEVEL(10, d9)
LEVEL(11, d10)
LEVEL(12, d11)
LEVEL(13, d12)

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "grow")) {
        int steps = atoi(argv[2]), ms = atoi(argv[3]);
        void *kept[256];
        if (steps > 256) steps = 256;
        int pause = 0;
        for (int a = 4; a < argc; a++) pause |= !strcmp(argv[a], "pause");
        steady_site();
        for (int i = 0; i < steps; i++) {
            if (pause && i == steps / 2) {
                char line[16];
                printf("paused\n");
                fflush(stdout);
                if (!fgets(line, sizeof line, stdin)) return 4;
            }
            kept[i] = growing_site();
            printf("step %d\n", i + 1);
            fflush(stdout);
            usleep(ms * 1000);
        }
        if (!strcmp(argv[argc - 1], "wait")) {
            char line[16];
            if (!fgets(line, sizeof line, stdin)) return 4;
        }
        for (int i = 0; i < steps; i++) CHECK(cudaFree(kept[i]));
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "many")) {
        unsigned n = (unsigned)atoi(argv[2]);
        for (unsigned i = 0; i < n && i < (1u << 14); i++) d13(i);
        printf("many done\n");
        fflush(stdout);
        if (!strcmp(argv[argc - 1], "wait")) {
            char line[16];
            if (!fgets(line, sizeof line, stdin)) return 4;
        }
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "devices")) {
        CUcontext c0, c1;
        CUdeviceptr d0, d1;
        void *h;
        char line[16];
        CHECK(cuInit(0));
        CHECK(cuDevicePrimaryCtxRetain(&c0, 0));
        CHECK(cuDevicePrimaryCtxRetain(&c1, 1));
        CHECK(cuCtxSetCurrent(c0));
        CHECK(cuMemAlloc_v2(&d0, 1 << 20));
        CHECK(cuCtxSetCurrent(c1));
        CHECK(cuMemAlloc_v2(&d1, 2 << 20));
        CHECK(cuMemAllocHost_v2(&h, 3 << 20));
        printf("devices held\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) return 4;
        CHECK(cuMemFree_v2(d1));
        printf("freed\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) return 4;
        return 0;
    }
    fprintf(stderr, "usage: metrics grow STEPS MS [wait] | metrics many N [wait] | metrics devices\n");
    return 2;
}
