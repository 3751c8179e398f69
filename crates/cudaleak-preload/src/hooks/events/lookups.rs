//! Entry-point lookups (cuGetProcAddress, cudaGetDriverEntryPoint): a
//! hooked function's lookup hands out the hook.

use super::*;

pub struct EntryPoint {
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    /// The hooks handed out for a name we wrap (`hooks/mod.rs`, above).
    handouts: Handouts,
}

impl EntryPoint {
    pub fn new(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
        handouts: Handouts,
    ) -> EntryPoint {
        EntryPoint {
            symbol,
            pfn,
            version,
            flags,
            handouts,
        }
    }
}

impl Event for EntryPoint {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        Some(())
    }
    fn after(&self, _: &mut HookCx, _: (), result: c_int) {
        if result == CUDA_SUCCESS {
            // SAFETY: `symbol` and `pfn` are what the program passed to the
            // lookup that just succeeded: its C string and the out
            // parameter the driver wrote, as `substitute_entry_point` asks.
            unsafe {
                entry_points::substitute_entry_point(
                    self.symbol,
                    self.pfn,
                    self.version,
                    self.flags,
                    self.handouts,
                    lookup_caller,
                )
            };
        }
    }
}

/// The return address of the hooked call that made an entry-point lookup:
/// the first frame outside this library (libgcc's unwinder: one frame, a
/// few microseconds, whatever CUDALEAK_STACK_DEPTH says).
fn lookup_caller() -> usize {
    let mut frame = [MaybeUninit::<u64>::uninit(); 1];
    match crate::capture::unwind::capture_dwarf(&mut frame, Default::default()) {
        // SAFETY: the unwinder wrote the first `n` entries.
        1 => unsafe { frame[0].assume_init() as usize },
        _ => 0,
    }
}
