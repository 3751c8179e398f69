//! The one table of every CUDA function cudaleak interposes, and the
//! identities it gives them.
//!
//! Each line gives the exported name, its C signature, and the event that
//! interprets the call (`hooks/events/`). [`for_each_cuda_hook!`] hands the
//! table to a macro (after memray's X-macro hook list); two read it:
//! - this file, for [`HookId`] (one variant per function), the names and
//!   layers: what `resolve`, `events` and the `dlsym` override need to
//!   know about a hook, low in the crate;
//! - `hooks/mod.rs`, at the top, for the exported functions themselves and
//!   [`hooks::hook_address`](crate::hooks): only there are the event
//!   expressions compiled.

/// Which library a hooked function belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// libcuda: one driver per process, though what a lookup hands out for
    /// a name may be a shim's function in front of it (a quota or
    /// GPU-sharing layer): a hook calls whichever the caller got
    /// (`resolve/global.rs`, `offer`).
    Driver,
    /// libcudart: its device reset and driver entry points; several
    /// copies may be loaded.
    Runtime,
}

/// Calls `$then! { ... }` with the table. The event expressions and
/// types are resolved where `$then` expands (`hooks/mod.rs`); `hook_address`
/// there is the hook's own exported address, handed out by lookups.
macro_rules! for_each_cuda_hook {
    ($then:ident) => {
        $then! {
            // Each driver line names, after `as`, the name and version by
            // which cuGetProcAddress hands the function out (`ptsz`: with
            // the per-thread default-stream flag): cudaTypedefs.h's
            // `PFN_<name>_v<version>[_ptsz]`, the name mapped to its symbol
            // by cuda.h's `#define cuX cuX_v2` (checked against the CUDA
            // 12.9 and 13.5 headers). Every variant of a hooked name is
            // here, v1 entry points included: NVIDIA's runtime still asks
            // for some of them (cuDevicePrimaryCtxReset at 7000,
            // cuIpcOpenMemHandle at 4010), and a lookup resolves to the
            // newest variant at or before the version asked
            // ([`HookId::for_entry_point`]).

            // ---- driver: allocations (recorded here, once per program call) ----
            Driver fn cuMemAlloc(dptr: *mut c_uint, size: c_uint) -> CUresult as cuMemAlloc @ 2000
                => Alloc::narrow(Api::cuMemAlloc, dptr, size as usize);
            Driver fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult as cuMemAlloc @ 3020
                => Alloc::new(Api::cuMemAlloc_v2, Device, dptr, size);
            Driver fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint,
                                      element_size: c_uint) -> CUresult as cuMemAllocPitch @ 2000
                => Alloc::pitched_narrow(dptr, pitch, width, height);
            Driver fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize,
                                         height: usize, element_size: c_uint) -> CUresult
                as cuMemAllocPitch @ 3020
                => Alloc::pitched(Api::cuMemAllocPitch_v2, dptr, pitch, width,
                                  height);
            Driver fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) -> CUresult
                as cuMemAllocManaged @ 6000
                => Alloc::new(Api::cuMemAllocManaged, Managed, dptr, size);
            Driver fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> CUresult
                as cuMemAllocAsync @ 11020
                => Alloc::stream_ordered(Api::cuMemAllocAsync, dptr, size, stream, false);
            Driver fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> CUresult
                as cuMemAllocAsync @ 11020 ptsz
                => Alloc::stream_ordered(Api::cuMemAllocAsync_ptsz, dptr, size,
                                         stream, true);
            Driver fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool,
                                              stream: CUstream) -> CUresult as cuMemAllocFromPoolAsync @ 11020
                => Alloc::stream_ordered(Api::cuMemAllocFromPoolAsync, dptr, size,
                                         stream, false);
            Driver fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool,
                                                   stream: CUstream) -> CUresult
                as cuMemAllocFromPoolAsync @ 11020 ptsz
                => Alloc::stream_ordered(Api::cuMemAllocFromPoolAsync_ptsz,
                                         dptr, size, stream, true);
            Driver fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) -> CUresult as cuMemAllocHost @ 2000
                => Alloc::new(Api::cuMemAllocHost, Host, pp.cast(), size as usize);
            Driver fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult as cuMemAllocHost @ 3020
                => Alloc::new(Api::cuMemAllocHost_v2, Host, pp.cast(), size);
            Driver fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> CUresult
                as cuMemHostAlloc @ 2020
                => Alloc::new(Api::cuMemHostAlloc, Host, pp.cast(), size);

            // ---- driver: releases ----
            Driver fn cuMemFree(dptr: c_uint) -> CUresult as cuMemFree @ 2000
                => Free::new(dptr as u64, FREES_DEVICE);
            Driver fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult as cuMemFree @ 3020
                => Free::new(dptr, FREES_DEVICE);
            Driver fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult as cuMemFreeAsync @ 11020
                => Free::stream_ordered(dptr, stream, false);
            Driver fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult
                as cuMemFreeAsync @ 11020 ptsz
                => Free::stream_ordered(dptr, stream, true);
            Driver fn cuMemFreeHost(p: *mut c_void) -> CUresult as cuMemFreeHost @ 2000
                => Free::new(p as u64, FREES_HOST);

            // ---- driver: host memory the program allocated, pinned ----
            Driver fn cuMemHostRegister(p: *mut c_void, size: usize, flags: c_uint) -> CUresult
                as cuMemHostRegister @ 4000
                => Alloc::registered(Api::cuMemHostRegister, p, size);
            Driver fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> CUresult
                as cuMemHostRegister @ 6050
                => Alloc::registered(Api::cuMemHostRegister_v2, p, size);
            Driver fn cuMemHostUnregister(p: *mut c_void) -> CUresult as cuMemHostUnregister @ 4000
                => Free::new(p as u64, FREES_REGISTERED);

            // ---- driver: virtual memory management (expandable segments) ----
            Driver fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize,
                                  prop: *const CUmemAllocationProp, flags: c_ulonglong) -> CUresult
                as cuMemCreate @ 10020
                => Alloc::physical(handle, size, prop);
            Driver fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult as cuMemRelease @ 10020
                => ReleaseHandle::new(handle);
            // One more reference to a mapped allocation's handle (NCCL,
            // PyTorch's expandable segments): paired with a cuMemRelease.
            Driver fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void)
                -> CUresult as cuMemRetainAllocationHandle @ 11000
                => Retain::new(handle);
            Driver fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize,
                               handle: CUmemGenericAllocationHandle, flags: c_ulonglong) -> CUresult
                as cuMemMap @ 10020
                => Map::new(ptr, size, handle);
            Driver fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult as cuMemUnmap @ 10020
                => Unmap::new(ptr, size);
            Driver fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize,
                                          addr: CUdeviceptr, flags: c_ulonglong) -> CUresult
                as cuMemAddressReserve @ 10020
                => Alloc::new(Api::cuMemAddressReserve, Reservation, ptr, size);
            Driver fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult as cuMemAddressFree @ 10020
                => Free::new(ptr, FREES_RESERVATION);

            // ---- driver: multicast objects (NVLink SHARP, NCCL), released by cuMemRelease ----
            Driver fn cuMulticastCreate(handle: *mut CUmemGenericAllocationHandle,
                                        prop: *const CUmulticastObjectProp) -> CUresult
                as cuMulticastCreate @ 12010
                => Alloc::new(Api::cuMulticastCreate, Multicast, handle,
                              multicast_bytes(prop));
            // A bind keeps the bound memory alive, as a mapping does.
            Driver fn cuMulticastBindMem(mc: CUmemGenericAllocationHandle, mc_offset: usize,
                                         mem: CUmemGenericAllocationHandle, mem_offset: usize, size: usize,
                                         flags: c_ulonglong) -> CUresult as cuMulticastBindMem @ 12010
                => Bind::handle(mc, -1, mc_offset, mem);
            Driver fn cuMulticastBindMem_v2(mc: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: usize,
                                            mem: CUmemGenericAllocationHandle, mem_offset: usize, size: usize,
                                            flags: c_ulonglong) -> CUresult as cuMulticastBindMem @ 13010
                => Bind::handle(mc, dev, mc_offset, mem);
            Driver fn cuMulticastBindAddr(mc: CUmemGenericAllocationHandle, mc_offset: usize,
                                          memptr: CUdeviceptr, size: usize, flags: c_ulonglong) -> CUresult
                as cuMulticastBindAddr @ 12010
                => Bind::address(mc, -1, mc_offset, memptr);
            Driver fn cuMulticastBindAddr_v2(mc: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: usize,
                                             memptr: CUdeviceptr, size: usize, flags: c_ulonglong) -> CUresult
                as cuMulticastBindAddr @ 13010
                => Bind::address(mc, dev, mc_offset, memptr);
            Driver fn cuMulticastUnbind(mc: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: usize,
                                        size: usize) -> CUresult as cuMulticastUnbind @ 12010
                => McUnbind::new(mc, dev, mc_offset, size);

            // ---- driver: CUDA arrays (textures, surfaces) ----
            Driver fn cuArrayCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult
                as cuArrayCreate @ 2000
                => Alloc::new(Api::cuArrayCreate, Array, handle.cast(),
                              array_2d_bytes_v1(desc));
            Driver fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult
                as cuArrayCreate @ 3020
                => Alloc::new(Api::cuArrayCreate_v2, Array, handle.cast(),
                              array_2d_bytes(desc));
            Driver fn cuArray3DCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult
                as cuArray3DCreate @ 2000
                => Alloc::new(Api::cuArray3DCreate, Array, handle.cast(),
                              array_3d_bytes_v1(desc));
            Driver fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult
                as cuArray3DCreate @ 3020
                => Alloc::new(Api::cuArray3DCreate_v2, Array, handle.cast(),
                              array_3d_bytes(desc, 1));
            Driver fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR,
                                             levels: c_uint) -> CUresult as cuMipmappedArrayCreate @ 5000
                => Alloc::new(Api::cuMipmappedArrayCreate, Array,
                              handle.cast(), array_3d_bytes(desc, levels));
            Driver fn cuArrayDestroy(array: CUarray) -> CUresult as cuArrayDestroy @ 2000
                => Free::new(array as u64, FREES_ARRAY);
            Driver fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult
                as cuMipmappedArrayDestroy @ 5000
                => Free::new(array as u64, FREES_MIPMAPPED);

            // ---- driver: memory allocated elsewhere, opened here (DDP, NCCL, torch IPC, Vulkan) ----
            Driver fn cuIpcOpenMemHandle(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
                -> CUresult as cuIpcOpenMemHandle @ 4010
                => Alloc::imported(Api::cuIpcOpenMemHandle, dptr);
            Driver fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
                -> CUresult as cuIpcOpenMemHandle @ 11000
                => Alloc::imported(Api::cuIpcOpenMemHandle_v2, dptr);
            Driver fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult as cuIpcCloseMemHandle @ 4010
                => Free::new(dptr, FREES_IPC);
            // Its size is not known (no query takes a bare handle): recorded as 0
            // bytes; released by cuMemRelease like a cuMemCreate handle.
            Driver fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle,
                                                     os_handle: *mut c_void, handle_type: c_int) -> CUresult
                as cuMemImportFromShareableHandle @ 10020
                => Alloc::new(Api::cuMemImportFromShareableHandle,
                              Imported, handle, 0);
            // Freed with cuMemFree(Async), like the pool's own blocks.
            Driver fn cuMemPoolImportPointer(dptr: *mut CUdeviceptr, pool: CUmemoryPool, share: *mut c_void)
                -> CUresult as cuMemPoolImportPointer @ 11020
                => Alloc::imported(Api::cuMemPoolImportPointer, dptr);
            Driver fn cuImportExternalMemory(ext: *mut CUexternalMemory,
                                             desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC) -> CUresult
                as cuImportExternalMemory @ 10000
                => Alloc::new(Api::cuImportExternalMemory, Imported,
                              ext.cast(), external_bytes(desc));
            Driver fn cuDestroyExternalMemory(ext: CUexternalMemory) -> CUresult
                as cuDestroyExternalMemory @ 10000
                => Free::new(ext as u64, FREES_EXTERNAL);
            // Freed with cuMemFree and cuMipmappedArrayDestroy.
            Driver fn cuExternalMemoryGetMappedBuffer(dptr: *mut CUdeviceptr, ext: CUexternalMemory,
                                                      desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC) -> CUresult
                as cuExternalMemoryGetMappedBuffer @ 10000
                => Alloc::new(Api::cuExternalMemoryGetMappedBuffer,
                              Imported, dptr, external_buffer_bytes(desc));
            Driver fn cuExternalMemoryGetMappedMipmappedArray(
                array: *mut CUmipmappedArray, ext: CUexternalMemory,
                desc: *const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC) -> CUresult
                as cuExternalMemoryGetMappedMipmappedArray @ 10000
                => Alloc::new(Api::cuExternalMemoryGetMappedMipmappedArray, Imported, array.cast(),
                              external_mipmap_bytes(desc));

            // ---- driver: stream-ordered memory pools (the pool itself) ----
            Driver fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const c_void) -> CUresult
                as cuMemPoolCreate @ 11020
                => Alloc::new(Api::cuMemPoolCreate, Pool, pool.cast(), 0);
            // A pool another process shared: this process's to destroy.
            Driver fn cuMemPoolImportFromShareableHandle(pool: *mut CUmemoryPool, handle: *mut c_void,
                                                         handle_type: c_int, flags: c_ulonglong) -> CUresult
                as cuMemPoolImportFromShareableHandle @ 11020
                => Alloc::new(Api::cuMemPoolImportFromShareableHandle,
                              Pool, pool.cast(), 0);
            Driver fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult as cuMemPoolDestroy @ 11020
                => Free::new(pool as u64, FREES_POOL);

            // ---- driver: context teardown ----
            Driver fn cuCtxDestroy(ctx: CUcontext) -> CUresult as cuCtxDestroy @ 2000
                => ContextEvent::destroy(ctx);
            Driver fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult as cuCtxDestroy @ 4000
                => ContextEvent::destroy(ctx);
            // CUDA 2.0's usage count: the last cuCtxDetach destroys the context.
            Driver fn cuCtxAttach(pctx: *mut CUcontext, flags: c_uint) -> CUresult as cuCtxAttach @ 2000
                => ContextEvent::attach(pctx);
            Driver fn cuCtxDetach(ctx: CUcontext) -> CUresult as cuCtxDetach @ 2000
                => ContextEvent::detach(ctx);
            Driver fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult
                as cuDevicePrimaryCtxRetain @ 7000
                => ContextEvent::primary_retain(pctx, dev);
            Driver fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult as cuDevicePrimaryCtxRelease @ 7000
                => ContextEvent::primary_release(dev);
            Driver fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult
                as cuDevicePrimaryCtxRelease @ 11000
                => ContextEvent::primary_release(dev);
            Driver fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult as cuDevicePrimaryCtxReset @ 7000
                => ContextEvent::primary_reset(HookId::cuDevicePrimaryCtxReset, dev);
            Driver fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult as cuDevicePrimaryCtxReset @ 11000
                => ContextEvent::primary_reset(HookId::cuDevicePrimaryCtxReset_v2, dev);
            // A green context owns no memory: it holds a reference to its
            // device's primary context, whose memory is what it allocates.
            Driver fn cuGreenCtxCreate(phctx: *mut CUgreenCtx, desc: *mut c_void, dev: CUdevice, flags: c_uint)
                -> CUresult as cuGreenCtxCreate @ 12040
                => ContextEvent::green_create(phctx, dev);
            Driver fn cuGreenCtxDestroy(green: CUgreenCtx) -> CUresult as cuGreenCtxDestroy @ 12040
                => ContextEvent::green_destroy(green);
            Driver fn cuCtxFromGreenCtx(pctx: *mut CUcontext, green: CUgreenCtx) -> CUresult
                as cuCtxFromGreenCtx @ 12040
                => ContextEvent::green_context(pctx, green);

            // ---- driver: graph memory and stream capture (`state/graphs.rs`) ----
            Driver fn cuStreamBeginCapture(stream: CUstream) -> CUresult as cuStreamBeginCapture @ 10000
                => CaptureBegin(stream, false, true);
            Driver fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult
                as cuStreamBeginCapture @ 10000 ptsz
                => CaptureBegin(stream, true, true);
            Driver fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult
                as cuStreamBeginCapture @ 10010
                => CaptureBegin(stream, false, true);
            Driver fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult
                as cuStreamBeginCapture @ 10010 ptsz
                => CaptureBegin(stream, true, true);
            Driver fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode,
                                                  edges: *const c_void, count: usize, mode: c_int) -> CUresult
                as cuStreamBeginCaptureToGraph @ 12030
                => CaptureBegin(stream, false, false);
            Driver fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode,
                                                       edges: *const c_void, count: usize, mode: c_int)
                -> CUresult as cuStreamBeginCaptureToGraph @ 12030 ptsz
                => CaptureBegin(stream, true, false);
            Driver fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult
                as cuStreamEndCapture @ 10000
                => CaptureEnd(stream, false);
            Driver fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult
                as cuStreamEndCapture @ 10000 ptsz
                => CaptureEnd(stream, true);
            Driver fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) -> CUresult as cuGraphCreate @ 10000
                => GraphCreate(graph);
            Driver fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode,
                                             count: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult
                as cuGraphAddMemAllocNode @ 11040
                => GraphNode::Alloc(Api::cuGraphAddMemAllocNode, graph, params);
            Driver fn cuGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode,
                                            count: usize, dptr: CUdeviceptr) -> CUresult
                as cuGraphAddMemFreeNode @ 11040
                => GraphNode::Free(graph, dptr);
            Driver fn cuGraphAddNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize,
                                     params: *mut CUgraphNodeParams) -> CUresult as cuGraphAddNode @ 12020
                => GraphNode::Generic(Api::cuGraphAddNode, graph, params);
            Driver fn cuGraphAddNode_v2(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode,
                                        edges: *const c_void, count: usize, params: *mut CUgraphNodeParams)
                -> CUresult as cuGraphAddNode @ 12030
                => GraphNode::Generic(Api::cuGraphAddNode_v2, graph, params);
            Driver fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode,
                                         log: *mut c_char, log_size: usize) -> CUresult
                as cuGraphInstantiate @ 10000
                => GraphInstantiate(exec, graph, InstantiateFlags::None);
            Driver fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode,
                                            log: *mut c_char, log_size: usize) -> CUresult
                as cuGraphInstantiate @ 11000
                => GraphInstantiate(exec, graph, InstantiateFlags::None);
            Driver fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong)
                -> CUresult as cuGraphInstantiateWithFlags @ 11040
                => GraphInstantiate(exec, graph, InstantiateFlags::Flags(flags));
            Driver fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph,
                                                   params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult
                as cuGraphInstantiateWithParams @ 12000
                => GraphInstantiate(exec, graph, InstantiateFlags::Params(params));
            Driver fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph,
                                                        params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult
                as cuGraphInstantiateWithParams @ 12000 ptsz
                => GraphInstantiate(exec, graph, InstantiateFlags::Params(params));
            Driver fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult as cuGraphLaunch @ 10000
                => GraphLaunch(exec, stream, false);
            Driver fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult
                as cuGraphLaunch @ 10000 ptsz
                => GraphLaunch(exec, stream, true);
            Driver fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult as cuGraphExecDestroy @ 10000
                => GraphGone::Exec(exec);
            Driver fn cuGraphDestroy(graph: CUgraph) -> CUresult as cuGraphDestroy @ 10000
                => GraphGone::Graph(graph);

            // ---- driver: modules and libraries (their device globals) ----
            Driver fn cuModuleLoad(module: *mut *mut c_void, fname: *const c_char) -> CUresult
                as cuModuleLoad @ 2000
                => ModuleLoad { api: Api::cuModuleLoad, out: module, image: ModuleImage::File(fname) };
            Driver fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> CUresult
                as cuModuleLoadData @ 2000
                => ModuleLoad { api: Api::cuModuleLoadData, out: module, image: ModuleImage::Data(image) };
            Driver fn cuModuleLoadDataEx(module: *mut *mut c_void, image: *const c_void, count: c_uint,
                                         options: *mut c_int, values: *mut *mut c_void) -> CUresult
                as cuModuleLoadDataEx @ 2010
                => ModuleLoad { api: Api::cuModuleLoadDataEx, out: module, image: ModuleImage::Data(image) };
            Driver fn cuModuleLoadFatBinary(module: *mut *mut c_void, fatbin: *const c_void) -> CUresult
                as cuModuleLoadFatBinary @ 2000
                => ModuleLoad { api: Api::cuModuleLoadFatBinary, out: module, image: ModuleImage::Data(fatbin) };
            Driver fn cuModuleUnload(module: *mut c_void) -> CUresult as cuModuleUnload @ 2000
                => ModuleUnload(module);
            Driver fn cuLibraryLoadData(library: *mut *mut c_void, code: *const c_void, jit_options: *mut c_int,
                                        jit_values: *mut *mut c_void, jit_count: c_uint,
                                        library_options: *mut c_int, library_values: *mut *mut c_void,
                                        library_count: c_uint) -> CUresult
                as cuLibraryLoadData @ 12000
                => ModuleLoad { api: Api::cuLibraryLoadData, out: library, image: ModuleImage::Data(code) };
            Driver fn cuLibraryLoadFromFile(library: *mut *mut c_void, fname: *const c_char, jit_options: *mut c_int,
                                            jit_values: *mut *mut c_void, jit_count: c_uint,
                                            library_options: *mut c_int, library_values: *mut *mut c_void,
                                            library_count: c_uint) -> CUresult
                as cuLibraryLoadFromFile @ 12000
                => ModuleLoad { api: Api::cuLibraryLoadFromFile, out: library, image: ModuleImage::File(fname) };
            Driver fn cuLibraryUnload(library: *mut c_void) -> CUresult as cuLibraryUnload @ 12000
                => ModuleUnload(library);

            // ---- driver: entry-point lookup (JAX/XLA, NCCL, the runtime itself) ----
            Driver fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int,
                                       flags: cuuint64_t) -> CUresult as cuGetProcAddress @ 11030
                => EntryPoint::new(symbol, pfn, version, flags, HANDOUTS);
            Driver fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int,
                                          flags: cuuint64_t, status: *mut c_int) -> CUresult
                as cuGetProcAddress @ 12000
                => EntryPoint::new(symbol, pfn, version, flags, HANDOUTS);
            // Exported by the driver, but no version of "cuGetProcAddress" resolves to it.
            Driver fn cuGetProcAddress_v2_ptsz(symbol: *const c_char, pfn: *mut *mut c_void,
                                               version: c_int, flags: cuuint64_t,
                                               status: *mut c_int) -> CUresult
                => EntryPoint::new(symbol, pfn, version, flags, HANDOUTS);

            // ---- runtime: what only the runtime does ----
            // Its allocations and releases are recorded once, at the driver
            // call each makes, and named by the runtime function on the
            // stack when the report is written (`assemble/merge.rs`,
            // RUNTIME_ATTRIBUTION). These stay: a reset tears down what the
            // device held, and the driver entry points it hands out must be
            // ours.
            Runtime fn cudaDeviceReset() -> cudaError_t
                => RuntimeReset;
            Runtime fn cudaGetDriverEntryPoint(symbol: *const c_char, pfn: *mut *mut c_void,
                                               flags: c_ulonglong, status: *mut c_int) -> cudaError_t
                => EntryPoint::new(symbol, pfn, 0, flags, HANDOUTS);
            Runtime fn cudaGetDriverEntryPointByVersion(symbol: *const c_char, pfn: *mut *mut c_void,
                                                        version: c_uint, flags: c_ulonglong,
                                                        status: *mut c_int) -> cudaError_t
                => EntryPoint::new(symbol, pfn, version as c_int, flags, HANDOUTS);
        }
    };
}
pub(crate) use for_each_cuda_hook;

