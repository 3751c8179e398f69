// CUDA graph memory, stream capture, context resets, pools and modules for
// the GPU validation's `graphs` section (scripts/gpu-validate.sh), built by
// nvcc with its default static cudart (-g -O0 -arch=sm_90 ... -lcuda -ldl);
// the `pool_ptsz` binary is the same source built with
// `--default-stream per-thread`.
//
//   graphs_resets MODE [CUBIN]
//
// MODE (one per run; a run under `cudaleak run` is checked by
// gpu/check_report.py `graphs`):
//   graph_leak    a memory-alloc node of 8 MiB, launched once, never freed
//   graph_paired  alloc node, memset node, free node of 8 MiB, launched 3 times
//   capture       cudaMallocAsync of 4 MiB captured and launched, never freed;
//                 then a captured cudaMallocAsync/cudaFreeAsync pair of 6 MiB
//   auto_free     an alloc node of 2 MiB, instantiated with AutoFreeOnLaunch,
//                 launched 3 times: the last launch's block is left
//   trim          a paired graph of 16 MiB, launched, then
//                 cudaDeviceGraphMemTrim(0): free memory may only grow
//   reset_peak    cudaMalloc 64 MiB, cudaDeviceReset, cudaMalloc 64 MiB
//   thread_exit   the same with the deprecated cudaThreadExit
//   pool          cudaMallocFromPoolAsync of 3 MiB from the default pool
//                 (cudaMallocFromPoolAsync_ptsz in the per-thread build)
//   module        cuModuleLoad(CUBIN) once, never unloaded
//   module_loop   cuModuleLoad(CUBIN) 5 times, never unloaded; a live dump
//                 (cudaleak_dump, when the library is loaded) after the 3rd
//
// Ground truth for the checker: each allocation call is on a line marked
// "LEAK <name>" (left allocated) or "CLEAN <name>" (freed again), and the
// program prints its own account on stdout:
//   leak <name> <api> <blocks> <bytes> <function>
//   clean <name> <api> <bytes> <launches> <function>
//   dump <name> <blocks> <bytes>        (module_loop: what is loaded at the dump)
//   info ...                            (figures for the record, not compared)
//   done <mode>
// Every CUDA call is checked; a failure exits 3, trim's free-memory
// assertion 4, a failed cudaleak_dump 5, bad usage 2.
#define CUDA_ENABLE_DEPRECATED 1 // cudaThreadExit without a deprecation warning
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x)                                                                     \
    do {                                                                             \
        int e_ = (int)(x);                                                           \
        if (e_) {                                                                    \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, e_);        \
            exit(3);                                                                 \
        }                                                                            \
    } while (0)

#ifdef __CUDART_API_PER_THREAD_DEFAULT_STREAM
static const char *const POOL_API = "cudaMallocFromPoolAsync_ptsz";
#else
static const char *const POOL_API = "cudaMallocFromPoolAsync";
#endif

static const size_t MiB = 1 << 20;

__global__ void touch(char *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = 1;
}

static void leak(const char *name, const char *api, int blocks, size_t bytes, const char *function) {
    printf("leak %s %s %d %zu %s\n", name, api, blocks, bytes, function);
    fflush(stdout);
}

static void clean(const char *name, const char *api, size_t bytes, int launches, const char *function) {
    printf("clean %s %s %zu %d %s\n", name, api, bytes, launches, function);
    fflush(stdout);
}

static cudaMemAllocNodeParams alloc_params(size_t n) {
    cudaMemAllocNodeParams p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = 0;
    p.bytesize = n;
    return p;
}

// An alloc node left allocated: its block outlives the executable graph
// and the graph.
void graph_leak() {
    size_t n = 8 * MiB;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaGraphNode_t node;
    cudaMemAllocNodeParams params = alloc_params(n);
    CHECK(cudaGraphCreate(&graph, 0));
    CHECK(cudaGraphAddMemAllocNode(&node, graph, NULL, 0, &params)); /* LEAK graph_node */
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    leak("graph_node", "cudaGraphAddMemAllocNode", 1, n, __func__);
}

