/* Helpers for cudaleak's planted-leak test programs. */
#ifndef CUDALEAK_TEST_COMMON_H
#define CUDALEAK_TEST_COMMON_H

#include "cuda.h"
#include "cuda_runtime_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fails the program loudly when a CUDA call does not return what the test
 * expects: the tests then see the status, not a wrong report. */
#define EXPECT(call, want)                                                          \
    do {                                                                            \
        int got_ = (int)(call);                                                     \
        if (got_ != (int)(want)) {                                                  \
            fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__,     \
                    __LINE__, #call, got_, (int)(want));                            \
            exit(3);                                                                \
        }                                                                           \
    } while (0)

#define CHECK(call) EXPECT(call, 0)

/* Makes the primary context of device 0 current for direct driver calls. */
static inline void driver_context(void) {
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
}

#endif
