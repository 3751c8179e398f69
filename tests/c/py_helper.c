/* For tests/python/stacks.py's deadlock scenario (see there). */
#include "common.h"

#include <pthread.h>
#include <unistd.h>

int locked_alloc(pthread_mutex_t *m, void **out, size_t n, int delay_ms) {
    pthread_mutex_lock(m);
    usleep(delay_ms * 1000);
    int rc = cudaMalloc(out, n);
    pthread_mutex_unlock(m);
    return rc;
}
