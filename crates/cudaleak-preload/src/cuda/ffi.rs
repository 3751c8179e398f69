//! The CUDA types and constants the hooks need, from the CUDA Driver and
//! Runtime API references. Only fixed-width C types: the hooks must match
//! the real ABI exactly, and nothing here is dereferenced beyond the out
//! parameters the APIs document.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

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
/// The driver's "out of memory" (`CUDA_ERROR_OUT_OF_MEMORY`).
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;

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

pub type GetProcAddressV2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, cuuint64_t, *mut c_int) -> CUresult;
pub type CtxGetCurrentFn = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
pub type CtxGetDeviceFn = unsafe extern "C" fn(*mut CUdevice) -> CUresult;

/// `CUDA_ARRAY_DESCRIPTOR` (cuArrayCreate_v2).
#[repr(C)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (cuArray3DCreate_v2, cuMipmappedArrayCreate).
#[repr(C)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;

/// Bytes of one element of a `CUarray_format` with `channels` channels
/// (0 for formats the table does not know: block-compressed, NV12).
pub fn array_element_bytes(format: c_int, channels: c_uint) -> u64 {
    let per_channel = match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 0,
    };
    per_channel * channels as u64
}

/// Nominal bytes of an array of `levels` mipmap levels (1: a plain
/// array), each level half the previous one in every dimension; a height
/// or depth of 0 is a 1D or 2D array. The driver may pad; cudaleak
/// records this figure.
pub fn array_bytes(width: usize, height: usize, depth: usize, element: u64, levels: u32) -> u64 {
    let (mut w, mut h, mut d) = (width as u64, height as u64, depth as u64);
    let mut total = 0u64;
    for _ in 0..levels.min(64) {
        total = total.saturating_add(
            w.saturating_mul(h.max(1))
                .saturating_mul(d.max(1))
                .saturating_mul(element),
        );
        w = (w / 2).max(1);
        h /= 2;
        d /= 2;
    }
    total
}

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; 64],
}

pub type MemGetAddressRangeFn = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult;

/// The CUDA < 3.2 descriptors of the v1 `cuArrayCreate` and
/// `cuArray3DCreate` (32-bit sizes).
#[repr(C)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_int,
    pub num_channels: c_uint,
}

#[repr(C)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_int,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUmulticastObjectProp` (cuMulticastCreate): the size is read.
#[repr(C)]
pub struct CUmulticastObjectProp {
    pub num_devices: c_uint,
    pub size: usize,
    pub handle_types: c_ulonglong,
    pub flags: c_ulonglong,
}

pub type CUexternalMemory = *mut c_void;
pub type CUgreenCtx = *mut c_void;

/// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC` (cuImportExternalMemory): the size is
/// read; the handle is a union of at most two pointers.
#[repr(C)]
pub struct CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
    pub handle_type: c_int,
    pub handle: [u64; 2],
    pub size: c_ulonglong,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC` (cuExternalMemoryGetMappedBuffer).
#[repr(C)]
pub struct CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
    pub offset: c_ulonglong,
    pub size: c_ulonglong,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC`
/// (cuExternalMemoryGetMappedMipmappedArray).
#[repr(C)]
pub struct CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC {
    pub offset: c_ulonglong,
    pub array_desc: CUDA_ARRAY3D_DESCRIPTOR,
    pub num_levels: c_uint,
    pub reserved: [c_uint; 16],
}
/// `cuMemGetInfo_v2`: free and total memory of the current context's device.
pub type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;

// ---- CUDA graphs and stream capture (`state/graphs.rs`) ----

pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgraphExec = *mut c_void;

/// `CU_STREAM_CAPTURE_STATUS_NONE`, `CU_STREAM_CAPTURE_STATUS_ACTIVE`
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`, `CU_GRAPH_NODE_TYPE_MEM_FREE`
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 alike): the pool's properties
/// (`CUmemPoolProps`, 88 bytes, whose location names the device), then the
/// access descriptors, the size asked for and the address the driver
/// writes back.
#[repr(C)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
    pub pool_props_rest: [u8; 72],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

const _: () = assert!(std::mem::size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>() == 120);
const _: () = assert!(std::mem::offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104);

/// `CUgraphNodeParams` (cuGraphAddNode, 256 bytes): the node type, then a
/// union at offset 16 whose memory-alloc member is a
/// [`CUDA_MEM_ALLOC_NODE_PARAMS`] and whose memory-free member is the
/// address to free.
#[repr(C)]
pub struct CUgraphNodeParams {
    pub node_type: c_int,
    pub reserved0: [c_int; 3],
    pub params: [u64; 29],
    pub reserved2: i64,
}

const _: () = assert!(std::mem::size_of::<CUgraphNodeParams>() == 256);

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (cuGraphInstantiateWithParams): the
/// flags are read.
#[repr(C)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub err_node_out: CUgraphNode,
    pub result_out: c_int,
}

pub type StreamGetCaptureInfoFn = unsafe extern "C" fn(
    CUstream,
    *mut c_int,
    *mut u64,
    *mut CUgraph,
    *mut *const CUgraphNode,
    *mut usize,
) -> CUresult;
