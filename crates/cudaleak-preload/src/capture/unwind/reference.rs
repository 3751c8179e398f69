//! The reference unwinder: libgcc's, through the backtrace crate
//! (`CUDALEAK_UNWINDER=dwarf`, and every capture off x86-64).

use super::{is_own, EvalStop};
use crate::base::loader::own_range;
use std::mem::MaybeUninit;

/// The reference unwinder: libgcc's, through the backtrace crate.
pub fn capture_dwarf(out: &mut [MaybeUninit<u64>], stop: EvalStop) -> usize {
    dwarf_skipping(out, own_range(), stop)
}

#[inline(never)]
pub(super) fn dwarf_skipping(out: &mut [MaybeUninit<u64>], range: (usize, usize), stop: EvalStop) -> usize {
    let mut n = 0;
    let mut evals = 0;
    // SAFETY: unsynchronized tracing is fine: we hold no lock the unwinder
    // could need, and a hook never runs inside the unwinder.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as usize;
            if ip == 0 {
                return false;
            }
            if !is_own(ip, range) {
                out[n].write(ip as u64);
                n += 1;
                if stop.after != 0 && stop.is_eval(ip) {
                    evals += 1;
                    if evals == stop.after {
                        return false;
                    }
                }
            }
            n < out.len()
        });
    }
    n
}
