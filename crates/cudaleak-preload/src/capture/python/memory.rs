//! Reads of the interpreter's memory, and the plausibility test every
//! pointer passes before it is read through.

/// # Safety
/// `addr..addr + size_of::<T>()` must be readable memory; `T` is a plain
/// integer or address, for which every bit pattern is valid.
#[inline(always)]
pub(super) unsafe fn read<T: Copy>(addr: usize) -> T {
    // SAFETY: readable per the caller; `read_unaligned` needs no alignment,
    // and any bytes there make a valid plain-data `T`.
    unsafe { (addr as *const T).read_unaligned() }
}

/// Plausible user-space pointer, aligned to `align`.
#[inline(always)]
pub(super) fn plausible(p: usize, align: usize) -> bool {
    (4096..(1 << 56)).contains(&p) && p.is_multiple_of(align)
}
