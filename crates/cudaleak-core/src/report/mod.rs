//! The report and its readings that need no process. Bottom up:
//!
//! 1. group keys, suppressions, renderings: `group_key`, `suppress`, `render`
//!
//! This file: the report model, `schema/report.schema.json` (version 1)
//! as Rust types.
//!
//! Fields the shared schema defines keep its names and meaning; fields this
//! project adds are marked "extension" and are described in our copy of the
//! schema. Reading is strict about `format` and `version` so that a foreign
//! or newer file gets a clear error instead of a wrong summary.

pub mod group_key;
pub mod render;
pub mod suppress;

use crate::record::python::PythonFrame;
use crate::record::MemoryKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const FORMAT: &str = "cudaleak";
pub const VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    Exit,
    Signal,
    Api,
    Interval,
    ContextTeardown,
    FatalSignal,
    /// extension: an allocation call failed for lack of memory;
    /// the report shows what was live at that moment
    Oom,
}

impl Trigger {
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Exit => "exit",
            Trigger::Signal => "signal",
            Trigger::Api => "api",
            Trigger::Interval => "interval",
            Trigger::ContextTeardown => "context-teardown",
            Trigger::FatalSignal => "fatal-signal",
            Trigger::Oom => "oom",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub live_blocks: u64,
    /// bytes of memory; reserved address space is in `by_memory` only
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
    pub failed_allocations: u64,
    pub invalid_frees: u64,
    /// extension: live blocks and bytes per memory kind
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_memory: BTreeMap<MemoryKind, KindTotals>,
    /// extension: allocations whose new stack was not stored because the
    /// process reached CUDALEAK_MAX_STACKS distinct stacks (their blocks
    /// are in the "unknown" group)
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stacks_dropped: u64,
    /// extension: allocation calls made by a signal handler that
    /// interrupted the library's own stack capture on the same thread:
    /// their blocks are recorded without a stack
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stacks_skipped_nested: u64,
    /// extension: groups left out of `leaks` by CUDALEAK_MAX_GROUPS (the
    /// smallest ones)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups_left_out: Option<LeftOut>,
    /// extension: blocks still live when their context was destroyed,
    /// reported as leaks (each group's `torn_down_blocks`) but no longer
    /// held by the device, so not in `live_blocks`, `live_bytes`,
    /// `by_memory` or the peak
    #[serde(default, skip_serializing_if = "is_zero")]
    pub torn_down_blocks: u64,
    /// extension: their bytes of memory (reserved address space not
    /// counted, as in `live_bytes`)
    #[serde(default, skip_serializing_if = "is_zero")]
    pub torn_down_bytes: u64,
}

