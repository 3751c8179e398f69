/*
 * Every entry point of the simulated driver, with the name and version by
 * which cuGetProcAddress hands it out, after NVIDIA's rules: each function
 * has one variant per ABI change, named `cuX` (v1), `cuX_v2`, `cuX_v3`...,
 * and a request for "cuX" at version V gets the newest variant introduced
 * at or before V. The versions are those of cudaTypedefs.h's
 * `PFN_cuX_vNNNN` typedefs (CUDA 12.9 and 13.5 headers; the v1 entry
 * points' typedefs are in its `__CUDA_API_VERSION_INTERNAL` part), and the
 * names those of cuda.h's `#define cuX cuX_v2`. With the per-thread
 * default-stream flag (2), a function that has a `_ptsz`/`_ptds` variant
 * gets it (`PFN_cuX_vNNNN_ptsz`).
 *
 * SIMCUDA_ENTRY_POINTS(ENTRY, ABSENT) lists them as
 *   ENTRY(symbol, name, version, per_thread, (parameters), (arguments))
 * for what the simulation implements, and
 *   ABSENT(symbol, name, version, per_thread, ...)
 * for NVIDIA's variants of the same names that it does not: a request that
 * resolves to one of these finds nothing, as it would find a function the
 * real driver has and the simulation lacks, never an older variant with
 * another ABI. The wrapper driver (driver_wrapper.c) forwards every ENTRY.
 * cuGetProcAddress itself is in SIMCUDA_LOOKUP_ENTRY_POINTS, which a
 * wrapper writes by hand.
 */
#ifndef CUDALEAK_SIM_DRIVER_ENTRY_POINTS_H
#define CUDALEAK_SIM_DRIVER_ENTRY_POINTS_H

/* SIMCUDA_NO_CTX_QUERIES builds a driver without cuCtxGetCurrent and
 * cuCtxGetDevice (driver.c). */
#ifndef SIMCUDA_NO_CTX_QUERIES
#define SIMCUDA_CTX_QUERY(ENTRY, ABSENT) ENTRY
#else
#define SIMCUDA_CTX_QUERY(ENTRY, ABSENT) ABSENT
#endif

