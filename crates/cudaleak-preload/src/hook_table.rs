//! The one table of every CUDA function cudaleak interposes, and the
//! identities it gives them.
//!
//! Each line gives the exported name, its C signature, and the event that
//! interprets the call (`events.rs`). [`for_each_cuda_hook!`] hands the
//! table to a macro (after memray's X-macro hook list); two read it:
//! - this file, for [`HookId`] (one variant per function), the names and
//!   layers: what `resolve`, `events` and the `dlsym` override need to
//!   know about a hook, low in the crate;
//! - `hooks.rs`, at the top, for the exported functions themselves and
//!   [`hooks::hook_address`](crate::hooks): only there are the event
//!   expressions compiled.

/// Which library a hooked function belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// libcuda: one implementation per process, so any address the driver
    /// hands out for a name is interchangeable with any other.
    Driver,
    /// libcudart: attribution only; several copies may be loaded.
    Runtime,
}

/// Calls `$then! { ... }` with the table. The event expressions and
/// types are resolved where `$then` expands (`hooks.rs`); `hook_address`
/// there is the hook's own exported address, handed out by lookups.
macro_rules! for_each_cuda_hook {
    ($then:ident) => {
        $then! {
            // ---- driver: allocations (recorded here, once per program call) ----
            Driver fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult
                => Alloc::new(HookId::cuMemAlloc_v2, Api::cuMemAlloc_v2, Device, dptr, size);
            Driver fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize,
                                         height: usize, element_size: c_uint) -> CUresult
                => Alloc::pitched(HookId::cuMemAllocPitch_v2, Api::cuMemAllocPitch_v2, dptr, pitch, width,
                                  height);
            Driver fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) -> CUresult
                => Alloc::new(HookId::cuMemAllocManaged, Api::cuMemAllocManaged, Managed, dptr, size);
            Driver fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> CUresult
                => Alloc::new(HookId::cuMemAllocAsync, Api::cuMemAllocAsync, Device, dptr, size);
            Driver fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> CUresult
                => Alloc::new(HookId::cuMemAllocAsync_ptsz, Api::cuMemAllocAsync_ptsz, Device, dptr, size);
            Driver fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool,
                                              stream: CUstream) -> CUresult
                => Alloc::new(HookId::cuMemAllocFromPoolAsync, Api::cuMemAllocFromPoolAsync, Device, dptr, size);
            Driver fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool,
                                                   stream: CUstream) -> CUresult
                => Alloc::new(HookId::cuMemAllocFromPoolAsync_ptsz, Api::cuMemAllocFromPoolAsync_ptsz,
                              Device, dptr, size);
            Driver fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult
                => Alloc::new(HookId::cuMemAllocHost_v2, Api::cuMemAllocHost_v2, Host, pp.cast(), size);
            Driver fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> CUresult
                => Alloc::new(HookId::cuMemHostAlloc, Api::cuMemHostAlloc, Host, pp.cast(), size);

            // ---- driver: releases ----
            Driver fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult
                => Free::new(HookId::cuMemFree_v2, dptr, FREES_DEVICE);
            Driver fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult
                => Free::new(HookId::cuMemFreeAsync, dptr, FREES_DEVICE);
            Driver fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult
                => Free::new(HookId::cuMemFreeAsync_ptsz, dptr, FREES_DEVICE);
            Driver fn cuMemFreeHost(p: *mut c_void) -> CUresult
                => Free::new(HookId::cuMemFreeHost, p as u64, FREES_HOST);

            // ---- driver: virtual memory management (expandable segments) ----
            Driver fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize,
                                  prop: *const CUmemAllocationProp, flags: c_ulonglong) -> CUresult
                => Alloc::physical(HookId::cuMemCreate, handle, size, prop);
            Driver fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult
                => Release::new(handle);
            Driver fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize,
                               handle: CUmemGenericAllocationHandle, flags: c_ulonglong) -> CUresult
                => Map::new(ptr, size, handle);
            Driver fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult
                => Unmap::new(ptr, size);
            Driver fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize,
                                          addr: CUdeviceptr, flags: c_ulonglong) -> CUresult
                => Alloc::new(HookId::cuMemAddressReserve, Api::cuMemAddressReserve, Reservation, ptr, size);
            Driver fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult
                => Free::new(HookId::cuMemAddressFree, ptr, FREES_RESERVATION);

            // ---- driver: CUDA arrays (textures, surfaces) ----
            Driver fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult
                => Alloc::new(HookId::cuArrayCreate_v2, Api::cuArrayCreate_v2, Array, handle.cast(),
                              array_2d_bytes(desc));
            Driver fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult
                => Alloc::new(HookId::cuArray3DCreate_v2, Api::cuArray3DCreate_v2, Array, handle.cast(),
                              array_3d_bytes(desc, 1));
            Driver fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR,
                                             levels: c_uint) -> CUresult
                => Alloc::new(HookId::cuMipmappedArrayCreate, Api::cuMipmappedArrayCreate, Array,
                              handle.cast(), array_3d_bytes(desc, levels));
            Driver fn cuArrayDestroy(array: CUarray) -> CUresult
                => Free::new(HookId::cuArrayDestroy, array as u64, FREES_ARRAY);
            Driver fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult
                => Free::new(HookId::cuMipmappedArrayDestroy, array as u64, FREES_ARRAY);

            // ---- driver: memory opened from another process (DDP, NCCL, torch IPC) ----
            Driver fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult
                => Alloc::imported(HookId::cuIpcOpenMemHandle_v2, dptr);
            Driver fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult
                => Free::new(HookId::cuIpcCloseMemHandle, dptr, FREES_IMPORTED);
            // Its size is not known (no query takes a bare handle): recorded as 0
            // bytes; released by cuMemRelease like a cuMemCreate handle.
            Driver fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle,
                                                     os_handle: *mut c_void, handle_type: c_int) -> CUresult
                => Alloc::new(HookId::cuMemImportFromShareableHandle, Api::cuMemImportFromShareableHandle,
                              Imported, handle, 0);

            // ---- driver: stream-ordered memory pools (the pool itself) ----
            Driver fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const c_void) -> CUresult
                => Alloc::new(HookId::cuMemPoolCreate, Api::cuMemPoolCreate, Pool, pool.cast(), 0);
            Driver fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult
                => Free::new(HookId::cuMemPoolDestroy, pool as u64, FREES_POOL);

            // ---- driver: context teardown ----
            Driver fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult
                => ContextEvent::destroy(ctx);
            Driver fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult
                => ContextEvent::primary_retain(pctx, dev);
            Driver fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult
                => ContextEvent::primary_release(dev);
            Driver fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult
                => ContextEvent::primary_reset(dev);

            // ---- driver: entry-point lookup (JAX/XLA, NCCL, the runtime itself) ----
            Driver fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int,
                                       flags: cuuint64_t) -> CUresult
                => EntryPoint::new(symbol, pfn, version, flags, hook_address);
            Driver fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int,
                                          flags: cuuint64_t, status: *mut c_int) -> CUresult
                => EntryPoint::new(symbol, pfn, version, flags, hook_address);
            Driver fn cuGetProcAddress_v2_ptsz(symbol: *const c_char, pfn: *mut *mut c_void,
                                               version: c_int, flags: cuuint64_t,
                                               status: *mut c_int) -> CUresult
                => EntryPoint::new(symbol, pfn, version, flags, hook_address);

            // ---- runtime: attribution to the call the program made ----
            Runtime fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMalloc, Device, RUNTIME_MALLOC, ptr.cast(), RtSize::Bytes(size));
            Runtime fn cudaMallocAsync(ptr: *mut *mut c_void, size: usize, stream: CUstream) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocAsync, Device, RUNTIME_MALLOC_ASYNC, ptr.cast(),
                                     RtSize::Bytes(size));
            Runtime fn cudaMallocAsync_ptsz(ptr: *mut *mut c_void, size: usize, stream: CUstream) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocAsync_ptsz, Device, RUNTIME_MALLOC_ASYNC, ptr.cast(),
                                     RtSize::Bytes(size));
            Runtime fn cudaMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, pool: CUmemoryPool,
                                               stream: CUstream) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocFromPoolAsync, Device, RUNTIME_MALLOC_FROM_POOL,
                                     ptr.cast(), RtSize::Bytes(size));
            Runtime fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocHost, Host, RUNTIME_MALLOC_HOST, ptr.cast(),
                                     RtSize::Bytes(size));
            Runtime fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaHostAlloc, Host, RUNTIME_MALLOC_HOST, ptr.cast(),
                                     RtSize::Bytes(size));
            Runtime fn cudaMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocManaged, Managed, RUNTIME_MALLOC_MANAGED, ptr.cast(),
                                     RtSize::Bytes(size));
            Runtime fn cudaMallocPitch(ptr: *mut *mut c_void, pitch: *mut usize, width: usize,
                                       height: usize) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocPitch, Device, RUNTIME_MALLOC_PITCH, ptr.cast(),
                                     RtSize::pitch(pitch, width, height));
            Runtime fn cudaMalloc3D(pitched: *mut cudaPitchedPtr, extent: cudaExtent) -> cudaError_t
                => RuntimeAlloc::pitched_3d(pitched, extent);
            Runtime fn cudaFree(ptr: *mut c_void) -> cudaError_t
                => RuntimeFree::new(ptr as u64, RUNTIME_FREE, FREES_DEVICE);
            Runtime fn cudaFreeAsync(ptr: *mut c_void, stream: CUstream) -> cudaError_t
                => RuntimeFree::new(ptr as u64, RUNTIME_FREE_ASYNC, FREES_DEVICE);
            Runtime fn cudaFreeAsync_ptsz(ptr: *mut c_void, stream: CUstream) -> cudaError_t
                => RuntimeFree::new(ptr as u64, RUNTIME_FREE_ASYNC, FREES_DEVICE);
            Runtime fn cudaFreeHost(ptr: *mut c_void) -> cudaError_t
                => RuntimeFree::new(ptr as u64, RUNTIME_FREE_HOST, FREES_HOST);
            Runtime fn cudaMallocArray(array: *mut CUarray, desc: *const cudaChannelFormatDesc, width: usize,
                                       height: usize, flags: c_uint) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocArray, Array, RUNTIME_MALLOC_ARRAY, array.cast(),
                                     runtime_array_bytes(desc, cudaExtent { width, height, depth: 0 }, 1));
            Runtime fn cudaMalloc3DArray(array: *mut CUarray, desc: *const cudaChannelFormatDesc,
                                         extent: cudaExtent, flags: c_uint) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMalloc3DArray, Array, RUNTIME_MALLOC_ARRAY, array.cast(),
                                     runtime_array_bytes(desc, extent, 1));
            Runtime fn cudaMallocMipmappedArray(array: *mut CUmipmappedArray, desc: *const cudaChannelFormatDesc,
                                                extent: cudaExtent, levels: c_uint, flags: c_uint) -> cudaError_t
                => RuntimeAlloc::new(Api::cudaMallocMipmappedArray, Array, RUNTIME_MALLOC_MIPMAPPED,
                                     array.cast(), runtime_array_bytes(desc, extent, levels));
            Runtime fn cudaFreeArray(array: CUarray) -> cudaError_t
                => RuntimeFree::new(array as u64, RUNTIME_FREE_ARRAY, FREES_ARRAY);
            Runtime fn cudaFreeMipmappedArray(array: CUmipmappedArray) -> cudaError_t
                => RuntimeFree::new(array as u64, RUNTIME_FREE_MIPMAPPED, FREES_ARRAY);
            Runtime fn cudaDeviceReset() -> cudaError_t
                => RuntimeReset;
            Runtime fn cudaGetDriverEntryPoint(symbol: *const c_char, pfn: *mut *mut c_void,
                                               flags: c_ulonglong, status: *mut c_int) -> cudaError_t
                => EntryPoint::new(symbol, pfn, 0, flags, hook_address);
            Runtime fn cudaGetDriverEntryPointByVersion(symbol: *const c_char, pfn: *mut *mut c_void,
                                                        version: c_uint, flags: c_ulonglong,
                                                        status: *mut c_int) -> cudaError_t
                => EntryPoint::new(symbol, pfn, version as c_int, flags, hook_address);
        }
    };
}
pub(crate) use for_each_cuda_hook;

