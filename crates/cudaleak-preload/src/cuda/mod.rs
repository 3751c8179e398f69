//! The CUDA interface the library interposes on: its C types, the one
//! table of hooked functions, the driver functions it calls itself.

pub mod driver_lookup;
pub mod ffi;
pub mod hook_table;
