//! What every floor of the core stands on: a lock that is safe inside a
//! hook, a value alone in its cache line, a bias toward one thread that spares it the lock, one hasher for
//! numbers, capped reading of files others name, sizes in words.
//!
//! 1. the tools: `hash`, `lock`, `own_line`, `safe_read`, `signal_mask`, `sole`, `units`

pub mod hash;
pub mod lock;
pub mod own_line;
pub mod safe_read;
pub mod signal_mask;
pub mod sole;
pub mod units;