/// [`HookId`] and its tables, from the hook table.
macro_rules! hook_ids {
    ($(
        $layer:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            $(as $base:ident @ $since:literal $($per_thread:ident)?)?
            => $event:expr;
    )*) => {
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum HookId { $($name),* }

        pub const HOOK_COUNT: usize = [$(stringify!($name)),*].len();

        pub static HOOK_NAMES: [&str; HOOK_COUNT] = [$(stringify!($name)),*];

        /// The same names as C strings, for the loader's lookups.
        pub static HOOK_C_NAMES: [&std::ffi::CStr; HOOK_COUNT] = [$(
            match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => panic!("a hook name with a NUL byte"),
            }
        ),*];

        pub static HOOK_LAYERS: [Layer; HOOK_COUNT] = [$(Layer::$layer),*];

        pub static ALL_HOOKS: [HookId; HOOK_COUNT] = [$(HookId::$name),*];

        /// The name, version and per-thread flag by which cuGetProcAddress
        /// hands each hook's function out (None: by none).
        pub static HOOK_ENTRY_POINTS: [Option<EntryPointName>; HOOK_COUNT] = [$(
            entry_point_name!($($base, $since $(, $per_thread)?)?)
        ),*];
    };
}

/// How cuGetProcAddress names a function: "cuMemAlloc" at 3020 is
/// cuMemAlloc_v2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPointName {
    pub name: &'static str,
    pub since: std::ffi::c_int,
    /// the `_ptsz`/`_ptds` variant, for the per-thread default-stream flag
    pub per_thread: bool,
}

