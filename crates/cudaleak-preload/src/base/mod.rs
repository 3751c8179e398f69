//! What every floor of the library stands on: the settings and their
//! warnings, glibc's own loader functions, the cells a hook keeps per
//! thread.

pub mod deferred_warnings;
pub mod loader;
pub mod settings;
pub mod thread;
