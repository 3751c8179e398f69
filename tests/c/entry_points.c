/*
 * Every way a program can get its hands on a CUDA function besides direct
 * binding: dlopen + dlsym (JAX/XLA), cuGetProcAddress (v1 and v2, also
 * looked up through itself), cudaGetDriverEntryPoint(ByVersion).
 * This program does not link libcuda; it only dlopens it.
 */
#include "common.h"

#include <dlfcn.h>

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*host_alloc_fn)(void **, size_t);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*getproc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*getproc_v1_fn)(const char *, void **, int, cuuint64_t);

static void *driver;
static getproc_v2_fn getproc;

void via_dlsym(void) { alloc_fn f = (alloc_fn)dlsym(driver, "cuMemAlloc_v2"); CUdeviceptr p; CHECK(f(&p, 111)); /* LEAK dlsym */ }

void via_getproc(void) { void *f; CHECK(getproc("cuMemAlloc", &f, 12040, 0, NULL)); CUdeviceptr p; CHECK(((alloc_fn)f)(&p, 222)); /* LEAK cuGetProcAddress_v2 */ }

void via_getproc_of_getproc(void) {
    void *g, *f;
    CHECK(getproc("cuGetProcAddress", &g, 12040, 0, NULL));
    CHECK(((getproc_v2_fn)g)("cuMemAlloc", &f, 12040, 0, NULL));
    CUdeviceptr p; CHECK(((alloc_fn)f)(&p, 333)); /* LEAK getproc of getproc */
}

void via_getproc_v1(void) {
    getproc_v1_fn v1 = (getproc_v1_fn)dlsym(driver, "cuGetProcAddress");
    void *f; CHECK(v1("cuMemAllocHost", &f, 11080, 0));
    void *p; CHECK(((host_alloc_fn)f)(&p, 444)); /* LEAK cuGetProcAddress */
}

void via_entry_point(void) {
    void *f; enum cudaDriverEntryPointQueryResult st;
    CHECK(cudaGetDriverEntryPoint("cuMemAlloc", &f, cudaEnableDefault, &st));
    CUdeviceptr p; CHECK(((alloc_fn)f)(&p, 555)); /* LEAK cudaGetDriverEntryPoint */
}

void via_entry_point_by_version(void) {
    void *f; enum cudaDriverEntryPointQueryResult st;
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &f, 12000, cudaEnablePerThreadDefaultStream, &st));
    CUdeviceptr p; CHECK(((alloc_async_fn)f)(&p, 666, 0)); /* LEAK cudaGetDriverEntryPointByVersion */
}

/* Before CUDA 3.2, "cuMemAlloc" is the 32-bit v1 entry point (hooked
 * too): a lookup at 3010 must never get the 64-bit cuMemAlloc_v2 or
 * its hook, whose ABI differs. */
void old_versions_pass_through(void) {
    void *f, *v2;
    CHECK(getproc("cuMemAlloc", &f, 3010, 0, NULL));
    CHECK(getproc("cuMemAlloc", &v2, 3020, 0, NULL));
    if (f == v2) {
        fprintf(stderr, "cuMemAlloc at 3010 was given cuMemAlloc_v2\n");
        exit(4);
    }
    /* A name that is not a CUDA function is still not found. */
    if (dlsym(driver, "cuNoSuchFunction") != NULL || dlsym(RTLD_DEFAULT, "cuNoSuchFunction") != NULL) {
        fprintf(stderr, "found a function that does not exist\n");
        exit(5);
    }
}

int main(void) {
    driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    getproc = (getproc_v2_fn)dlsym(driver, "cuGetProcAddress_v2");
    CUresult (*init)(unsigned) = NULL;
    CUresult (*retain)(CUcontext *, CUdevice) = NULL;
    CUresult (*set_current)(CUcontext) = NULL;
    CHECK(getproc("cuInit", (void **)&init, 12040, 0, NULL));
    CHECK(getproc("cuDevicePrimaryCtxRetain", (void **)&retain, 12040, 0, NULL));
    CHECK(getproc("cuCtxSetCurrent", (void **)&set_current, 12040, 0, NULL));
    CUcontext ctx;
    CHECK(init(0));
    CHECK(retain(&ctx, 0));
    CHECK(set_current(ctx));
    via_dlsym();
    via_getproc();
    via_getproc_of_getproc();
    via_getproc_v1();
    via_entry_point();
    via_entry_point_by_version();
    old_versions_pass_through();
    return 0;
}
