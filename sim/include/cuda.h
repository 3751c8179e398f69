/*
 * Minimal CUDA driver API declarations for cudaleak's simulated driver and
 * its test programs. Written from the CUDA Driver API reference (types,
 * signatures and numeric values); only what the simulation implements.
 */
#ifndef CUDALEAK_SIM_CUDA_H
#define CUDALEAK_SIM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
};

/* cuGetProcAddress flags */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
};

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_MEM_ATTACH_GLOBAL 0x1

typedef enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 } CUmemAllocationType;
typedef enum { CU_MEM_LOCATION_TYPE_DEVICE = 1 } CUmemLocationType;
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* CUDA arrays (textures, surfaces): opaque handles to device memory. */
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* Memory shared between processes. */
typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;
typedef enum { CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1 } CUipcMem_flags;
typedef enum { CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 } CUmemAllocationHandleType;
/* The CUDA < 3.2 (32-bit) array descriptors, still exported as the v1
 * cuArrayCreate and cuArray3DCreate. */
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

/* Memory another process exported from its pool (cuMemPoolExportPointer). */
typedef struct CUmemPoolPtrExportData_st {
    unsigned char reserved[64];
} CUmemPoolPtrExportData;

/* Multicast objects (CUDA 12.1). */
typedef struct CUmulticastObjectProp_st {
    unsigned int numDevices;
    size_t size;
    unsigned long long handleTypes;
    unsigned long long flags;
} CUmulticastObjectProp;
typedef enum {
    CU_MULTICAST_GRANULARITY_MINIMUM = 0,
    CU_MULTICAST_GRANULARITY_RECOMMENDED = 1,
} CUmulticastGranularity_flags;

/* External memory (Vulkan, D3D, DMA-BUF), CUDA 10.0. */
typedef struct CUextMemory_st *CUexternalMemory;
typedef enum {
    CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD = 1,
} CUexternalMemoryHandleType;
typedef struct CUDA_EXTERNAL_MEMORY_HANDLE_DESC_st {
    CUexternalMemoryHandleType type;
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_HANDLE_DESC;
typedef struct CUDA_EXTERNAL_MEMORY_BUFFER_DESC_st {
    unsigned long long offset;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_BUFFER_DESC;
typedef struct CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC_st {
    unsigned long long offset;
    CUDA_ARRAY3D_DESCRIPTOR arrayDesc;
    unsigned int numLevels;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC;

/* cuMemHostRegister flags */
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08

/* Green contexts (CUDA 12.4). The simulation checks only that a resource
 * descriptor is given. */
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
#define CU_GREEN_CTX_DEFAULT_STREAM 0x1

/* Pool properties: only their presence is checked by the simulation. */
typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* Memory access of a location (graph allocation nodes, pools). */
typedef enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
} CUmemAccess_flags;
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* Streams, stream capture and graphs (CUDA 10.0; memory nodes 11.4). */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
typedef enum { CU_STREAM_DEFAULT = 0x0, CU_STREAM_NON_BLOCKING = 0x1 } CUstream_flags;
typedef enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2,
} CUstreamCaptureMode;
typedef enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;
typedef enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_MEMCPY = 1,
    CU_GRAPH_NODE_TYPE_MEMSET = 2,
    CU_GRAPH_NODE_TYPE_HOST = 3,
    CU_GRAPH_NODE_TYPE_GRAPH = 4,
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
} CUgraphNodeType;
typedef enum {
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1,
    CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD = 2,
    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH = 4,
    CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY = 8,
} CUgraphInstantiate_flags;
typedef enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
    CUDA_GRAPH_INSTANTIATE_ERROR = 1,
    CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2,
    CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED = 3,
    CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED = 4,
} CUgraphInstantiateResult;
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
typedef struct CUgraphEdgeData_st {
    unsigned char from_port;
    unsigned char to_port;
    unsigned char type;
    unsigned char reserved[5];
} CUgraphEdgeData;
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS_v1;
typedef CUDA_MEM_ALLOC_NODE_PARAMS_v1 CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v2_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS_v2;
typedef struct CUDA_MEM_FREE_NODE_PARAMS_st {
    CUdeviceptr dptr;
} CUDA_MEM_FREE_NODE_PARAMS;
/* cuGraphAddNode's parameters: the simulation knows the memory nodes'
 * members of the union only. */
typedef struct CUgraphNodeParams_st {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_MEM_ALLOC_NODE_PARAMS_v2 alloc;
        CUDA_MEM_FREE_NODE_PARAMS free;
    };
    long long reserved2;
} CUgraphNodeParams;

