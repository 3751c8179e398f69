//! The CUDA interface the library interposes on: its C types, the one
//! table of hooked functions, the driver functions it calls itself.
//!
//! 1. C types and constants: `ffi`
//! 2. the one table of hooked functions: `hook_table`
//! 3. driver functions the library calls itself: `driver_lookup`

pub mod driver_lookup;
pub mod ffi;
pub mod hook_table;