macro_rules! entry_point_name {
    () => {
        None
    };
    ($base:ident, $since:literal) => {
        Some(EntryPointName {
            name: stringify!($base),
            since: $since,
            per_thread: false,
        })
    };
    ($base:ident, $since:literal, ptsz) => {
        Some(EntryPointName {
            name: stringify!($base),
            since: $since,
            per_thread: true,
        })
    };
}

for_each_cuda_hook!(hook_ids);

/// The driver calls by which the runtime's cudaDeviceReset tears the
/// device's primary context down, so that the driver hook knows the
/// runtime hook on its thread is its caller. The v1 variant is there for a
/// runtime that asks for it (by version, at cuGetProcAddress).
pub const RUNTIME_DEVICE_RESET: &[HookId] = &[
    HookId::cuDevicePrimaryCtxReset_v2,
    HookId::cuDevicePrimaryCtxReset,
];

impl HookId {
    pub fn name(self) -> &'static str {
        HOOK_NAMES[self as usize]
    }

    pub fn c_name(self) -> &'static std::ffi::CStr {
        HOOK_C_NAMES[self as usize]
    }

    pub fn layer(self) -> Layer {
        HOOK_LAYERS[self as usize]
    }

    /// How cuGetProcAddress names this hook's function, if it does.
    pub fn entry_point_name(self) -> Option<EntryPointName> {
        HOOK_ENTRY_POINTS[self as usize]
    }

    /// The hook for what `cuGetProcAddress(name, version, flags)` returns,
    /// by the driver's rules: the newest variant of `name` introduced at
    /// or before `version`; with the per-thread default-stream flag, the
    /// newest such `_ptsz` variant when the name has one. Every variant of
    /// a hooked name is in the table, so this is the driver's own answer
    /// whenever it is a hook. Called for each lookup (NVIDIA's runtime makes
    /// about 420 at start-up): a scan of the table, no allocation.
    pub fn for_entry_point(name: &[u8], version: std::ffi::c_int, flags: u64) -> Option<HookId> {
        let per_thread = flags & crate::cuda::ffi::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
        // (version introduced, hook) of the newest variant so far
        type Newest = Option<(std::ffi::c_int, HookId)>;
        let (mut plain, mut threaded): (Newest, Newest) = (None, None);
        // By reference: `for id in ALL_HOOKS` copied the whole table onto
        // the stack (8 bytes a hook) of every lookup, which the runtime's
        // first call makes from wherever the program's thread is.
        for &id in ALL_HOOKS.iter() {
            let Some(e) = id.entry_point_name() else { continue };
            if e.name.as_bytes() != name || e.since > version {
                continue;
            }
            let slot = if e.per_thread { &mut threaded } else { &mut plain };
            if slot.is_none_or(|(since, _)| since < e.since) {
                *slot = Some((e.since, id));
            }
        }
        match (per_thread, threaded) {
            (true, Some((_, id))) => Some(id),
            _ => plain.map(|(_, id)| id),
        }
    }

    /// The hook for an exported name, without allocating: used by the
    /// `dlsym` override on every lookup the process makes.
    pub fn by_name(name: &[u8]) -> Option<HookId> {
        // Cheap reject first: every hooked name starts with "cu".
        if name.len() < 6 || name[0] != b'c' || name[1] != b'u' {
            return None;
        }
        HOOK_NAMES
            .iter()
            .position(|n| n.as_bytes() == name)
            .map(|i| ALL_HOOKS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_agree() {
        for (i, id) in ALL_HOOKS.iter().enumerate() {
            assert_eq!(*id as usize, i);
            assert_eq!(HookId::by_name(id.name().as_bytes()), Some(*id));
        }
    }

    #[test]
    fn only_wrapped_names_match() {
        for other in [
            "cudnnCreate",
            "cublasCreate_v2",
            "curl_easy_init",
            "cuMemcpy",
            "cuMemAlloc_v3",
            "cudaMallocArrayX",
            "cuArrayCreate_v3",
            "cuInit",
            "cu",
            "",
        ] {
            assert_eq!(HookId::by_name(other.as_bytes()), None, "{other}");
        }
        // the runtime's allocations are recorded at the driver: not wrapped
        assert_eq!(HookId::by_name(b"cudaMalloc"), None);
        assert_eq!(HookId::by_name(b"cudaDeviceReset"), Some(HookId::cudaDeviceReset));
        // the v1 entry points NVIDIA's driver still exports are wrapped too
        assert_eq!(HookId::by_name(b"cuMemAlloc"), Some(HookId::cuMemAlloc));
        assert_eq!(HookId::by_name(b"cuArrayCreate"), Some(HookId::cuArrayCreate));
    }

    #[test]
    fn versioned_names_follow_the_driver_rules() {
        let at = |name: &str, version, flags| HookId::for_entry_point(name.as_bytes(), version, flags);
        let pt = crate::cuda::ffi::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        assert_eq!(at("cuMemAlloc", 3020, 0), Some(HookId::cuMemAlloc_v2));
        assert_eq!(at("cuMemAlloc", 12040, 0), Some(HookId::cuMemAlloc_v2));
        assert_eq!(at("cuMemAlloc", 3010, 0), Some(HookId::cuMemAlloc));
        assert_eq!(at("cuMemAlloc", 1000, 0), None);
        assert_eq!(
            at("cuMemAllocAsync", 12000, pt),
            Some(HookId::cuMemAllocAsync_ptsz)
        );
        assert_eq!(at("cuMemAllocAsync", 11020, 0), Some(HookId::cuMemAllocAsync));
        // the flag selects a variant only where the name has one
        assert_eq!(at("cuMemFree", 11020, pt), Some(HookId::cuMemFree_v2));
        assert_eq!(
            at("cuGetProcAddress", 12000, 0),
            Some(HookId::cuGetProcAddress_v2)
        );
        assert_eq!(at("cuGetProcAddress", 11080, 0), Some(HookId::cuGetProcAddress));
        assert_eq!(
            at("cuDevicePrimaryCtxReset", 7000, 0),
            Some(HookId::cuDevicePrimaryCtxReset)
        );
        assert_eq!(
            at("cuDevicePrimaryCtxReset", 10020, 0),
            Some(HookId::cuDevicePrimaryCtxReset)
        );
        assert_eq!(
            at("cuDevicePrimaryCtxReset", 11000, 0),
            Some(HookId::cuDevicePrimaryCtxReset_v2)
        );
        assert_eq!(
            at("cuDevicePrimaryCtxRelease", 7000, 0),
            Some(HookId::cuDevicePrimaryCtxRelease)
        );
        assert_eq!(
            at("cuIpcOpenMemHandle", 4010, 0),
            Some(HookId::cuIpcOpenMemHandle)
        );
        assert_eq!(
            at("cuIpcOpenMemHandle", 11000, 0),
            Some(HookId::cuIpcOpenMemHandle_v2)
        );
        assert_eq!(
            at("cuMemHostRegister", 6050, 0),
            Some(HookId::cuMemHostRegister_v2)
        );
        assert_eq!(
            at("cuMulticastBindMem", 13010, 0),
            Some(HookId::cuMulticastBindMem_v2)
        );
        assert_eq!(
            at("cuMulticastBindMem", 13000, 0),
            Some(HookId::cuMulticastBindMem)
        );
        assert_eq!(at("cuCtxDestroy", 3020, 0), Some(HookId::cuCtxDestroy));
        assert_eq!(at("cuMemcpy", 12000, 0), None);
        assert_eq!(at("cublasCreate", 12000, 0), None);
        // a _v2 symbol name is no entry-point name
        assert_eq!(at("cuMemAlloc_v2", 12000, 0), None);
    }

    #[test]
    fn every_driver_hook_but_one_has_an_entry_point_name_and_no_runtime_hook_has() {
        for id in ALL_HOOKS {
            let named = id.entry_point_name().is_some();
            let want = id.layer() == Layer::Driver && id != HookId::cuGetProcAddress_v2_ptsz;
            assert_eq!(named, want, "{}", id.name());
            if let Some(e) = id.entry_point_name() {
                // the symbol is the name, or the name with a suffix
                assert!(id.name().starts_with(e.name), "{}", id.name());
                assert_eq!(e.per_thread, id.name().ends_with("_ptsz"), "{}", id.name());
            }
        }
    }

    #[test]
    fn layers_follow_names() {
        for id in ALL_HOOKS {
            let runtime = id.name().starts_with("cuda");
            assert_eq!(id.layer() == Layer::Runtime, runtime, "{}", id.name());
        }
    }
}
