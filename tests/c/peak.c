/*
 * A program whose peak is the budgets' subject: it frees everything it
 * allocates (no leaks), and at its highest holds 8 MiB at weights and
 * 4 MiB at activations: a peak of 12 MiB.
 *
 * Built with -DPLANTED it also holds 3 MiB at planted_buffer at that
 * moment (a peak of 15 MiB); built with -DSHIFTED every line below moves
 * by 500, as an edit above every call site moves them between two builds.
 * argv[1], when given, is the exit status.
 */
#include "common.h"

#ifdef SHIFTED
#line 500
#endif

void *weights(void) { void *p; CHECK(cudaMalloc(&p, 8 << 20)); return p; } /* SITE weights */
void *activations(void) { void *p; CHECK(cudaMalloc(&p, 4 << 20)); return p; } /* SITE activations */
#ifdef PLANTED
void *planted_buffer(void) { void *p; CHECK(cudaMalloc(&p, 3 << 20)); return p; } /* SITE planted */
#endif

int main(int argc, char **argv) {
    void *w = weights();
    void *a = activations();
#ifdef PLANTED
    CHECK(cudaFree(planted_buffer()));
#endif
    CHECK(cudaFree(a));
    CHECK(cudaFree(w));
    return argc > 1 ? atoi(argv[1]) : 0;
}
