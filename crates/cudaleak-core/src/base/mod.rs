//! What every floor of the core stands on: a lock that is safe inside a
//! hook, capped reading of files others name, sizes in words.
//!
//! 1. the tools: `lock`, `safe_read`, `units`

pub mod lock;
pub mod safe_read;
pub mod units;
