//! What every floor of the library stands on: the settings and their
//! warnings, glibc's own loader functions, the cells a hook keeps per
//! thread.
//!
//! 1. glibc's loader, the settings, per-thread cells, signal frames on a stack: `loader`, `settings`, `thread`, `signal_frames`
//! 2. bad settings, said later: `deferred_warnings`

pub mod deferred_warnings;
pub mod loader;
pub mod settings;
pub mod signal_frames;
pub mod thread;