// Alloc, memset, free: each launch allocates and frees 8 MiB.
void graph_paired() {
    size_t n = 8 * MiB;
    int launches = 3;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaGraphNode_t a, m, f;
    cudaMemAllocNodeParams params = alloc_params(n);
    CHECK(cudaGraphCreate(&graph, 0));
    CHECK(cudaGraphAddMemAllocNode(&a, graph, NULL, 0, &params)); /* CLEAN graph_paired */
    cudaMemsetParams ms;
    memset(&ms, 0, sizeof ms);
    ms.dst = params.dptr;
    ms.value = 1;
    ms.elementSize = 1;
    ms.width = n;
    ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&m, graph, &a, 1, &ms));
    CHECK(cudaGraphAddMemFreeNode(&f, graph, &m, 1, params.dptr));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < launches; i++) {
        CHECK(cudaGraphLaunch(exec, 0));
        CHECK(cudaStreamSynchronize(0));
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    clean("graph_paired", "cudaGraphAddMemAllocNode", n, launches, __func__);
}

// Stream capture: a captured cudaMallocAsync becomes an alloc node.
void captured() {
    size_t n = 4 * MiB, m = 6 * MiB;
    cudaStream_t s;
    cudaGraph_t g1, g2;
    cudaGraphExec_t e1, e2;
    void *p = NULL, *q = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync(&p, n, s)); /* LEAK capture */
    touch<<<(unsigned)((n + 1023) / 1024), 1024, 0, s>>>((char *)p, n);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamEndCapture(s, &g1));
    CHECK(cudaGraphInstantiate(&e1, g1, 0));
    CHECK(cudaGraphLaunch(e1, s));
    CHECK(cudaStreamSynchronize(s));
    leak("capture", "cudaMallocAsync", 1, n, __func__);

    // Both the allocation and its free captured: nothing left.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync(&q, m, s)); /* CLEAN capture_paired */
    touch<<<(unsigned)((m + 1023) / 1024), 1024, 0, s>>>((char *)q, m);
    CHECK(cudaGetLastError());
    CHECK(cudaFreeAsync(q, s));
    CHECK(cudaStreamEndCapture(s, &g2));
    CHECK(cudaGraphInstantiate(&e2, g2, 0));
    CHECK(cudaGraphLaunch(e2, s));
    CHECK(cudaStreamSynchronize(s));
    clean("capture_paired", "cudaMallocAsync", m, 1, __func__);

    CHECK(cudaGraphExecDestroy(e1));
    CHECK(cudaGraphExecDestroy(e2));
    CHECK(cudaGraphDestroy(g1));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaStreamDestroy(s));
}

// AutoFreeOnLaunch: each launch frees the previous launch's block; the
// last one is left.
void auto_free() {
    size_t n = 2 * MiB;
    int launches = 3;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaGraphNode_t node;
    cudaMemAllocNodeParams params = alloc_params(n);
    CHECK(cudaGraphCreate(&graph, 0));
    CHECK(cudaGraphAddMemAllocNode(&node, graph, NULL, 0, &params)); /* LEAK auto_free */
    CHECK(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    for (int i = 0; i < launches; i++) {
        CHECK(cudaGraphLaunch(exec, 0));
        CHECK(cudaStreamSynchronize(0));
    }
    printf("info auto_free launches %d\n", launches);
    leak("auto_free", "cudaGraphAddMemAllocNode", 1, n, __func__);
}

// A paired graph, then the graph pool trimmed: free memory may only grow.
void trim_graph_pool() {
    size_t n = 16 * MiB;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaGraphNode_t a, f;
    cudaMemAllocNodeParams params = alloc_params(n);
    CHECK(cudaGraphCreate(&graph, 0));
    CHECK(cudaGraphAddMemAllocNode(&a, graph, NULL, 0, &params)); /* CLEAN trim */
    CHECK(cudaGraphAddMemFreeNode(&f, graph, &a, 1, params.dptr));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    size_t free0, free1, total;
    unsigned long long res0 = 0, res1 = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &res0));
    CHECK(cudaMemGetInfo(&free0, &total));
    CHECK(cudaDeviceGraphMemTrim(0));
    CHECK(cudaMemGetInfo(&free1, &total));
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &res1));
    printf("info trim free before %zu after %zu (+%lld), graph pool reserved before %llu after %llu\n", free0, free1,
           (long long)free1 - (long long)free0, res0, res1);
    if (free1 < free0) {
        fprintf(stderr, "trim: free memory fell from %zu to %zu\n", free0, free1);
        exit(4);
    }
    clean("trim", "cudaGraphAddMemAllocNode", n, 1, __func__);
}