/// extension: what a list of groups left out past its cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftOut {
    pub groups: u64,
    pub blocks: u64,
    /// bytes of memory (reserved address space not counted, as in
    /// `live_bytes`)
    pub bytes: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindTotals {
    pub blocks: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NativeFrame {
    /// instruction address (the call instruction of a return address), hex
    pub address: String,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<i64>,
    pub module: Option<String>,
    /// extension: `address` minus the module's load base, hex: what a
    /// symbolizer looks up in the module file (`module+0xOFFSET`), the same
    /// in every process whatever ASLR did. Absent in older reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<String>,
    /// extension: the module's GNU build-id (hex), from its
    /// `NT_GNU_BUILD_ID` note: finds the matching debug file
    /// (`/usr/lib/debug/.build-id/xx/yyyy.debug`) on any machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
}

/// extension: one frame of `merged_stack`, Python frames in the place of
/// the interpreter's eval-loop frames.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MergedFrame {
    Native(NativeFrame),
    Python(PythonFrame),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockExample {
    pub address: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
}

/// extension: how a group's live bytes moved over the dumps of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trend {
    /// grew at each of the last three or more dumps: a suspected leak
    Growing,
    /// grew after the dump that first saw it, then stopped growing:
    /// cache-like
    Bounded,
    /// unchanged or smaller since the dump that first saw it (allocated
    /// once, never freed): a real leak if it is one, not a cache
    Steady,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub blocks: u64,
    pub bytes: u64,
    pub api: String,
    /// one of the shared schema's kinds (see `MemoryKind::shared_kind`)
    pub memory: MemoryKind,
    /// extension: the precise kind where `memory` cannot say it
    /// ("imported", "pool", "registered", "multicast")
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_kind: Option<MemoryKind>,
    pub native_stack: Vec<NativeFrame>,
    pub python_stack: Vec<PythonFrame>,
    /// extension
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_stack: Vec<MergedFrame>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<BlockExample>,
    /// growth entries only
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_delta: Option<i64>,
    /// growth entries only
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_delta: Option<i64>,
    /// suppressed entries only: the pattern that matched
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppression: Option<String>,
    /// extension
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trend: Option<Trend>,
    /// extension: each distinct native stack of a group that several made
    /// (one Python line reached through different interpreter call sites;
    /// `group_key.rs`), largest first; empty when there was one
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw_stacks: Vec<RawStack>,
    /// extension: the group's memory is a segment of PyTorch's caching
    /// allocator (its native stack passes through
    /// `c10::cuda::CUDACachingAllocator`): memory PyTorch reserved, which
    /// holds many tensors or none, not one tensor
    #[serde(default, skip_serializing_if = "is_false")]
    pub pytorch_cache_segment: bool,
    /// extension: how many of `blocks` (and of `bytes`) were still live
    /// when their context was destroyed (a device reset, the last release
    /// of a primary context, `cuCtxDestroy`). They stay leaks, but the
    /// device no longer holds them: they are not in `totals.live_bytes`,
    /// the peak, the timeline or an out-of-memory report's holders.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub torn_down_blocks: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub torn_down_bytes: u64,
}

/// extension: one native stack of a group, with what it allocated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawStack {
    pub blocks: u64,
    pub bytes: u64,
    pub native_stack: Vec<NativeFrame>,
}

/// extension: a suppression that matched, with what it matched (as LSan's
/// "Suppressions used" table).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuppressionUse {
    pub pattern: String,
    pub groups: u64,
    pub blocks: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub format: String,
    pub version: u32,
    pub trigger: Trigger,
    pub sequence: u64,
    pub pid: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppid: Option<i64>,
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default)]
    pub rank: Option<i64>,
    /// extension: tells apart processes that share a pid (exec, pid reuse);
    /// also part of the report's file name
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    pub timestamp_ms: i64,
    pub totals: Totals,
    pub leaks: Vec<Group>,
    pub growth: Vec<Group>,
    #[serde(default)]
    pub suppressed: Vec<Group>,
    /// extension: the reason passed to `cudaleak_dump`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// extension: exit status of the process, for exit reports where known
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    /// extension: the signal number, for signal and fatal-signal dumps
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// extension
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suppressions_used: Vec<SuppressionUse>,
    /// extension: state of Python stack capture in this process
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// extension: shards that could not be read in time (dump at exit while
    /// another thread held a lock); totals then cover the rest
    #[serde(default, skip_serializing_if = "is_zero")]
    pub incomplete_shards: u64,
    /// extension: the files a merged report was made from
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<String>,
    /// extension: the `cudaleak run` this process ran under
    /// (`CUDALEAK_RUN_ID`); the gate selects its reports by it
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// extension: live memory over time by call site, sampled up to this
    /// report (`CUDALEAK_TIMELINE`)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<SampledTimeline>,
    /// extension: the failed request of an `oom` report
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomRequest>,
    /// extension: what was live when the process's live bytes were highest
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<Peak>,
    /// extension: the process's out-of-memory episodes up to this report
    /// (absent before the first); bounded, see `OOM_EVENTS_KEPT`
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_events: Vec<OomEvent>,
    /// extension: the last allocation events (`CUDALEAK_TRACE`), which
    /// `--format torch-snapshot` replays
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_trace: Option<AllocationTrace>,
}

