//! What every floor of the core stands on: locks that are safe inside a
//! hook (one that knows its holder), a value alone in its cache line, one
//! hasher for numbers, capped reading of files others name, what may
//! interrupt a thread, sizes in words.
//!
//! 1. the tools: `hash`, `lock`, `own_line`, `safe_read`, `signal_mask`, `units`
//! 2. a lock that names its holder: `tid_lock`

pub mod hash;
pub mod lock;
pub mod own_line;
pub mod safe_read;
pub mod signal_mask;
pub mod tid_lock;
pub mod units;

/// This machine's name (`unknown` when it cannot be read): reports and
/// metrics files are named with it, and the CLI finds a host's files by it.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buffer and its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
