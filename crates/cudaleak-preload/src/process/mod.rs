//! The process's life: start, fork, the dumper thread, signals and exits
//! (`lifecycle`), snapshot → report → file (`dump`), the Prometheus
//! textfile (`metrics`), what `cudaleak top` reads (`live_view`), what
//! lets `cudaleak run` fail closed
//! (`run_marker`), the in-process C API (`api`).
//!
//! 1. what lets the command's run fail closed: `run_marker`
//! 2. snapshot, report, file; the metrics file, the live view: `dump`, `metrics`, `live_view`
//! 3. start, fork, the dumper thread, signals, exits: `lifecycle`
//! 4. the in-process C API: `api`

pub mod api;
pub mod dump;
pub mod lifecycle;
pub mod live_view;
pub mod metrics;
pub mod run_marker;