// 64 MiB, a context teardown, 64 MiB: the device never holds more than 64 MiB.
void reset_twice(bool thread_exit) {
    size_t n = 64 * MiB;
    size_t f0, f1, f2, f3, total;
    void *p, *q;
    CHECK(cudaMemGetInfo(&f0, &total));
    CHECK(cudaMalloc(&p, n)); /* LEAK before_reset */
    CHECK(cudaMemGetInfo(&f1, &total));
    if (thread_exit)
        CHECK(cudaThreadExit());
    else
        CHECK(cudaDeviceReset());
    CHECK(cudaMemGetInfo(&f2, &total));
    CHECK(cudaMalloc(&q, n)); /* LEAK after_reset */
    CHECK(cudaMemGetInfo(&f3, &total));
    printf("info %s free at start %zu, after cudaMalloc %zu, after the reset %zu (given back %lld), after cudaMalloc %zu\n",
           thread_exit ? "cudaThreadExit" : "cudaDeviceReset", f0, f1, f2, (long long)f2 - (long long)f1, f3);
    leak("before_reset", "cudaMalloc", 1, n, __func__);
    leak("after_reset", "cudaMalloc", 1, n, __func__);
}

// The device's default pool; stream 0 is the per-thread stream in the
// --default-stream per-thread build, where the header maps the call to
// cudaMallocFromPoolAsync_ptsz.
void pool_alloc() {
    size_t n = 3 * MiB;
    cudaMemPool_t mp;
    void *p = NULL;
    CHECK(cudaDeviceGetDefaultMemPool(&mp, 0));
    CHECK(cudaMallocFromPoolAsync(&p, n, mp, 0)); /* LEAK pool */
    CHECK(cudaStreamSynchronize(0));
    leak("pool", POOL_API, 1, n, __func__);
}

typedef int (*dump_fn)(const char *);

// cuModuleLoad `loads` times, never unloaded. The account's bytes are the
// module's device global as the driver sizes it (cuModuleGetGlobal).
void module_load(const char *path, int loads, int dump_after) {
    // A paired allocation first: the library's live dumps start at a
    // process's first allocation call.
    void *p;
    CHECK(cudaMalloc(&p, 4096));
    CHECK(cudaFree(p));
    size_t bytes = 0;
    for (int i = 0; i < loads; i++) {
        CUmodule mod;
        CUdeviceptr g;
        size_t size = 0;
        CHECK(cuModuleLoad(&mod, path)); /* LEAK module */
        CHECK(cuModuleGetGlobal(&g, &size, mod, "g"));
        bytes += size;
        if (i + 1 == dump_after) {
            dump_fn dump = (dump_fn)dlsym(RTLD_DEFAULT, "cudaleak_dump");
            printf("dump module %d %zu\n", i + 1, bytes);
            if (dump) {
                int rc = dump("module_loop");
                printf("info cudaleak_dump rc %d after %d loads\n", rc, i + 1);
                if (rc != 0) exit(5);
            } else {
                printf("info no cudaleak_dump: not under the library\n");
            }
            fflush(stdout);
        }
    }
    leak("module", "cuModuleLoad", loads, bytes, __func__);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODE [CUBIN]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    // The context, without a cudaFree(0) that a free count might see.
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceSynchronize());
    if (!strcmp(mode, "graph_leak"))
        graph_leak();
    else if (!strcmp(mode, "graph_paired"))
        graph_paired();
    else if (!strcmp(mode, "capture"))
        captured();
    else if (!strcmp(mode, "auto_free"))
        auto_free();
    else if (!strcmp(mode, "trim"))
        trim_graph_pool();
    else if (!strcmp(mode, "reset_peak"))
        reset_twice(false);
    else if (!strcmp(mode, "thread_exit"))
        reset_twice(true);
    else if (!strcmp(mode, "pool") || !strcmp(mode, "pool_ptsz"))
        pool_alloc();
    else if ((!strcmp(mode, "module") || !strcmp(mode, "module_loop")) && argc > 2)
        module_load(argv[2], strcmp(mode, "module") ? 5 : 1, strcmp(mode, "module") ? 3 : 0);
    else {
        fprintf(stderr, "unknown mode %s (module and module_loop need CUBIN)\n", mode);
        return 2;
    }
    printf("done %s\n", mode);
    return 0;
}
