/*
 * CUDA graph memory: memory-alloc and memory-free nodes allocate and free
 * when a launch runs them, not when they are added (the rule in
 * state/graphs.rs, from NVIDIA's "Graph Memory Nodes").
 *
 *   graphs paired         alloc node + free node, launched twice: no leak
 *   graphs freed_outside  alloc node, launched, then cudaFree: no leak
 *   graphs leak           alloc node never freed, launched once: a leak
 *                         with the line that added the node
 *   graphs trim           a paired graph and a leaking one launched, then
 *                         cudaDeviceGraphMemTrim: the leak stays
 *   graphs capture        cudaMallocAsync while the stream is captured,
 *                         launched once: a leak with the capturing line
 *   graphs capture_freed  cudaMallocAsync and cudaFreeAsync captured: no leak
 *   graphs never_launched captured and instantiated, never launched: nothing
 *   graphs generic        cuGraphAddNode with memory-alloc parameters: a leak
 *   graphs generic_v2     cuGraphAddNode_v2: two alloc nodes, one freed by a
 *                         free node; instantiated with parameters: one leak
 *   graphs outside_free   cudaMalloc outside any graph, freed by a captured
 *                         cudaFreeAsync when the graph runs: no leak
 *   graphs relaunch       launched again with its allocation live: the
 *                         launch fails, one block
 *   graphs auto_free      alloc node, AUTO_FREE_ON_LAUNCH, launched 3 times:
 *                         the last launch's block is the one leak
 */
#include "common.h"

#define MIB (1u << 20)

static void instantiate_and_launch(cudaGraph_t g, unsigned long long flags, int launches) {
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, flags));
    for (int i = 0; i < launches; i++) CHECK(cudaGraphLaunch(e, 0));
    CHECK(cudaGraphExecDestroy(e));
}

static struct cudaMemAllocNodeParams alloc_params(size_t bytes) {
    struct cudaMemAllocNodeParams p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    return p;
}

void *add_alloc_node(cudaGraph_t g, size_t bytes, cudaGraphNode_t *node) {
    struct cudaMemAllocNodeParams p = alloc_params(bytes);
    CHECK(cudaGraphAddMemAllocNode(node, g, NULL, 0, &p)); /* NODE alloc */
    return p.dptr;
}

void *add_leaking_node(cudaGraph_t g, size_t bytes) {
    cudaGraphNode_t node;
    struct cudaMemAllocNodeParams p = alloc_params(bytes);
    CHECK(cudaGraphAddMemAllocNode(&node, g, NULL, 0, &p)); /* LEAK node */
    return p.dptr;
}

static cudaGraph_t paired_graph(size_t bytes) {
    cudaGraph_t g;
    cudaGraphNode_t a, f;
    CHECK(cudaGraphCreate(&g, 0));
    void *p = add_alloc_node(g, bytes, &a);
    CHECK(cudaGraphAddMemFreeNode(&f, g, &a, 1, p));
    return g;
}

void *captured_alloc(cudaStream_t s, size_t bytes) {
    void *p;
    CHECK(cudaMallocAsync(&p, bytes, s)); /* LEAK capture */
    return p;
}

void *generic_alloc_node(CUgraph g, size_t bytes) {
    CUgraphNode node;
    CUgraphNodeParams params;
    memset(&params, 0, sizeof params);
    params.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    params.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params.alloc.poolProps.location.id = 0;
    params.alloc.bytesize = bytes;
    CHECK(cuGraphAddNode(&node, g, NULL, 0, &params)); /* LEAK generic */
    return (void *)(uintptr_t)params.alloc.dptr;
}

