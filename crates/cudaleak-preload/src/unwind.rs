//! Native stack capture: return addresses of the calling thread, innermost
//! first, without this library's own frames.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

static OWN_START: AtomicUsize = AtomicUsize::new(0);
static OWN_END: AtomicUsize = AtomicUsize::new(0);

/// The address range of libcudaleak.so's loaded segments.
pub fn own_range() -> (usize, usize) {
    let start = OWN_START.load(Ordering::Acquire);
    if start != 0 {
        return (start, OWN_END.load(Ordering::Acquire));
    }
    compute_own_range()
}

#[cold]
fn compute_own_range() -> (usize, usize) {
    struct Search {
        probe: usize,
        range: (usize, usize),
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        let s = &mut *(data as *mut Search);
        let info = &*info;
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for i in 0..info.dlpi_phnum as usize {
            let ph = &*info.dlpi_phdr.add(i);
            if ph.p_type == libc::PT_LOAD {
                let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
                lo = lo.min(start);
                hi = hi.max(start + ph.p_memsz as usize);
            }
        }
        if lo <= s.probe && s.probe < hi {
            s.range = (lo, hi);
            return 1;
        }
        0
    }
    let mut s = Search {
        probe: own_range as *const () as usize,
        range: (0, 0),
    };
    // SAFETY: the callback only reads the loader's program headers.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut s as *mut Search as *mut libc::c_void) };
    if s.range.0 != 0 {
        OWN_END.store(s.range.1, Ordering::Release);
        OWN_START.store(s.range.0, Ordering::Release);
    }
    s.range
}

#[inline]
fn is_own(ip: usize, range: (usize, usize)) -> bool {
    range.0 <= ip && ip < range.1
}

/// Fills `out` with return addresses; returns how many.
#[inline(never)]
pub fn capture(out: &mut [MaybeUninit<u64>]) -> usize {
    let range = own_range();
    let mut n = 0;
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
            }
            n < out.len()
        });
    }
    n
}
