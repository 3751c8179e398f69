//! libcudaleak.so: preload it and every CUDA allocation the process makes
//! is tracked; what is still live at exit is reported.
//!
//! A thin shim over `cudaleak-core`, one file per concern:
//! - `hooks`: the declarative table of interposed CUDA functions;
//! - `events`: what each call means for the live map;
//! - `resolve`: real functions, `dlsym` and entry-point interception;
//! - `tracker`: the process-wide state (live map, depot, contexts, VMM);
//! - `capture`, `unwind`, `python`: stacks, captured raw in the hook;
//! - `dump`: snapshot → report → file;
//! - `sampler`: the sampled timeline, read from per-call-site counters;
//! - `lifecycle`: start, fork, dumper thread, signals, exit paths;
//! - `run_marker`: tells `cudaleak run` a process's report went missing;
//! - `api`: the in-process C API.

// The unit-test build exports nothing (no_mangle is off under cfg(test) so
// the test binary does not interpose on itself), which leaves the hooks'
// callees unreferenced there.
#![cfg_attr(test, allow(dead_code))]

mod api;
mod capture;
mod deferred_warnings;
mod dlsym_override;
mod driver_lookup;
mod dump;
mod events;
mod ffi;
mod hook_table;
mod hooks;
mod lifecycle;
mod loader;
mod python;
mod python_layouts;
mod resolve;
mod run_marker;
mod sampler;
mod settings;
mod thread;
mod tracker;
mod unwind;

#[cfg(not(test))]
#[ctor::ctor]
fn cudaleak_init() {
    lifecycle::init();
}

#[cfg(not(test))]
#[ctor::dtor]
fn cudaleak_fini() {
    lifecycle::at_exit();
}