/// extension: the process's last allocation events, oldest first, kept in
/// a ring of `capacity` events (`CUDALEAK_TRACE`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationTrace {
    pub capacity: u64,
    /// events recorded in all since the process started (or forked);
    /// the ring holds the last `capacity` of them
    pub recorded: u64,
    /// the call sites the events name, as groups (`bytes`, `blocks`: 0)
    pub sites: Vec<Group>,
    pub events: Vec<AllocationEvent>,
}

/// extension: one allocation event of `allocation_trace`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationEvent {
    /// "alloc", "free" (a release that succeeded) or "oom" (an allocation
    /// call that failed for lack of memory; `address` "0x0")
    pub action: String,
    /// hex
    pub address: String,
    pub size: u64,
    /// index into `sites`; null when the stack was not kept
    pub site: Option<u32>,
    pub device: Option<u32>,
    /// Unix time in microseconds (the coarse clock's tick: a few ms)
    pub timestamp_us: i64,
}

/// extension: the allocation call that failed for lack of memory, as an
/// `oom` report gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomRequest {
    /// the call the program made (a runtime call is one failure, whatever
    /// driver calls it made)
    pub api: String,
    pub requested_bytes: u64,
    pub native_stack: Vec<NativeFrame>,
    pub python_stack: Vec<PythonFrame>,
    /// Python frames in the place of the interpreter's, as in a group
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_stack: Vec<MergedFrame>,
    /// the device the call allocated on, when known
    pub device: Option<u32>,
    /// the real driver's `cuMemGetInfo_v2` right after the failure (null
    /// when it could not be had)
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    /// the failed calls this report stands for: the first, and those that
    /// failed within one second after it
    pub failed_calls: u64,
    /// Unix time of the first failure, in milliseconds
    pub timestamp_ms: i64,
}

/// extension: one out-of-memory episode of a process: a failed
/// allocation call and those that failed within one second after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomEvent {
    pub timestamp_ms: i64,
    pub api: String,
    pub requested_bytes: u64,
    pub failed_calls: u64,
    pub device: Option<u32>,
    /// the driver's free memory right after the first failure (the
    /// episode's `oom` report's `device_free_bytes`); absent or null when
    /// no report was taken, or the driver could not say
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free_bytes: Option<u64>,
    /// file name of the episode's `oom` report; null when
    /// CUDALEAK_OOM_REPORTS stopped it (or it was not written yet)
    pub report: Option<String>,
}

/// Episodes `oom_events` keeps: the first [`OOM_EVENTS_KEPT`] / 2 and the
/// latest ones; `totals.failed_allocations` counts every failed call.
pub const OOM_EVENTS_KEPT: usize = 64;

/// extension: the high-water mark of the process's live bytes and the
/// groups live at that moment (blocks freed since included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peak {
    /// equal to `totals.peak_bytes`
    pub bytes: u64,
    /// Unix time at which the peak was reached, in milliseconds
    pub timestamp_ms: i64,
    /// largest first, at most CUDALEAK_MAX_GROUPS; no suppressions apply
    pub groups: Vec<Group>,
    /// the groups past the cap
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups_left_out: Option<LeftOut>,
}

/// extension: live memory over time by call site (`CUDALEAK_TIMELINE`;
/// see `site_timeline.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledTimeline {
    pub period_ms: u64,
    /// samples taken in all, including those merged away
    pub samples_taken: u64,
    /// the call sites the samples name; `bytes` and `blocks`: the most
    /// bytes live at one sample, and 0
    pub sites: Vec<Group>,
    pub samples: Vec<TimelineSample>,
    /// the sample with the most live bytes, with more of its call sites
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<TimelineSample>,
    /// every call site's live bytes at each sample, so that a
    /// picture chooses its sites from the whole run
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<SiteSeries>,
    /// call sites whose series were not kept (memory bound); their bytes
    /// are in the samples' totals
    #[serde(default, skip_serializing_if = "is_zero")]
    pub series_dropped: u64,
}

