//! The process-independent core of cudaleak.
//!
//! Hooks in the preload crate record into the structures defined here
//! ([`record::live_map::LiveMap`], [`record::depot::Depot`],
//! [`record::python::CodeTable`]); a dump turns a snapshot of them into a
//! [`report::Report`] ([`assemble`]), applies
//! [`report::suppress`]ions and writes it ([`writer`]) in the renderings of
//! [`report::render`]. Nothing here needs a CUDA process, so all of it is
//! unit-tested with fake addresses and fake symbol tables.
//!
//! One folder per floor: each module uses only modules on its
//! own floor or below, so the tree read top-down is these floors read
//! bottom-up. Bottom up:
//!
//! 1. what every floor stands on: `base`
//! 2. what the hooks record into: `record`
//! 3. the report model and its readings: `report`
//! 4. names and lines for addresses, memory over time: `symbolize`, `timeline`
//! 5. from a snapshot to a report: `assemble`
//! 6. the flags, report files, the gate's channel, views across reports, memory budgets, metrics, the live view: `config`, `writer`, `run_channel`, `combine`, `budget`, `metrics`, `live_view`
//!
//! `scripts/check-floors.py` (run by CI) reads that list, and the list in
//! each folder's `mod.rs`: a module left out, or a use that reaches a
//! higher floor, fails.
//!
//! What is where:
//! - `base`: `hash` (one mix per address, id or digest), `lock` (a futex
//!   mutex safe in a hook), `safe_read` (capped
//!   reads of files others name), `units` (sizes in words);
//! - `record`: what a block is (`mod.rs`), the live map (`live_map`), trace
//!   interning (`depot`), Python code copies and line tables (`python`,
//!   `linetable`), live bytes per call site (`site_counters`);
//! - `report`: the report model (`mod.rs`), what makes two stacks one
//!   group (`group_key`), suppressions (`suppress`), text and collapsed
//!   renderings (`render`);
//! - `symbolize`: dump-time symbolization (`mod.rs`), where an address lies
//!   in its module (`module_location`), one dump's frames (`frame_table`),
//!   symbolizing a report after the fact (`offline`); `timeline`: the
//!   dumps' timeline (`mod.rs`), the sampled one (`site_timeline`), as
//!   text (`render`);
//! - `assemble`: snapshot → report (`growth`, `merge` of stacks,
//!   `grouping` and labels, the `assembler`, and `tests` with a reference
//!   assembler);
//! - `config`: every flag, declared once; `writer`: report files;
//!   `run_channel`: what processes tell `cudaleak run`; `combine`: merges,
//!   diffs and ranks across reports; `budget`: peaks against a ceiling or
//!   a stored run, and the verdict as CI systems read it; `metrics`: a
//!   process's figures in Prometheus's text format; `live_view`: what
//!   `cudaleak top` reads of a running process.

pub mod assemble;
pub mod base;
pub mod budget;
pub mod combine;
pub mod config;
pub mod live_view;
pub mod metrics;
pub mod record;
pub mod report;
pub mod run_channel;
pub mod symbolize;
pub mod timeline;
pub mod writer;