#define SIMCUDA_ENTRY_POINTS(ENTRY, ABSENT)                                                       \
    ENTRY(cuGetErrorName, cuGetErrorName, 6000, 0, (CUresult error, const char **pstr),        \
          (error, pstr))                                                                          \
    ENTRY(cuInit, cuInit, 2000, 0, (unsigned int flags), (flags))                               \
    ENTRY(cuDriverGetVersion, cuDriverGetVersion, 2020, 0, (int *version), (version))           \
    ENTRY(cuDeviceGet, cuDeviceGet, 2000, 0, (CUdevice *device, int ordinal), (device, ordinal)) \
    ENTRY(cuDeviceGetCount, cuDeviceGetCount, 2000, 0, (int *count), (count))                   \
    /* ---- contexts ---- */                                                                      \
    ENTRY(cuCtxCreate, cuCtxCreate, 2000, 0, (CUcontext *pctx, unsigned int flags, CUdevice dev), \
          (pctx, flags, dev))                                                                     \
    ENTRY(cuCtxCreate_v2, cuCtxCreate, 3020, 0,                                                  \
          (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))               \
    ABSENT(cuCtxCreate_v3, cuCtxCreate, 11040, 0)                                                \
    ABSENT(cuCtxCreate_v4, cuCtxCreate, 12050, 0)                                                \
    ENTRY(cuCtxDestroy, cuCtxDestroy, 2000, 0, (CUcontext ctx), (ctx))                           \
    ENTRY(cuCtxDestroy_v2, cuCtxDestroy, 4000, 0, (CUcontext ctx), (ctx))                        \
    ENTRY(cuCtxAttach, cuCtxAttach, 2000, 0, (CUcontext *pctx, unsigned int flags),             \
          (pctx, flags))                                                                          \
    ENTRY(cuCtxDetach, cuCtxDetach, 2000, 0, (CUcontext ctx), (ctx))                             \
    SIMCUDA_CTX_QUERY(ENTRY, ABSENT)(cuCtxGetCurrent, cuCtxGetCurrent, 4000, 0,                  \
                                     (CUcontext *pctx), (pctx))                                   \
    ENTRY(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0, (CUcontext ctx), (ctx))                     \
    SIMCUDA_CTX_QUERY(ENTRY, ABSENT)(cuCtxGetDevice, cuCtxGetDevice, 2000, 0,                    \
                                     (CUdevice *device), (device))                                \
    ABSENT(cuCtxGetDevice_v2, cuCtxGetDevice, 13000, 0)                                          \
    ENTRY(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0,                           \
          (CUcontext *pctx, CUdevice dev), (pctx, dev))                                           \
    ENTRY(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, 0, (CUdevice dev), (dev))  \
    ENTRY(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, 0, (CUdevice dev),     \
          (dev))                                                                                  \
    ENTRY(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, 0, (CUdevice dev), (dev))      \
    ENTRY(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, 0, (CUdevice dev), (dev))  \
    ENTRY(cuGreenCtxCreate, cuGreenCtxCreate, 12040, 0,                                          \
          (CUgreenCtx * phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags),         \
          (phCtx, desc, dev, flags))                                                              \
    ENTRY(cuGreenCtxDestroy, cuGreenCtxDestroy, 12040, 0, (CUgreenCtx hCtx), (hCtx))             \
    ENTRY(cuCtxFromGreenCtx, cuCtxFromGreenCtx, 12040, 0, (CUcontext *pContext, CUgreenCtx hCtx), \
          (pContext, hCtx))                                                                       \
    /* ---- memory ---- */                                                                        \
    ENTRY(cuMemGetInfo, cuMemGetInfo, 2000, 0, (unsigned int *free_bytes, unsigned int *total_bytes), \
          (free_bytes, total_bytes))                                                               \
    ENTRY(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0, (size_t *free_bytes, size_t *total_bytes),      \
          (free_bytes, total_bytes))                                                               \
    ENTRY(cuMemAlloc, cuMemAlloc, 2000, 0, (CUdeviceptr_v1 * dptr, unsigned int bytesize),       \
          (dptr, bytesize))                                                                       \
    ENTRY(cuMemAlloc_v2, cuMemAlloc, 3020, 0, (CUdeviceptr * dptr, size_t bytesize),             \
          (dptr, bytesize))                                                                       \
    ENTRY(cuMemAllocPitch, cuMemAllocPitch, 2000, 0,                                             \
          (CUdeviceptr_v1 * dptr, unsigned int *pitch, unsigned int width_bytes,                  \
           unsigned int height, unsigned int element_size),                                       \
          (dptr, pitch, width_bytes, height, element_size))                                       \
    ENTRY(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0,                                          \
          (CUdeviceptr * dptr, size_t * pitch, size_t width_bytes, size_t height,                 \
           unsigned int element_size),                                                            \
          (dptr, pitch, width_bytes, height, element_size))                                       \
    ENTRY(cuMemFree, cuMemFree, 2000, 0, (CUdeviceptr_v1 dptr), (dptr))                          \
    ENTRY(cuMemFree_v2, cuMemFree, 3020, 0, (CUdeviceptr dptr), (dptr))                          \
    ABSENT(cuMemGetAddressRange, cuMemGetAddressRange, 2000, 0)                                  \
    ENTRY(cuMemGetAddressRange_v2, cuMemGetAddressRange, 3020, 0,                                \
          (CUdeviceptr * pbase, size_t * psize, CUdeviceptr dptr), (pbase, psize, dptr))          \
    ENTRY(cuMemAllocHost, cuMemAllocHost, 2000, 0, (void **pp, unsigned int bytesize),           \
          (pp, bytesize))                                                                         \
    ENTRY(cuMemAllocHost_v2, cuMemAllocHost, 3020, 0, (void **pp, size_t bytesize),              \
          (pp, bytesize))                                                                         \
    ENTRY(cuMemFreeHost, cuMemFreeHost, 2000, 0, (void *p), (p))                                 \
    ENTRY(cuMemHostAlloc, cuMemHostAlloc, 2020, 0,                                               \
          (void **pp, size_t bytesize, unsigned int flags), (pp, bytesize, flags))                \
    ENTRY(cuMemAllocManaged, cuMemAllocManaged, 6000, 0,                                         \
          (CUdeviceptr * dptr, size_t bytesize, unsigned int flags), (dptr, bytesize, flags))     \
    ENTRY(cuMemHostRegister, cuMemHostRegister, 4000, 0,                                         \
          (void *p, size_t bytesize, unsigned int flags), (p, bytesize, flags))                   \
    ENTRY(cuMemHostRegister_v2, cuMemHostRegister, 6050, 0,                                      \
          (void *p, size_t bytesize, unsigned int flags), (p, bytesize, flags))                   \
    ENTRY(cuMemHostUnregister, cuMemHostUnregister, 4000, 0, (void *p), (p))                     \
    /* ---- stream-ordered allocation and pools ---- */                                          \
    ENTRY(cuMemAllocAsync, cuMemAllocAsync, 11020, 0,                                            \
          (CUdeviceptr * dptr, size_t bytesize, CUstream stream), (dptr, bytesize, stream))       \
    ENTRY(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1,                                       \
          (CUdeviceptr * dptr, size_t bytesize, CUstream stream), (dptr, bytesize, stream))       \
    ENTRY(cuMemFreeAsync, cuMemFreeAsync, 11020, 0, (CUdeviceptr dptr, CUstream stream),         \
          (dptr, stream))                                                                         \
    ENTRY(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1, (CUdeviceptr dptr, CUstream stream),    \
          (dptr, stream))                                                                         \
    ENTRY(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0,                            \
          (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream),              \
          (dptr, bytesize, pool, stream))                                                         \
    ENTRY(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1,                       \
          (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream),              \
          (dptr, bytesize, pool, stream))                                                         \
    ENTRY(cuMemPoolCreate, cuMemPoolCreate, 11020, 0,                                            \
          (CUmemoryPool * pool, const CUmemPoolProps *props), (pool, props))                      \
    ENTRY(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0, (CUmemoryPool pool), (pool))             \
    ENTRY(cuMemPoolExportToShareableHandle, cuMemPoolExportToShareableHandle, 11020, 0,          \
          (void *handle_out, CUmemoryPool pool, CUmemAllocationHandleType type,                   \
           unsigned long long flags),                                                             \
          (handle_out, pool, type, flags))                                                        \
    ENTRY(cuMemPoolImportFromShareableHandle, cuMemPoolImportFromShareableHandle, 11020, 0,      \
          (CUmemoryPool * pool_out, void *handle, CUmemAllocationHandleType type,                 \
           unsigned long long flags),                                                             \
          (pool_out, handle, type, flags))                                                        \
    ENTRY(cuMemPoolExportPointer, cuMemPoolExportPointer, 11020, 0,                              \
          (CUmemPoolPtrExportData * shareData_out, CUdeviceptr ptr), (shareData_out, ptr))        \
    ENTRY(cuMemPoolImportPointer, cuMemPoolImportPointer, 11020, 0,                              \
          (CUdeviceptr * ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData * shareData),         \
          (ptr_out, pool, shareData))                                                             \
    /* ---- streams, stream capture and graphs ---- */                                           \
    ENTRY(cuStreamCreate, cuStreamCreate, 2000, 0, (CUstream * phStream, unsigned int Flags),   \
          (phStream, Flags))                                                                      \
    ENTRY(cuStreamDestroy, cuStreamDestroy, 2000, 0, (CUstream hStream), (hStream))              \
    ENTRY(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0, (CUstream hStream), (hStream))           \
    ENTRY(cuStreamBeginCapture, cuStreamBeginCapture, 10000, 0, (CUstream hStream), (hStream))   \
    ENTRY(cuStreamBeginCapture_ptsz, cuStreamBeginCapture, 10000, 1, (CUstream hStream),         \
          (hStream))                                                                              \
    ENTRY(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0,                               \
          (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))                          \
    ENTRY(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1,                          \
          (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))                          \
    ENTRY(cuStreamEndCapture, cuStreamEndCapture, 10000, 0, (CUstream hStream, CUgraph * phGraph), \
          (hStream, phGraph))                                                                     \
    ENTRY(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, 1,                                 \
          (CUstream hStream, CUgraph * phGraph), (hStream, phGraph))                              \
    ENTRY(cuStreamIsCapturing, cuStreamIsCapturing, 10000, 0,                                    \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus), (hStream, captureStatus))    \
    ENTRY(cuStreamIsCapturing_ptsz, cuStreamIsCapturing, 10000, 1,                               \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus), (hStream, captureStatus))    \
    ENTRY(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo, 10010, 0,                              \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out),    \
          (hStream, captureStatus_out, id_out))                                                   \
    ENTRY(cuStreamGetCaptureInfo_ptsz, cuStreamGetCaptureInfo, 10010, 1,                         \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out),    \
          (hStream, captureStatus_out, id_out))                                                   \
    ENTRY(cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo, 11030, 0,                           \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out,     \
           CUgraph * graph_out, const CUgraphNode **dependencies_out,                             \
           size_t *numDependencies_out),                                                          \
          (hStream, captureStatus_out, id_out, graph_out, dependencies_out, numDependencies_out)) \
    ENTRY(cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo, 11030, 1,                      \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out,     \
           CUgraph * graph_out, const CUgraphNode **dependencies_out,                             \
           size_t *numDependencies_out),                                                          \
          (hStream, captureStatus_out, id_out, graph_out, dependencies_out, numDependencies_out)) \
    ENTRY(cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo, 12030, 0,                           \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out,     \
           CUgraph * graph_out, const CUgraphNode **dependencies_out,                             \
           const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out),                    \
          (hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,         \
           numDependencies_out))                                                                  \
    ENTRY(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo, 12030, 1,                      \
          (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out,     \
           CUgraph * graph_out, const CUgraphNode **dependencies_out,                             \
           const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out),                    \
          (hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,         \
           numDependencies_out))                                                                  \
    ENTRY(cuGraphCreate, cuGraphCreate, 10000, 0, (CUgraph * phGraph, unsigned int flags),       \
          (phGraph, flags))                                                                       \
    ENTRY(cuGraphDestroy, cuGraphDestroy, 10000, 0, (CUgraph hGraph), (hGraph))                  \
    ENTRY(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0,                              \
          (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,            \
           size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams),                       \
          (phGraphNode, hGraph, dependencies, numDependencies, nodeParams))                       \
    ENTRY(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 11040, 0,                                \
          (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,            \
           size_t numDependencies, CUdeviceptr dptr),                                             \
          (phGraphNode, hGraph, dependencies, numDependencies, dptr))                             \
    ENTRY(cuGraphAddNode, cuGraphAddNode, 12020, 0,                                              \
          (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,            \
           size_t numDependencies, CUgraphNodeParams *nodeParams),                                \
          (phGraphNode, hGraph, dependencies, numDependencies, nodeParams))                       \
    ENTRY(cuGraphAddNode_v2, cuGraphAddNode, 12030, 0,                                           \
          (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,            \
           const CUgraphEdgeData *dependencyData, size_t numDependencies,                         \
           CUgraphNodeParams *nodeParams),                                                        \
          (phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams))       \
    ENTRY(cuGraphInstantiate, cuGraphInstantiate, 10000, 0,                                      \
          (CUgraphExec * phGraphExec, CUgraph hGraph, CUgraphNode * phErrorNode,                  \
           char *logBuffer, size_t bufferSize),                                                   \
          (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))                              \
    ENTRY(cuGraphInstantiate_v2, cuGraphInstantiate, 11000, 0,                                   \
          (CUgraphExec * phGraphExec, CUgraph hGraph, CUgraphNode * phErrorNode,                  \
           char *logBuffer, size_t bufferSize),                                                   \
          (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))                              \
    ENTRY(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0,                    \
          (CUgraphExec * phGraphExec, CUgraph hGraph, unsigned long long flags),                  \
          (phGraphExec, hGraph, flags))                                                           \
    ENTRY(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0,                  \
          (CUgraphExec * phGraphExec, CUgraph hGraph,                                             \
           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),                                     \
          (phGraphExec, hGraph, instantiateParams))                                               \
    ENTRY(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1,             \
          (CUgraphExec * phGraphExec, CUgraph hGraph,                                             \
           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),                                     \
          (phGraphExec, hGraph, instantiateParams))                                               \
    ENTRY(cuGraphLaunch, cuGraphLaunch, 10000, 0, (CUgraphExec hGraphExec, CUstream hStream),    \
          (hGraphExec, hStream))                                                                  \
    ENTRY(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1, (CUgraphExec hGraphExec, CUstream hStream), \
          (hGraphExec, hStream))                                                                  \
    ENTRY(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0, (CUgraphExec hGraphExec),            \
          (hGraphExec))                                                                           \
    ENTRY(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, 0, (CUdevice device), (device))     \
    /* ---- modules and libraries ---- */                                                        \
    ENTRY(cuModuleLoad, cuModuleLoad, 2000, 0, (CUmodule * module, const char *fname),            \
          (module, fname))                                                                        \
    ENTRY(cuModuleLoadData, cuModuleLoadData, 2000, 0, (CUmodule * module, const void *image),    \
          (module, image))                                                                        \
    ENTRY(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, 0,                                        \
          (CUmodule * module, const void *image, unsigned int n, CUjit_option *o, void **v),      \
          (module, image, n, o, v))                                                               \
    ENTRY(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 2000, 0,                                  \
          (CUmodule * module, const void *fatCubin), (module, fatCubin))                          \
    ENTRY(cuModuleUnload, cuModuleUnload, 2000, 0, (CUmodule hmod), (hmod))                       \
    ENTRY(cuLibraryLoadData, cuLibraryLoadData, 12000, 0,                                         \
          (CUlibrary * l, const void *code, CUjit_option *jo, void **jv, unsigned int jn,         \
           CUlibraryOption *lo, void **lv, unsigned int ln),                                      \
          (l, code, jo, jv, jn, lo, lv, ln))                                                      \
    ENTRY(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000, 0,                                 \
          (CUlibrary * l, const char *file, CUjit_option *jo, void **jv, unsigned int jn,         \
           CUlibraryOption *lo, void **lv, unsigned int ln),                                      \
          (l, file, jo, jv, jn, lo, lv, ln))                                                      \
    ENTRY(cuLibraryUnload, cuLibraryUnload, 12000, 0, (CUlibrary library), (library))             \
    /* ---- CUDA arrays ---- */                                                                  \
    ENTRY(cuArrayCreate, cuArrayCreate, 2000, 0,                                                 \
          (CUarray * pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *a), (pHandle, a))                   \
    ENTRY(cuArrayCreate_v2, cuArrayCreate, 3020, 0,                                              \
          (CUarray * pHandle, const CUDA_ARRAY_DESCRIPTOR *a), (pHandle, a))                      \
    ENTRY(cuArray3DCreate, cuArray3DCreate, 2000, 0,                                             \
          (CUarray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *a), (pHandle, a))                 \
    ENTRY(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0,                                          \
          (CUarray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a), (pHandle, a))                    \
    ENTRY(cuArrayDestroy, cuArrayDestroy, 2000, 0, (CUarray a), (a))                             \
    ENTRY(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0,                               \
          (CUmipmappedArray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned int levels),    \
          (pHandle, a, levels))                                                                   \
    ENTRY(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0, (CUmipmappedArray a), (a))  \
    /* ---- memory shared between processes ---- */                                             \
    ENTRY(cuIpcGetMemHandle, cuIpcGetMemHandle, 4010, 0,                                         \
          (CUipcMemHandle * pHandle, CUdeviceptr dptr), (pHandle, dptr))                          \
    ENTRY(cuIpcOpenMemHandle, cuIpcOpenMemHandle, 4010, 0,                                       \
          (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int flags),                       \
          (pdptr, handle, flags))                                                                 \
    ENTRY(cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle, 11000, 0,                                   \
          (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int flags),                       \
          (pdptr, handle, flags))                                                                 \
    ENTRY(cuIpcCloseMemHandle, cuIpcCloseMemHandle, 4010, 0, (CUdeviceptr dptr), (dptr))         \
    ENTRY(cuImportExternalMemory, cuImportExternalMemory, 10000, 0,                              \
          (CUexternalMemory * extMem_out, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc),          \
          (extMem_out, desc))                                                                     \
    ENTRY(cuExternalMemoryGetMappedBuffer, cuExternalMemoryGetMappedBuffer, 10000, 0,            \
          (CUdeviceptr * devPtr, CUexternalMemory extMem,                                         \
           const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *desc),                                         \
          (devPtr, extMem, desc))                                                                 \
    ENTRY(cuExternalMemoryGetMappedMipmappedArray, cuExternalMemoryGetMappedMipmappedArray,      \
          10000, 0,                                                                               \
          (CUmipmappedArray * mipmap, CUexternalMemory extMem,                                    \
           const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC *desc),                                \
          (mipmap, extMem, desc))                                                                 \
    ENTRY(cuDestroyExternalMemory, cuDestroyExternalMemory, 10000, 0, (CUexternalMemory extMem), \
          (extMem))                                                                               \
    /* ---- virtual memory management ---- */                                                   \
    ENTRY(cuMemAddressReserve, cuMemAddressReserve, 10020, 0,                                    \
          (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,                    \
           unsigned long long flags),                                                             \
          (ptr, size, alignment, addr, flags))                                                    \
    ENTRY(cuMemAddressFree, cuMemAddressFree, 10020, 0, (CUdeviceptr ptr, size_t size),          \
          (ptr, size))                                                                            \
    ENTRY(cuMemCreate, cuMemCreate, 10020, 0,                                                    \
          (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,   \
           unsigned long long flags),                                                             \
          (handle, size, prop, flags))                                                            \
    ENTRY(cuMemRelease, cuMemRelease, 10020, 0, (CUmemGenericAllocationHandle handle), (handle)) \
    ENTRY(cuMemMap, cuMemMap, 10020, 0,                                                          \
          (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,      \
           unsigned long long flags),                                                             \
          (ptr, size, offset, handle, flags))                                                     \
    ENTRY(cuMemUnmap, cuMemUnmap, 10020, 0, (CUdeviceptr ptr, size_t size), (ptr, size))         \
    ENTRY(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020, 0,                \
          (size_t * granularity, const CUmemAllocationProp *prop, int option),                    \
          (granularity, prop, option))                                                            \
    ENTRY(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, 0,                  \
          (void *shareableHandle, CUmemGenericAllocationHandle handle,                            \
           CUmemAllocationHandleType type, unsigned long long flags),                             \
          (shareableHandle, handle, type, flags))                                                 \
    ENTRY(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, 0,              \
          (CUmemGenericAllocationHandle * handle, void *osHandle,                                 \
           CUmemAllocationHandleType type),                                                       \
          (handle, osHandle, type))                                                               \
    ENTRY(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0,                    \
          (CUmemGenericAllocationHandle * handle, void *addr), (handle, addr))                    \
    ENTRY(cuMulticastCreate, cuMulticastCreate, 12010, 0,                                        \
          (CUmemGenericAllocationHandle * mcHandle, const CUmulticastObjectProp *prop),           \
          (mcHandle, prop))                                                                       \
    ENTRY(cuMulticastAddDevice, cuMulticastAddDevice, 12010, 0,                                  \
          (CUmemGenericAllocationHandle mcHandle, CUdevice dev), (mcHandle, dev))                 \
    ENTRY(cuMulticastBindMem, cuMulticastBindMem, 12010, 0,                                      \
          (CUmemGenericAllocationHandle mcHandle, size_t mcOffset,                                \
           CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,                 \
           unsigned long long flags),                                                             \
          (mcHandle, mcOffset, memHandle, memOffset, size, flags))                                \
    ENTRY(cuMulticastBindMem_v2, cuMulticastBindMem, 13010, 0,                                   \
          (CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,                  \
           CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,                 \
           unsigned long long flags),                                                             \
          (mcHandle, dev, mcOffset, memHandle, memOffset, size, flags))                           \
    ENTRY(cuMulticastBindAddr, cuMulticastBindAddr, 12010, 0,                                    \
          (CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr,            \
           size_t size, unsigned long long flags),                                                \
          (mcHandle, mcOffset, memptr, size, flags))                                              \
    ENTRY(cuMulticastBindAddr_v2, cuMulticastBindAddr, 13010, 0,                                 \
          (CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,                  \
           CUdeviceptr memptr, size_t size, unsigned long long flags),                            \
          (mcHandle, dev, mcOffset, memptr, size, flags))                                         \
    ENTRY(cuMulticastUnbind, cuMulticastUnbind, 12010, 0,                                        \
          (CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset, size_t size),    \
          (mcHandle, dev, mcOffset, size))                                                        \
    ENTRY(cuMulticastGetGranularity, cuMulticastGetGranularity, 12010, 0,                        \
          (size_t * granularity, const CUmulticastObjectProp *prop,                               \
           CUmulticastGranularity_flags option),                                                  \
          (granularity, prop, option))

#define SIMCUDA_LOOKUP_ENTRY_POINTS(ENTRY, ABSENT)                                                \
    ENTRY(cuGetProcAddress, cuGetProcAddress, 11030, 0,                                          \
          (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags),                    \
          (symbol, pfn, cudaVersion, flags))                                                      \
    ENTRY(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0,                                       \
          (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                     \
           CUdriverProcAddressQueryResult *status),                                               \
          (symbol, pfn, cudaVersion, flags, status))

#endif
