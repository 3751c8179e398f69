/*
 * cuGetProcAddress at the versions NVIDIA's runtimes ask for.
 *
 *   entry_versions                  every request of the real libcudart 12.9
 *                                   and 13.2 (sim/cudart_lookups.h), and every
 *                                   version boundary of the simulated driver's
 *                                   entry points (sim/driver_entry_points.h),
 *                                   at flags 0 and 2: the answer is the driver's
 *                                   own symbol for the request, as dlsym gives
 *                                   it (under cudaleak: the hook exactly when
 *                                   the symbol is hooked). Prints
 *                                   "checked N mismatches M"; exit 0 when M is 0.
 *   entry_versions NAME VER FLAGS   prints the symbol the driver resolves
 *                                   (NAME VER FLAGS)... to, or "-" for none.
 */
#define _GNU_SOURCE
#include "common.h"
#include "cudart_lookups.h"
#include "driver_entry_points.h"

#include <dlfcn.h>

const char *simcuda_proc_symbol(const char *name, int version, unsigned long long flags);

static int checked, mismatches;

static void check(const char *name, int version, unsigned long long flags) {
    const char *symbol = simcuda_proc_symbol(name, version, flags);
    void *got = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = cuGetProcAddress_v2(name, &got, version, flags, &status);
    void *want = symbol ? dlsym(RTLD_DEFAULT, symbol) : NULL;
    checked++;
    int ok = symbol ? r == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS && got == want && got
                    : r == CUDA_ERROR_NOT_FOUND && !got;
    if (!ok) {
        mismatches++;
        printf("mismatch: %s %d %llu -> %s: got %p (result %d), dlsym %p\n", name, version, flags,
               symbol ? symbol : "-", got, r, want);
    }
}

int main(int argc, char **argv) {
    CHECK(cuInit(0));
    if (argc > 1) {
        for (int i = 1; i + 2 < argc; i += 3) {
            const char *s = simcuda_proc_symbol(argv[i], atoi(argv[i + 1]), strtoull(argv[i + 2], 0, 0));
            printf("%s\n", s ? s : "-");
        }
        return 0;
    }
#define REQUEST(name, version, flags) check(name, version, flags);
    SIMCUDART_LOOKUPS_12(REQUEST)
    SIMCUDART_LOOKUPS_13(REQUEST)
#define BOUNDARY(sym, name, version, per_thread, ...)             \
    for (unsigned long long f = 0; f <= 2; f += 2) {                \
        check(#name, version - 10, f);                              \
        check(#name, version, f);                                   \
        check(#name, 13050, f);                                     \
        check(#name, 20000, f); /* newer than the hooks were checked */ \
    }
    SIMCUDA_ENTRY_POINTS(BOUNDARY, BOUNDARY)
    SIMCUDA_LOOKUP_ENTRY_POINTS(BOUNDARY, BOUNDARY)
    printf("checked %d mismatches %d\n", checked, mismatches);
    return mismatches != 0;
}
