//! Warnings about bad `CUDALEAK_*` values, held until the process's first
//! CUDA allocation call. Printed at load, they came from every process
//! that inherited LD_PRELOAD, `ls` and each shell of a wrapper script
//! included, several times per run; now only processes that use
//! CUDA say them, once each.
//!
//! The buffer is fixed-size and static: `flush` runs inside a hook, where
//! nothing may allocate or lock.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

const CAPACITY: usize = 4096;

static BUF: [AtomicU8; CAPACITY] = [const { AtomicU8::new(0) }; CAPACITY];
static LEN: AtomicUsize = AtomicUsize::new(0);
/// Set by the first flush. A fork child inherits it: a process tree whose
/// parent already warned does not warn again in each child.
static FLUSHED: AtomicBool = AtomicBool::new(false);

/// Keeps one warning line (without its newline) for [`flush`]. A line
/// that does not fit in what is left is dropped whole.
pub fn push(line: &str) {
    let bytes = line.as_bytes();
    let need = bytes.len() + 1;
    let Ok(start) = LEN.fetch_update(Ordering::AcqRel, Ordering::Acquire, |len| {
        (len + need <= CAPACITY).then_some(len + need)
    }) else {
        return;
    };
    for (i, b) in bytes.iter().chain(std::iter::once(&b'\n')).enumerate() {
        BUF[start + i].store(*b, Ordering::Relaxed);
    }
    // Publish the bytes before a flush can see them as complete.
    std::sync::atomic::fence(Ordering::Release);
}

/// Writes the kept warnings to stderr, once per process tree; called at
/// the first CUDA allocation call.
pub fn flush() {
    if FLUSHED.swap(true, Ordering::AcqRel) {
        return;
    }
    std::sync::atomic::fence(Ordering::Acquire);
    let len = LEN.load(Ordering::Acquire).min(CAPACITY);
    // Copied out in small pieces: this runs inside the first allocation
    // call, on the program's stack, which may be a 16 KiB thread's (a
    // 4 KiB buffer here took a quarter of it). Lines end where the chunks do; the pieces
    // are written one after another.
    let mut chunk = [0u8; 256];
    for start in (0..len).step_by(chunk.len()) {
        let end = (start + chunk.len()).min(len);
        for (o, b) in chunk.iter_mut().zip(&BUF[start..end]) {
            *o = b.load(Ordering::Relaxed);
        }
        crate::base::settings::write_stderr(&chunk[..end - start]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_kept_until_flushed_and_too_long_ones_dropped() {
        push("cudaleak: first");
        push(&"x".repeat(CAPACITY));
        push("cudaleak: second");
        let len = LEN.load(Ordering::Acquire);
        let kept: Vec<u8> = BUF[..len].iter().map(|b| b.load(Ordering::Relaxed)).collect();
        assert_eq!(kept, b"cudaleak: first\ncudaleak: second\n");
    }
}
