//! What every floor of the core stands on: a lock that is safe inside a
//! hook, capped reading of files others name, sizes in words.

pub mod lock;
pub mod safe_read;
pub mod units;
