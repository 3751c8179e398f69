//! From a snapshot of live blocks to a [`Report`](crate::report::Report): grouping by trace,
//! symbolization, Python frames and the merged stack, runtime attribution,
//! suppressions, growth since the previous dump and trend flags.
//!
//! Everything here is independent of the process it runs in: the preload
//! crate feeds real snapshots, the unit tests feed fake ones.
//!
//! A dump's extra memory is bounded by the groups it writes, not by the
//! distinct stacks alive (131,072 leaked stacks of 30 frames took
//! 3.5 GiB to write 1000 of them). Every trace is symbolized through the
//! dump's [`FrameTable`](crate::symbolize::frame_table::FrameTable) (each return address once, each string kept once)
//! into a `GroupSummary`: its key as a [`KeyDigest`](crate::report::group_key::KeyDigest), counts, its
//! suppression verdict and sort label. Grouping, growth, suppression and
//! order are decided on those; full [`Group`](crate::report::Group)s are made only for the groups
//! of each list that will be written.
//!
//! Bottom up:
//!
//! 1. growth across dumps, stacks merged and attributed: `growth`, `merge`
//! 2. what makes and orders a dump's groups, and their labels: `grouping`
//! 3. the assembler: `assembler`
//! 4. the tests, with a straightforward reference assembler: `tests`

mod assembler;
mod grouping;
mod growth;
mod merge;
#[cfg(test)]
mod tests;

pub use assembler::Assembler;
pub use grouping::is_pytorch_caching_allocator;
pub use growth::{Change, GrowthTracker, TREND_MIN_DUMPS};
pub use merge::merge_stacks;

use crate::record::{Block, TraceId};
use crate::report::Trigger;

/// Examples kept per group.
pub const EXAMPLES_PER_GROUP: usize = 5;

/// What the process knows about itself and this dump.
#[derive(Clone, Debug)]
pub struct DumpMeta {
    pub trigger: Trigger,
    pub sequence: u64,
    pub pid: i64,
    pub ppid: Option<i64>,
    pub command: Vec<String>,
    pub hostname: Option<String>,
    pub rank: Option<i64>,
    pub instance: Option<String>,
    pub timestamp_ms: i64,
    pub reason: Option<String>,
    pub exit_status: Option<i32>,
    pub signal: Option<i32>,
    pub python: Option<String>,
}

/// Live blocks and counters read from the maps.
#[derive(Default)]
pub struct Snapshot {
    pub blocks: Vec<(u64, Block)>,
    /// blocks still live when their context was destroyed: leaks the
    /// device no longer holds (see `Group::torn_down_blocks`)
    pub torn_down: Vec<(u64, Block)>,
    pub allocations: u64,
    pub frees: u64,
    pub failed_allocations: u64,
    pub invalid_frees: u64,
    pub peak_bytes: u64,
    pub incomplete_shards: u64,
    /// allocation calls whose stack was not captured because a signal
    /// handler's call interrupted a capture on the same thread
    pub stacks_skipped_nested: u64,
    /// what each call site held at the process's peak (`site_counters.rs`),
    /// read with the blocks; None: the report has no `peak`
    pub peak: Option<PeakSites>,
}

/// Live bytes and blocks per call site at the process's peak.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeakSites {
    /// the process's peak live bytes the sites were read at
    pub bytes: u64,
    /// Unix time of the peak in milliseconds (0: not known)
    pub timestamp_ms: i64,
    /// (trace, blocks, bytes) of every call site with something live then
    pub sites: Vec<(TraceId, u64, u64)>,
}
