//! libcudaleak.so: preload it and every CUDA allocation the process makes
//! is tracked; what is still live at exit is reported.
//!
//! A thin shim over `cudaleak-core`, one file per concern, in floors. Each
//! module uses only modules on its own floor or below (two on one floor
//! never use each other both ways), so a change can break only what is
//! above it. Bottom up:
//!
//! 1. C types and data: `ffi`, `python_layouts`
//! 2. settings, diagnostics, the loader, hook identities: `settings`, `deferred_warnings`, `run_marker`, `loader`, `driver_lookup`, `hook_table`, `sampler`, `event_ring`
//! 3. per-thread state: `thread`
//! 4. stack capture: `unwind`, `python`, `capture`
//! 5. the tracked state: `tracker`
//! 6. real functions, what each call means, out-of-memory moments: `resolve`, `events`, `oom`
//! 7. the hooks: `hooks`
//! 8. the process's life: `dlsym_override`, `dump`, `lifecycle`, `api`
//!
//! `scripts/check-floors.py` (run by CI) reads that list: a module left
//! out of it, or a use that reaches a higher floor, fails.
//!
//! One exception is written as tokens, not uses: the hook table
//! (`hook_table`, floor 2) names the events' constructors (`events`) and
//! `hook_address` (`hooks`) in the lines it hands to a macro, which only
//! `hooks.rs` (floor 7) expands and compiles. Changing an event's
//! constructor means changing its line in the table too.
//!
//! What is where:
//! - `ffi`: the CUDA types and constants the hooks' signatures need;
//!   `python_layouts`: CPython's structure offsets, per version;
//! - `settings`: the configuration, instance token, report directory and
//!   `warn`; `deferred_warnings`: bad settings, said at the first CUDA
//!   call; `run_marker`: tells `cudaleak run` a process's report went
//!   missing; `sampler`: the sampled timeline, read from per-call-site
//!   counters; `event_ring`: the last allocation events
//!   (`CUDALEAK_TRACE`);
//! - `loader`: glibc's own `dlsym`/`dlclose`, loaded objects and their
//!   ranges; `driver_lookup`: driver functions found globally or in a
//!   privately loaded libcuda; `hook_table`: the one declarative table of
//!   interposed CUDA functions, and their `HookId`s;
//! - `thread`: the cells a hook keeps per thread;
//! - `unwind`, `python`: native and Python frames, captured raw;
//!   `capture`: a hook's stack, in per-thread buffers it owns;
//! - `tracker`: the process-wide state (live map, depot, contexts, VMM);
//! - `resolve`: the real function behind each hook, per calling object,
//!   and the `dlclose` override; `events`: what each call means for the
//!   live map; `oom`: a failed allocation's snapshot, taken in its hook;
//! - `hooks`: the exported functions, generated from the table;
//! - `dlsym_override`: `dlsym` hands out hooks; `dump`: snapshot → report
//!   → file; `lifecycle`: start, fork, dumper thread, signals, exit paths;
//!   `api`: the in-process C API.

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
mod event_ring;
mod events;
mod ffi;
mod hook_table;
mod hooks;
mod lifecycle;
mod loader;
mod oom;
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