/* NVIDIA's layouts (x86-64, AArch64), which programs built against the
 * real headers pass in. */
#ifdef __cplusplus
#define SIMCUDA_LAYOUT(cond, what) static_assert(cond, what)
#else
#define SIMCUDA_LAYOUT(cond, what) _Static_assert(cond, what)
#endif
SIMCUDA_LAYOUT(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps layout");
SIMCUDA_LAYOUT(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs) == 88, "alloc node layout");
SIMCUDA_LAYOUT(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104, "alloc node layout");
SIMCUDA_LAYOUT(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) == 112, "alloc node layout");
SIMCUDA_LAYOUT(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "alloc node layout");
SIMCUDA_LAYOUT(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS_v2) == 120, "alloc node layout");
SIMCUDA_LAYOUT(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams layout");
SIMCUDA_LAYOUT(offsetof(CUgraphNodeParams, alloc) == 16, "CUgraphNodeParams layout");
SIMCUDA_LAYOUT(offsetof(CUgraphNodeParams, free) == 16, "CUgraphNodeParams layout");
SIMCUDA_LAYOUT(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32, "instantiate params layout");
SIMCUDA_LAYOUT(sizeof(CUgraphEdgeData) == 8, "edge data layout");

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize); /* pre-3.2 */
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes); /* pre-3.2 */
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width_bytes,
                            size_t height, unsigned int element_size);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuMemFreeHost(void *p);

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       int option);

/* Variants that NVIDIA's driver still exports and its cuGetProcAddress
 * hands out for old versions (CUDA < 3.2, < 4.0, < 11.0); NVIDIA's own
 * runtime asks for some of them (the primary-context calls at 7000). */
CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width_bytes,
                         unsigned int height, unsigned int element_size);
CUresult cuMemFree(CUdeviceptr_v1 dptr);
CUresult cuMemAllocHost(void **pp, unsigned int bytesize);
CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray);
CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray);
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags);
CUresult cuCtxDetach(CUcontext ctx);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                          CUmemAllocationHandleType type, unsigned long long flags);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                            CUmemAllocationHandleType type,
                                            unsigned long long flags);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                CUmemPoolPtrExportData *shareData);
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop);
CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev);
CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                            CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
                            unsigned long long flags);
CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
                               CUmemGenericAllocationHandle memHandle, size_t memOffset,
                               size_t size, unsigned long long flags);
CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                             CUdeviceptr memptr, size_t size, unsigned long long flags);
CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                size_t mcOffset, CUdeviceptr memptr, size_t size,
                                unsigned long long flags);
CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
                           size_t size);
CUresult cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop,
                                   CUmulticastGranularity_flags option);
CUresult cuImportExternalMemory(CUexternalMemory *extMem_out,
                                const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *memHandleDesc);
CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *devPtr, CUexternalMemory extMem,
                                         const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *bufferDesc);
CUresult cuExternalMemoryGetMappedMipmappedArray(
    CUmipmappedArray *mipmap, CUexternalMemory extMem,
    const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC *mipmapDesc);
CUresult cuDestroyExternalMemory(CUexternalMemory extMem);
CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                          unsigned int flags);
CUresult cuGreenCtxDestroy(CUgreenCtx hCtx);
CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx);

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamDestroy(CUstream hStream);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                cuuint64_t *id_out);
CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                     cuuint64_t *id_out);
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                   cuuint64_t *id_out, CUgraph *graph_out,
                                   const CUgraphNode **dependencies_out,
                                   size_t *numDependencies_out);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **dependencies_out,
                                        size_t *numDependencies_out);
CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                   cuuint64_t *id_out, CUgraph *graph_out,
                                   const CUgraphNode **dependencies_out,
                                   const CUgraphEdgeData **edgeData_out,
                                   size_t *numDependencies_out);
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **dependencies_out,
                                        const CUgraphEdgeData **edgeData_out,
                                        size_t *numDependencies_out);
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr);
CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams);
CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                           const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                           size_t numDependencies, CUgraphNodeParams *nodeParams);
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags);
CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuDeviceGraphMemTrim(CUdevice device);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);
CUresult cuGetErrorName(CUresult error, const char **pstr);

#ifdef __cplusplus
}
#endif
/* ---- modules and libraries ---- */
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef int CUjit_option;
typedef int CUlibraryOption;
CUresult cuModuleLoad(CUmodule *module, const char *fname);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            CUjit_option *options, void **optionValues);
CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           CUlibraryOption *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions);
CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions);
CUresult cuLibraryUnload(CUlibrary library);

#endif
