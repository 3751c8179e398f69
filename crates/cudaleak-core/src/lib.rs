//! The process-independent core of cudaleak.
//!
//! Hooks in the preload crate record into the structures defined here
//! ([`live_map::LiveMap`], [`depot::Depot`], [`python::CodeTable`]); a dump
//! turns a snapshot of them into a [`report::Report`] ([`assemble`]),
//! applies [`suppress`]ions and writes it ([`writer`]) in the renderings of
//! [`render`]. Nothing here needs a CUDA process, so all of it is
//! unit-tested with fake addresses and fake symbol tables.

pub mod assemble;
pub mod combine;
pub mod config;
pub mod depot;
pub mod frame_table;
pub mod group_key;
pub mod linetable;
pub mod live_map;
pub mod lock;
pub mod module_location;
pub mod offline_symbolize;
pub mod python;
pub mod record;
pub mod render;
pub mod report;
pub mod safe_read;
pub mod site_counters;
pub mod site_timeline;
pub mod suppress;
pub mod symbolize;
pub mod timeline;
pub mod timeline_render;
pub mod units;
pub mod writer;