/* cuGraphAddNode_v2 (CUDA 12.3, with edge data): a node of `type`. */
static CUdeviceptr add_node_v2(CUgraph g, int type, size_t bytes, CUdeviceptr to_free) {
    CUgraphNode node;
    CUgraphNodeParams params;
    memset(&params, 0, sizeof params);
    params.type = type;
    if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
        params.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.alloc.bytesize = bytes;
    } else {
        params.free.dptr = to_free;
    }
    CHECK(cuGraphAddNode_v2(&node, g, NULL, NULL, 0, &params)); /* LEAK generic_v2 */
    return params.alloc.dptr;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "leak";
    CHECK(cudaFree(0)); /* the context */
    cudaGraph_t g;
    if (!strcmp(mode, "paired")) {
        g = paired_graph(2 * MIB);
        instantiate_and_launch(g, 0, 2);
        CHECK(cudaGraphDestroy(g));
    } else if (!strcmp(mode, "freed_outside") || !strcmp(mode, "leak")) {
        CHECK(cudaGraphCreate(&g, 0));
        void *p = add_leaking_node(g, 3 * MIB);
        instantiate_and_launch(g, 0, 1);
        CHECK(cudaGraphDestroy(g));
        if (!strcmp(mode, "freed_outside")) CHECK(cudaFree(p));
    } else if (!strcmp(mode, "trim")) {
        cudaGraph_t paired = paired_graph(4 * MIB);
        instantiate_and_launch(paired, 0, 1);
        CHECK(cudaGraphCreate(&g, 0));
        add_leaking_node(g, 3 * MIB);
        instantiate_and_launch(g, 0, 1);
        CHECK(cudaDeviceGraphMemTrim(0));
        CHECK(cudaGraphDestroy(paired));
        CHECK(cudaGraphDestroy(g));
    } else if (!strcmp(mode, "capture") || !strcmp(mode, "capture_freed") ||
               !strcmp(mode, "never_launched")) {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        void *p = captured_alloc(s, 5 * MIB);
        if (!strcmp(mode, "capture_freed")) CHECK(cudaFreeAsync(p, s));
        CHECK(cudaStreamEndCapture(s, &g));
        instantiate_and_launch(g, 0, strcmp(mode, "never_launched") ? 1 : 0);
        CHECK(cudaGraphDestroy(g));
        CHECK(cudaStreamDestroy(s));
    } else if (!strcmp(mode, "generic")) {
        CUgraph cg;
        CHECK(cuGraphCreate(&cg, 0));
        generic_alloc_node(cg, 6 * MIB);
        CUgraphExec e;
        CHECK(cuGraphInstantiateWithFlags(&e, cg, 0));
        CHECK(cuGraphLaunch(e, 0));
        CHECK(cuGraphExecDestroy(e));
        CHECK(cuGraphDestroy(cg));
    } else if (!strcmp(mode, "generic_v2")) {
        /* Two alloc nodes, one freed by a free node: one leak. */
        CUgraph cg;
        CHECK(cuGraphCreate(&cg, 0));
        add_node_v2(cg, CU_GRAPH_NODE_TYPE_MEM_ALLOC, 7 * MIB, 0);
        CUdeviceptr freed = add_node_v2(cg, CU_GRAPH_NODE_TYPE_MEM_ALLOC, 2 * MIB, 0);
        add_node_v2(cg, CU_GRAPH_NODE_TYPE_MEM_FREE, 0, freed);
        CUgraphExec e;
        CUDA_GRAPH_INSTANTIATE_PARAMS ip;
        memset(&ip, 0, sizeof ip);
        CHECK(cuGraphInstantiateWithParams(&e, cg, &ip));
        CHECK(cuGraphLaunch(e, 0));
        CHECK(cuGraphExecDestroy(e));
        CHECK(cuGraphDestroy(cg));
    } else if (!strcmp(mode, "outside_free")) {
        /* Memory allocated outside any graph, freed by a captured free. */
        void *p;
        CHECK(cudaMalloc(&p, 3 * MIB));
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CHECK(cudaFreeAsync(p, s));
        CHECK(cudaStreamEndCapture(s, &g));
        instantiate_and_launch(g, 0, 1);
        CHECK(cudaGraphDestroy(g));
        CHECK(cudaStreamDestroy(s));
    } else if (!strcmp(mode, "relaunch")) {
        /* Relaunched with its allocation still live: the launch fails. */
        CHECK(cudaGraphCreate(&g, 0));
        add_leaking_node(g, 3 * MIB);
        cudaGraphExec_t e;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        CHECK(cudaGraphLaunch(e, 0));
        EXPECT(cudaGraphLaunch(e, 0), cudaErrorInvalidValue);
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
    } else if (!strcmp(mode, "auto_free")) {
        CHECK(cudaGraphCreate(&g, 0));
        add_leaking_node(g, 1 * MIB);
        instantiate_and_launch(g, cudaGraphInstantiateFlagAutoFreeOnLaunch, 3);
        CHECK(cudaGraphDestroy(g));
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
