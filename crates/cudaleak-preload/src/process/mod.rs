//! The process's life: start, fork, the dumper thread, signals and exits
//! (`lifecycle`), snapshot → report → file (`dump`), what lets `cudaleak
//! run` fail closed (`run_marker`), the in-process C API (`api`).

pub mod api;
pub mod dump;
pub mod lifecycle;
pub mod run_marker;