/// [`HookId`] and its tables, from the hook table.
macro_rules! hook_ids {
    ($(
        $layer:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
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

    };
}

for_each_cuda_hook!(hook_ids);

/// The driver calls each runtime entry point makes, so that the driver hook
/// knows the runtime hook on its thread is its caller.
pub const RUNTIME_MALLOC: &[HookId] = &[HookId::cuMemAlloc_v2];
pub const RUNTIME_MALLOC_ASYNC: &[HookId] = &[
    HookId::cuMemAllocAsync,
    HookId::cuMemAllocAsync_ptsz,
    HookId::cuMemAllocFromPoolAsync,
    HookId::cuMemAllocFromPoolAsync_ptsz,
];
pub const RUNTIME_MALLOC_FROM_POOL: &[HookId] = &[
    HookId::cuMemAllocFromPoolAsync,
    HookId::cuMemAllocFromPoolAsync_ptsz,
];
pub const RUNTIME_MALLOC_HOST: &[HookId] = &[HookId::cuMemAllocHost_v2, HookId::cuMemHostAlloc];
pub const RUNTIME_MALLOC_MANAGED: &[HookId] = &[HookId::cuMemAllocManaged];
pub const RUNTIME_MALLOC_PITCH: &[HookId] = &[HookId::cuMemAllocPitch_v2, HookId::cuMemAlloc_v2];
pub const RUNTIME_FREE: &[HookId] = &[HookId::cuMemFree_v2, HookId::cuMemFreeAsync];
pub const RUNTIME_FREE_ASYNC: &[HookId] = &[
    HookId::cuMemFreeAsync,
    HookId::cuMemFreeAsync_ptsz,
    HookId::cuMemFree_v2,
];
pub const RUNTIME_FREE_HOST: &[HookId] = &[HookId::cuMemFreeHost];
pub const RUNTIME_MALLOC_ARRAY: &[HookId] = &[HookId::cuArrayCreate_v2, HookId::cuArray3DCreate_v2];
pub const RUNTIME_MALLOC_MIPMAPPED: &[HookId] = &[HookId::cuMipmappedArrayCreate];
pub const RUNTIME_FREE_ARRAY: &[HookId] = &[HookId::cuArrayDestroy];
pub const RUNTIME_FREE_MIPMAPPED: &[HookId] = &[HookId::cuMipmappedArrayDestroy];

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
            "cuMemAlloc",
            "cudaMallocArrayX",
            "cuArrayCreate",
            "cuInit",
            "cu",
            "",
        ] {
            assert_eq!(HookId::by_name(other.as_bytes()), None, "{other}");
        }
        assert_eq!(HookId::by_name(b"cudaMalloc"), Some(HookId::cudaMalloc));
    }

    #[test]
    fn layers_follow_names() {
        for id in ALL_HOOKS {
            let runtime = id.name().starts_with("cuda");
            assert_eq!(id.layer() == Layer::Runtime, runtime, "{}", id.name());
        }
    }
}
