/*
 * Peak windows from C through the in-process API, found with dlsym as a
 * program that may run without the library finds them. Prints one line
 * per fact for tests/budgets.rs:
 *   none: what the API says with no window open (0)
 *   sequential: two windows one after the other, each exact
 *   thread: a window in the main thread while another thread allocates
 */
#include "common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

typedef uint64_t (*window_fn)(void);
static window_fn begin_, bytes_, end_;

static void burst(size_t n) {
    void *p;
    CHECK(cudaMalloc(&p, n));
    CHECK(cudaFree(p));
}

static void *other(void *arg) {
    (void)arg;
    burst(4 << 20);
    return NULL;
}

int main(void) {
    begin_ = (window_fn)dlsym(RTLD_DEFAULT, "cudaleak_peak_window_begin");
    bytes_ = (window_fn)dlsym(RTLD_DEFAULT, "cudaleak_peak_window_bytes");
    end_ = (window_fn)dlsym(RTLD_DEFAULT, "cudaleak_peak_window_end");
    if (!begin_ || !bytes_ || !end_) {
        printf("no API\n");
        return 0;
    }
    void *base;
    CHECK(cudaMalloc(&base, 1 << 20)); /* held before every window */
    printf("none %llu\n", (unsigned long long)bytes_());

    uint64_t start = begin_();
    burst(8 << 20);
    uint64_t first = end_() - start;
    start = begin_();
    burst(2 << 20);
    uint64_t second = end_() - start;
    printf("sequential %llu %llu\n", (unsigned long long)first, (unsigned long long)second);

    start = begin_();
    pthread_t t;
    pthread_create(&t, NULL, other, NULL);
    pthread_join(t, NULL);
    printf("thread %llu\n", (unsigned long long)(end_() - start));
    printf("after %llu\n", (unsigned long long)bytes_());
    CHECK(cudaFree(base));
    return 0;
}
