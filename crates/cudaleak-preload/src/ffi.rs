//! The CUDA types and constants the hooks need, from the CUDA Driver and
//! Runtime API references. Only fixed-width C types: the hooks must match
//! the real ABI exactly, and nothing here is dereferenced beyond the out
//! parameters the APIs document.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_ulonglong, c_void};

pub type CUresult = c_int;
pub type cudaError_t = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = c_ulonglong;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = c_ulonglong;
pub type cuuint64_t = u64;

pub const CUDA_SUCCESS: c_int = 0;
/// Returned when the real function cannot be found at all (no driver).
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// cudaErrorInsufficientDriver, for a runtime entry point with no runtime.
pub const CUDA_ERROR_INSUFFICIENT_DRIVER: cudaError_t = 35;

/// cuGetProcAddress flags
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUmemAllocationProp` (driver API): only `location.id` is read, to know
/// the device of a physical allocation.
#[repr(C)]
pub struct CUmemAllocationProp {
    pub alloc_type: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
    pub win32_handle_metadata: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `struct cudaExtent`, passed by value to cudaMalloc3D.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `struct cudaPitchedPtr`, the out parameter of cudaMalloc3D.
#[repr(C)]
pub struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

pub type GetProcAddressV2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, cuuint64_t, *mut c_int) -> CUresult;
pub type CtxGetCurrentFn = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
pub type CtxGetDeviceFn = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
