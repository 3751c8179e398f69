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
