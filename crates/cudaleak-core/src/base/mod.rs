//! What every floor of the core stands on: a lock that is safe inside a
//! hook, one hasher for numbers, capped reading of files others name,
//! sizes in words.
//!
//! 1. the tools: `hash`, `lock`, `safe_read`, `units`

pub mod hash;
pub mod lock;
pub mod safe_read;
pub mod units;
