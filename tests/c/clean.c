/* Allocates and frees through many APIs and threads: no leak, no invalid free. */
#include "common.h"

#include <pthread.h>

static void *churn(void *arg) {
    (void)arg;
    for (int i = 0; i < 500; i++) {
        void *p, *h;
        CHECK(cudaMalloc(&p, 100 + i));
        CHECK(cudaMallocHost(&h, 50));
        CHECK(cudaFreeHost(h));
        CHECK(cudaFree(p));
        CHECK(cudaMallocAsync(&p, 10, 0));
        CHECK(cudaFreeAsync(p, 0));
    }
    return NULL;
}

int main(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, churn, NULL);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    return 0;
}
