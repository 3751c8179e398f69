//! The bytes of an allocation that its call does not state: arrays from
//! their descriptors, multicast and external memory from their
//! properties, a runtime call's size or pitch.

use super::*;

/// Bytes of a CUDA array from its descriptor (0 when there is none).
pub fn array_2d_bytes(desc: *const CUDA_ARRAY_DESCRIPTOR) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width, d.height, 0, element, 1) as usize
}

/// Bytes of a CUDA array from a v1 (CUDA < 3.2) descriptor.
pub fn array_2d_bytes_v1(desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width as usize, d.height as usize, 0, element, 1) as usize
}

/// Bytes of a 3D CUDA array from a v1 (CUDA < 3.2) descriptor.
pub fn array_3d_bytes_v1(desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width as usize, d.height as usize, d.depth as usize, element, 1) as usize
}

/// The size of a multicast object, from its properties.
pub fn multicast_bytes(prop: *const CUmulticastObjectProp) -> usize {
    if prop.is_null() {
        0
    } else {
        // SAFETY: non-null: the properties the program passed to the
        // call, which the driver requires to be a valid struct; read
        // before the call, while the program's argument is live.
        unsafe { (*prop).size }
    }
}

/// The size of an external memory object, from its handle description.
pub fn external_bytes(desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC) -> usize {
    if desc.is_null() {
        0
    } else {
        // SAFETY: non-null: the description the program passed to the
        // call, a valid struct by the driver's contract; read before the
        // call, while the program's argument is live.
        unsafe { (*desc).size as usize }
    }
}

/// The size of a buffer mapped from external memory.
pub fn external_buffer_bytes(desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC) -> usize {
    if desc.is_null() {
        0
    } else {
        // SAFETY: non-null: the description the program passed to the
        // call, a valid struct by the driver's contract; read before the
        // call, while the program's argument is live.
        unsafe { (*desc).size as usize }
    }
}

/// The nominal size of a mipmapped array mapped from external memory.
pub fn external_mipmap_bytes(desc: *const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the program's descriptor argument, checked non-null above,
    // which the call reads too; only read here, while the call runs.
    let d = unsafe { &*desc };
    array_3d_bytes(&d.array_desc, d.num_levels)
}

/// Bytes of a 3D or mipmapped CUDA array from its descriptor.
pub fn array_3d_bytes(desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's descriptor, read before the call.
    let d = unsafe { &*desc };
    let element = array_element_bytes(d.format, d.num_channels);
    array_bytes(d.width, d.height, d.depth, element, levels) as usize
}