/// extension: one call site's live bytes at each sample of the timeline,
/// thinned as the samples are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteSeries {
    /// index into the timeline's `sites`
    pub site: u32,
    /// index of the sample of `values[0]`; before it, and past the last
    /// value, the site held nothing
    pub start: u32,
    pub values: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineSample {
    pub timestamp_ms: i64,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub peak_bytes: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_memory: BTreeMap<MemoryKind, u64>,
    /// `[index into sites, live bytes]`, most bytes first
    pub sites: Vec<(u32, u64)>,
    /// live bytes of the call sites not listed
    pub other_bytes: u64,
}

/// The environment variable by which `cudaleak run` passes its run id to
/// the library, which writes it into each report (`run_id`) and its marker.
pub const RUN_ID_ENV: &str = "CUDALEAK_RUN_ID";

/// Name prefix of the marker a process under `cudaleak run` leaves in the
/// report directory from its first CUDA call until its final report is
/// written: `.cudaleak-active.<pid>.<instance>`, holding the run id.
pub const RUN_MARKER_PREFIX: &str = ".cudaleak-active.";

/// The file `cudaleak dump PID` creates in a process's report directory
/// to ask for a live dump; the library's dumper thread looks for it,
/// deletes it and writes a report (trigger `api`, reason `cudaleak dump`).
/// One spelling for both sides of the protocol.
pub fn dump_request_name(pid: i32) -> String {
    format!(".cudaleak-dump-request.{pid}")
}

/// The largest report file the CLI reads (the error names it): 256 MiB.
/// Reading takes several times the file's size in memory.
pub const MAX_REPORT_BYTES: u64 = 256 << 20;

/// A sum of counters that stops at `u64::MAX` instead of wrapping.
pub fn saturating_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0u64, u64::saturating_add)
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// Why a file is not a report this version can read.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    /// not a regular file, or larger than [`MAX_REPORT_BYTES`]
    Unreadable(crate::base::safe_read::SafeReadError),
    NotJson(String),
    Foreign,
    NewerVersion(u64),
    Invalid(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Unreadable(e) => write!(f, "{e}"),
            ReadError::NotJson(e) => write!(f, "not a JSON report (truncated or corrupt?): {e}"),
            ReadError::Foreign => write!(f, "not a cudaleak report (no \"format\": \"cudaleak\")"),
            ReadError::NewerVersion(v) => write!(
                f,
                "report version {v} is newer than this cudaleak understands (version {VERSION}); upgrade cudaleak"
            ),
            ReadError::Invalid(e) => write!(f, "malformed cudaleak report: {e}"),
        }
    }
}

impl SampledTimeline {
    /// Each site's bytes at every sample, where the report kept its whole
    /// series (`series`); None for a site it did not.
    pub fn whole_series(&self) -> Vec<Option<Vec<u64>>> {
        let n = self.samples.len();
        let mut whole: Vec<Option<Vec<u64>>> = vec![None; self.sites.len()];
        for s in &self.series {
            if let Some(slot) = whole.get_mut(s.site as usize) {
                let mut v = vec![0u64; n];
                for (k, &b) in s.values.iter().enumerate() {
                    if let Some(x) = v.get_mut((s.start as usize).saturating_add(k)) {
                        *x = b;
                    }
                }
                *slot = Some(v);
            }
        }
        whole
    }
}

impl TimelineSample {
    /// What this sample lists of site `site`: 0 when the site is not among
    /// its largest.
    pub fn listed(&self, site: usize) -> u64 {
        self.sites
            .iter()
            .find(|&&(i, _)| i as usize == site)
            .map_or(0, |&(_, b)| b)
    }
}

