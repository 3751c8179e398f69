//! A value alone in its 64-byte cache line.
//!
//! The bug: two threads doubled the library's cost per pair
//! with no lock waited on. The live-byte count, written by every
//! allocation and release, shared its line with the peak, the epoch and
//! the tracking flag, which every event reads: each write took the line
//! from the other core.

#[repr(align(64))]
pub struct OwnLine<T>(pub T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
