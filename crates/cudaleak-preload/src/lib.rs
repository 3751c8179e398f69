//! libcudaleak.so: preload it and every CUDA allocation the process makes
//! is tracked; what is still live at exit is reported.
//!
//! A thin shim over `cudaleak-core`, one file per concern, one folder per
//! floor. Each module uses only modules on its own floor or
//! below (two on one floor never use each other both ways), so a change
//! can break only what is above it. Bottom up:
//!
//! 1. settings, the loader, per-thread cells: `base`
//! 2. the CUDA interface, the one hook table: `cuda`
//! 3. stack capture: `capture`
//! 4. the tracked state: `state`
//! 5. the hooks: `hooks`
//! 6. the process's life: `process`
//!
//! `scripts/check-floors.py` (run by CI) reads that list, and the list in
//! each folder's `mod.rs`: a module left out of it, or a use that reaches
//! a higher floor, fails.
//!
//! One exception is written as tokens, not uses: the hook table
//! (`cuda::hook_table`, floor 2) names the events' constructors
//! (`hooks::events`) and `hook_address` (`hooks`) in the lines it hands to
//! a macro, which only `hooks/mod.rs` (floor 5) expands and compiles.
//! Changing an event's constructor means changing its line in the table
//! too.
//!
//! What is where:
//! - `base`: `settings` (the configuration, instance token, report
//!   directory and `warn`), `deferred_warnings` (bad settings, said at the
//!   first CUDA call), `loader` (glibc's own `dlsym`/`dlclose`, loaded
//!   objects and their ranges), `thread` (the cells a hook keeps per
//!   thread);
//! - `cuda`: `ffi` (the CUDA types and constants the hooks' signatures
//!   need), `hook_table` (the one declarative table of interposed CUDA
//!   functions, and their `HookId`s), `driver_lookup` (driver functions
//!   found globally or in a privately loaded libcuda);
//! - `capture`: a hook's stack, in per-thread buffers it owns (`mod.rs`),
//!   native frames (`unwind`), Python frames (`python`) read with
//!   CPython's structure offsets (`python_layouts`, the tables;
//!   `python_debug_offsets`, what CPython 3.13+ says of itself);
//! - `state`: `tracker` (the process-wide state: live map, depot, contexts,
//!   VMM), `sampler` (the sampled timeline, read from per-call-site
//!   counters), `event_ring` (the last allocation events,
//!   `CUDALEAK_TRACE`), `oom` (a failed allocation's snapshot, taken in its
//!   hook);
//! - `hooks`: the exported functions, generated from the table (`mod.rs`),
//!   the real function behind each hook (`resolve`: found globally,
//!   per calling object's scope, and entry points handed out as hooks),
//!   what each call means for the live map (`events`), `dlsym` handing
//!   out hooks and `dlclose` forgetting what it unloaded
//!   (`dlsym_override`);
//! - `process`: start, fork, dumper thread, signals, exit paths
//!   (`lifecycle`), snapshot → report → file (`dump`), telling `cudaleak
//!   run` a process's report went missing (`run_marker`), the in-process C
//!   API (`api`).

// The unit-test build exports nothing (no_mangle is off under cfg(test) so
// the test binary does not interpose on itself), which leaves the hooks'
// callees unreferenced there.
#![cfg_attr(test, allow(dead_code))]

mod base;
mod capture;
mod cuda;
mod hooks;
mod process;
mod state;

#[cfg(not(test))]
#[ctor::ctor]
fn cudaleak_init() {
    process::lifecycle::init();
}

#[cfg(not(test))]
#[ctor::dtor]
fn cudaleak_fini() {
    process::lifecycle::at_exit();
}
