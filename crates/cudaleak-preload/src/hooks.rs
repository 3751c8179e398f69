//! The one table of every CUDA function cudaleak interposes.
//!
//! Each line gives the exported name, its C signature, and the event that
//! interprets the call (`events.rs`). The [`cuda_hooks!`] macro turns the
//! table into (after memray's X-macro hook list):
//! - [`HookId`], one variant per function, and [`HOOK_NAMES`];
//! - one exported `extern "C"` function per line, which resolves the real
//!   function (`resolve.rs`), lets the event look at the call before and
//!   after it, and returns the real result unchanged;
//! - [`hook_address`], which `dlsym`, `cuGetProcAddress` and
//!   `cudaGetDriverEntryPoint` hand out instead of the real address.
//!
//! Exports are `#[cfg_attr(not(test), no_mangle)]` (as bytehound does), so
//! the unit-test binary of this crate does not interpose on itself.

use crate::events::*;
use crate::ffi::*;
use cudaleak_core::record::{Api, MemoryKind::*};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// Which library a hooked function belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// libcuda: one implementation per process, so any address the driver
    /// hands out for a name is interchangeable with any other.
    Driver,
    /// libcudart: attribution only; several copies may be loaded.
    Runtime,
}

macro_rules! cuda_hooks {
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

        pub static HOOK_LAYERS: [Layer; HOOK_COUNT] = [$(Layer::$layer),*];

        pub static ALL_HOOKS: [HookId; HOOK_COUNT] = [$(HookId::$name),*];

        /// The address handed out in place of the real function.
        pub fn hook_address(id: HookId) -> usize {
            match id { $(HookId::$name => exports::$name as *const () as usize),* }
        }

        /// What each hook does once its real function is known.
        pub mod bodies {
            #![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            use super::*;
            $(
                hook_body!($layer fn $name($($arg: $ty),*) -> $ret => $event);
            )*
        }

        /// The exported symbols: a driver hook is its body; a runtime hook
        /// is an entry stub that notes its caller first (`resolve.rs`).
        pub mod exports {
            #![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            use super::*;
            $(
                hook_export!($layer fn $name($($arg: $ty),*) -> $ret);
            )*
        }
    };
}

/// The body of one hook: find the real function, let the event watch the
/// call. A runtime hook takes the real function its caller's own scope
/// binds (two libcudart copies each keep theirs, an RTLD_LOCAL plugin's
/// libcudart is found), which its entry stub looked up.
macro_rules! hook_body {
    (Driver fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $event:expr) => {
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            type Real = unsafe extern "C" fn($($ty),*) -> $ret;
            let Some(real) = crate::resolve::real::<Real>(HookId::$name) else {
                return crate::resolve::missing_result(HookId::$name);
            };
            crate::events::intercept(Layer::Driver, || $event, || real($($arg),*))
        }
    };
    (Runtime fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $event:expr) => {
        /// `real`: what the entry stub found for the caller (0: nothing).
        pub unsafe extern "C" fn $name(real: usize, $($arg: $ty),*) -> $ret {
            type Real = unsafe extern "C" fn($($ty),*) -> $ret;
            if real == 0 {
                return crate::resolve::missing_code(HookId::$name);
            }
            // SAFETY: a function of the hooked signature, from the loader.
            let real = unsafe { std::mem::transmute::<usize, Real>(real) };
            crate::events::intercept(Layer::Runtime, || $event, || real($($arg),*))
        }
    };
}

/// The exported symbol of one hook.
macro_rules! hook_export {
    (Driver fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        pub use super::bodies::$name;
    };
    // The stub reads the return address (the caller's), has the real
    // function for that caller looked up, restores the argument registers,
    // shifts them by one to pass the real function first, and jumps to the
    // body: the stack is as the caller left it, so arguments passed in
    // memory (cudaMalloc3D's cudaExtent) stay in place. Hence at most 5
    // arguments (x86-64 has 6 argument registers), checked below.
    (Runtime fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        const _: () = {
            let args: &[&str] = &[$(stringify!($arg)),*];
            assert!(args.len() <= 5, "a runtime hook takes at most 5 arguments");
        };

        #[cfg(target_arch = "x86_64")]
        #[cfg_attr(not(test), no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            std::arch::naked_asm!(
                // r9 is no argument (at most 5); 5 pushes realign the stack.
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "push r8",
                "mov rdi, [rsp + 40]",
                "mov esi, {id}",
                "call {enter}",
                "pop r8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "mov r9, r8",
                "mov r8, rcx",
                "mov rcx, rdx",
                "mov rdx, rsi",
                "mov rsi, rdi",
                "mov rdi, rax",
                "jmp {body}",
                id = const HookId::$name as u32,
                enter = sym crate::resolve::cudaleak_enter_runtime,
                body = sym super::bodies::$name,
            )
        }

        #[cfg(target_arch = "aarch64")]
        #[cfg_attr(not(test), no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            std::arch::naked_asm!(
                "stp x29, x30, [sp, #-80]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "stp x2, x3, [sp, #32]",
                "stp x4, x5, [sp, #48]",
                "stp x6, x7, [sp, #64]",
                "mov x0, x30",
                "mov x1, #{id}",
                "bl {enter}",
                "mov x9, x0",
                "ldp x1, x2, [sp, #16]",
                "ldp x3, x4, [sp, #32]",
                "ldp x5, x6, [sp, #48]",
                "ldr x7, [sp, #64]",
                "mov x0, x9",
                "ldp x29, x30, [sp], #80",
                "b {body}",
                id = const HookId::$name as u32,
                enter = sym crate::resolve::cudaleak_enter_runtime,
                body = sym super::bodies::$name,
            )
        }

/// Elsewhere the caller is unknown: the global lookup answers.
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            let real = crate::resolve::cudaleak_enter_runtime(0, HookId::$name as u32);
            super::bodies::$name(real, $($arg),*)
        }
    };
}

cuda_hooks! {
    // ---- driver: allocations (recorded here, once per program call) ----
    Driver fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult
        => Alloc::new(HookId::cuMemAlloc_v2, Api::cuMemAlloc_v2, Device, dptr, size);
    Driver fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize,
                                 height: usize, element_size: c_uint) -> CUresult
        => Alloc::pitched(HookId::cuMemAllocPitch_v2, Api::cuMemAllocPitch_v2, dptr, pitch, height);
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
        => EntryPoint::new(symbol, pfn, version, flags);
    Driver fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int,
                                  flags: cuuint64_t, status: *mut c_int) -> CUresult
        => EntryPoint::new(symbol, pfn, version, flags);
    Driver fn cuGetProcAddress_v2_ptsz(symbol: *const c_char, pfn: *mut *mut c_void,
                                       version: c_int, flags: cuuint64_t,
                                       status: *mut c_int) -> CUresult
        => EntryPoint::new(symbol, pfn, version, flags);

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
                             RtSize::Pitch(pitch, height));
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
        => EntryPoint::new(symbol, pfn, 0, flags);
    Runtime fn cudaGetDriverEntryPointByVersion(symbol: *const c_char, pfn: *mut *mut c_void,
                                                version: c_uint, flags: c_ulonglong,
                                                status: *mut c_int) -> cudaError_t
        => EntryPoint::new(symbol, pfn, version as c_int, flags);
}

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