impl Report {
    /// An exit report of nothing (pid 1, no command), for tests to fill in.
    #[cfg(test)]
    pub(crate) fn empty_for_tests() -> Report {
        Report::parse(
            r#"{"format":"cudaleak","version":1,"trigger":"exit","sequence":1,"pid":1,"command":[],
                "timestamp_ms":0,"totals":{"live_blocks":0,"live_bytes":0,"peak_bytes":0,"allocations":0,
                "frees":0,"failed_allocations":0,"invalid_frees":0},"leaks":[],"growth":[]}"#,
        )
        .expect("a valid report")
    }

    pub fn parse(text: &str) -> Result<Report, ReadError> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ReadError::NotJson(e.to_string()))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(ReadError::Foreign);
        }
        match v.get("version").and_then(|v| v.as_u64()) {
            Some(1) => {}
            Some(n) if n > 1 => return Err(ReadError::NewerVersion(n)),
            _ => return Err(ReadError::Invalid("missing or bad \"version\"".into())),
        }
        serde_json::from_value(v).map_err(|e| ReadError::Invalid(e.to_string()))
    }

    /// Reads a report file: only a regular file of at most
    /// [`MAX_REPORT_BYTES`] (a FIFO named like a report hung the CLI, and
    /// `report /dev/zero` read until it was OOM-killed).
    pub fn read(path: &std::path::Path) -> Result<Report, ReadError> {
        let bytes =
            crate::base::safe_read::read_regular_file(path, MAX_REPORT_BYTES).map_err(|e| match e {
                crate::base::safe_read::SafeReadError::Io(io) => ReadError::Io(io),
                other => ReadError::Unreadable(other),
            })?;
        let text = String::from_utf8(bytes).map_err(|e| ReadError::NotJson(e.to_string()))?;
        Report::parse(&text)
    }

    /// Whether `leaks` holds a leak for the gate: a group other than loaded
    /// modules (`MemoryKind::is_leak`), or groups left out by the cap.
    pub fn has_leaks(&self) -> bool {
        self.leaks.iter().any(|g| g.kind().is_leak())
            || self.totals.groups_left_out.is_some_and(|l| l.groups > 0)
    }

    /// Bytes of memory in `leaks` (reserved address space, imported memory
    /// and pools not counted), those left out by CUDALEAK_MAX_GROUPS
    /// included; saturating: a crafted report with two groups of
    /// `u64::MAX` bytes printed 18446744073709551614.
    pub fn leaked_bytes(&self) -> u64 {
        let left_out = self.totals.groups_left_out.map_or(0, |l| l.bytes);
        let kept = saturating_sum(
            self.leaks
                .iter()
                .filter(|g| g.kind().counts_in_live_bytes() && g.kind().is_leak())
                .map(|g| g.bytes),
        );
        kept.saturating_add(left_out)
    }

    /// Blocks of the leak groups, those left out included.
    pub fn leaked_blocks(&self) -> u64 {
        let left_out = self.totals.groups_left_out.map_or(0, |l| l.blocks);
        saturating_sum(self.leaks.iter().filter(|g| g.kind().is_leak()).map(|g| g.blocks))
            .saturating_add(left_out)
    }
}

impl Group {
    /// A group with no merged stack, examples, deltas, suppression or trend.
    pub fn new(
        blocks: u64,
        bytes: u64,
        api: &str,
        memory: MemoryKind,
        native_stack: Vec<NativeFrame>,
        python_stack: Vec<PythonFrame>,
    ) -> Group {
        Group {
            blocks,
            bytes,
            api: api.to_string(),
            memory: memory.shared_kind(),
            memory_kind: (memory.shared_kind() != memory).then_some(memory),
            native_stack,
            python_stack,
            merged_stack: Vec::new(),
            examples: Vec::new(),
            blocks_delta: None,
            bytes_delta: None,
            suppression: None,
            trend: None,
            raw_stacks: Vec::new(),
            pytorch_cache_segment: false,
            torn_down_blocks: 0,
            torn_down_bytes: 0,
        }
    }

    /// The precise memory kind of the group.
    pub fn kind(&self) -> MemoryKind {
        self.memory_kind.unwrap_or(self.memory)
    }
}
