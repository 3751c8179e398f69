//! From a snapshot of live blocks to a [`Report`]: grouping by trace,
//! symbolization, Python frames and the merged stack, runtime attribution,
//! suppressions, growth since the previous dump and trend flags.
//!
//! Everything here is independent of the process it runs in: the preload
//! crate feeds real snapshots, the unit tests feed fake ones.
//!
//! A dump's extra memory is bounded by the groups it writes, not by the
//! distinct stacks alive (issue 15: 131,072 leaked stacks of 30 frames took
//! 3.5 GiB to write 1000 of them). Every trace is symbolized through the
//! dump's [`FrameTable`] (each return address once, each string kept once)
//! into a `GroupSummary`: its key as a [`KeyDigest`], counts, its
//! suppression verdict and sort label. Grouping, growth, suppression and
//! order are decided on those; full [`Group`]s are made only for the groups
//! of each list that will be written.

use crate::record::depot::{Depot, TraceRef};
use crate::record::python::{eval_groups, CodeTable, PyRawFrame, PythonFrame};
use crate::record::{Block, MemoryKind, TraceId};
use crate::report::group_key::{is_call_machinery_named, FrameDigest, KeyDigest, KeyFrameRef};
use crate::report::suppress::{Matcher, Suppressions};
use crate::report::{
    BlockExample, Group, KindTotals, LeftOut, MergedFrame, NativeFrame, Peak, RawStack, Report,
    SuppressionUse, Totals, Trend, Trigger, FORMAT, VERSION,
};
use crate::symbolize::frame_table::{FrameTable, NativeId, PythonId, StrId};
use crate::symbolize::{hex, SymbolSource};
use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

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
    pub allocations: u64,
    pub frees: u64,
    pub failed_allocations: u64,
    pub invalid_frees: u64,
    pub peak_bytes: u64,
    pub incomplete_shards: u64,
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

/// Per-group history across the dumps of one process, by the digest of
/// the key that groups a dump ([`KeyDigest`] of a
/// [`GroupKey`](crate::report::group_key::GroupKey)): a group cannot "grow" by
/// moving between two interpreter call sites. 16 bytes of key per group,
/// not its symbolized stack (issue 15).
pub struct GrowthTracker<K = KeyDigest> {
    dumps: u32,
    history: HashMap<K, History>,
}

impl<K> Default for GrowthTracker<K> {
    fn default() -> Self {
        GrowthTracker {
            dumps: 0,
            history: HashMap::new(),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct History {
    blocks: u64,
    bytes: u64,
    /// consecutive dumps, ending with the latest, at which bytes grew
    streak: u32,
    ever_grew: bool,
    /// the dump that last saw the group
    seen_at: u32,
}

/// Dumps needed before trend flags are given.
pub const TREND_MIN_DUMPS: u32 = 3;

/// How one trace changed at the latest dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub blocks_delta: i64,
    pub bytes_delta: i64,
    pub trend: Option<Trend>,
}

impl<K: Clone + Eq + std::hash::Hash> GrowthTracker<K> {
    /// Records one dump ((group, blocks, bytes) for each group present)
    /// and returns each group's change since the previous dump (since
    /// process start for the first), in the order given. A key is hashed
    /// once per dump and cloned only the first time it is seen.
    pub fn observe<'a>(&mut self, current: impl IntoIterator<Item = (&'a K, u64, u64)>) -> Vec<Change>
    where
        K: 'a,
    {
        self.dumps += 1;
        let dump = self.dumps;
        let mut out = Vec::new();
        for (id, blocks, bytes) in current {
            let h = match self.history.get_mut(id) {
                Some(h) => h,
                None => self.history.entry(id.clone()).or_default(),
            };
            h.seen_at = dump;
            let grew = bytes > h.bytes;
            h.streak = if grew { h.streak + 1 } else { 0 };
            h.ever_grew |= grew;
            let trend = if dump < TREND_MIN_DUMPS {
                None
            } else if h.streak >= TREND_MIN_DUMPS {
                Some(Trend::Growing)
            } else if h.ever_grew && h.streak == 0 {
                Some(Trend::Bounded)
            } else {
                None
            };
            out.push(Change {
                blocks_delta: blocks as i64 - h.blocks as i64,
                bytes_delta: bytes as i64 - h.bytes as i64,
                trend,
            });
            h.blocks = blocks;
            h.bytes = bytes;
        }
        // A group with nothing live starts over if it comes back.
        self.history.retain(|_, h| h.seen_at == dump);
        out
    }

    pub fn dumps(&self) -> u32 {
        self.dumps
    }
}

/// Runtime entry points and the driver calls they make: a driver-level
/// trace whose stack passes through one of these functions (a statically
/// linked runtime, which no hook can interpose) is attributed to it.
const RUNTIME_ATTRIBUTION: &[(&str, &[&str])] = &[
    ("cudaMalloc", &["cuMemAlloc_v2"]),
    ("cudaMallocPitch", &["cuMemAllocPitch_v2"]),
    ("cudaMalloc3D", &["cuMemAllocPitch_v2"]),
    ("cudaMallocManaged", &["cuMemAllocManaged"]),
    ("cudaMallocHost", &["cuMemAllocHost_v2", "cuMemHostAlloc"]),
    ("cudaHostAlloc", &["cuMemHostAlloc", "cuMemAllocHost_v2"]),
    ("cudaMallocAsync", &["cuMemAllocAsync", "cuMemAllocAsync_ptsz"]),
    (
        "cudaMallocAsync_ptsz",
        &["cuMemAllocAsync_ptsz", "cuMemAllocAsync"],
    ),
    (
        "cudaMallocFromPoolAsync",
        &["cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"],
    ),
    ("cudaHostRegister", &["cuMemHostRegister_v2", "cuMemHostRegister"]),
    (
        "cudaIpcOpenMemHandle",
        &["cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"],
    ),
];

/// The api of a group whose trace is not in the depot.
const UNKNOWN_API: &str = "unknown";

/// The runtime entry point named `function` if it makes driver call `api`.
fn runtime_entry(api: &str, function: Option<&str>) -> Option<&'static str> {
    let function = function?;
    RUNTIME_ATTRIBUTION
        .iter()
        .find(|(rt, drivers)| *rt == function && drivers.contains(&api))
        .map(|(rt, _)| *rt)
}

fn is_eval_loop(function: Option<&str>) -> bool {
    function.is_some_and(|n| n == "_PyEval_EvalFrameDefault" || n == "PyEval_EvalFrameEx")
}

/// Ranges of `frames` that are one physical frame each (one address,
/// possibly several inlined functions). Generic over how a frame is held:
/// a report's [`NativeFrame`], or an id into a dump's [`FrameTable`], so
/// that grouping and the written group read the same stack the same way.
fn physical_frames<T>(frames: &[T], same_address: impl Fn(&T, &T) -> bool) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=frames.len() {
        if i == frames.len() || !same_address(&frames[i], &frames[start]) {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// If the stack passes through a runtime entry point (`runtime_of` a frame:
/// the entry point it is, if it makes the traced driver call), returns that
/// entry point and drops it and everything inside it.
fn attribute_runtime_by<T>(
    native: &mut Vec<T>,
    same_address: impl Fn(&T, &T) -> bool,
    runtime_of: impl Fn(&T) -> Option<&'static str>,
) -> Option<&'static str> {
    // Only the innermost few physical frames: the runtime is directly below.
    let (rt, end) = physical_frames(native, same_address)
        .into_iter()
        .take(8)
        .find_map(|pf| {
            native[pf.clone()]
                .iter()
                .find_map(&runtime_of)
                .map(|rt| (rt, pf.end))
        })?;
    native.drain(..end);
    Some(rt)
}

fn attribute_runtime(api: &str, native: &mut Vec<NativeFrame>) -> Option<&'static str> {
    attribute_runtime_by(
        native,
        |a, b| a.address == b.address,
        |f| runtime_entry(api, f.function.as_deref()),
    )
}

/// One frame of a merged stack: an index into the native or the Python
/// frames.
#[derive(Clone, Copy, Debug)]
enum MergedRef {
    Native(usize),
    Python(usize),
}

/// The order of [`merge_stacks`], as indices (see [`physical_frames`] for
/// why it is generic).
fn merged_order<T>(
    native: &[T],
    python_raw: &[PyRawFrame],
    same_address: impl Fn(&T, &T) -> bool,
    eval_loop: impl Fn(&T) -> bool,
) -> Vec<MergedRef> {
    let groups = eval_groups(python_raw);
    let mut next_group = 0;
    let mut out = Vec::with_capacity(native.len() + python_raw.len());
    for pf in physical_frames(native, same_address) {
        if next_group < groups.len() && native[pf.clone()].iter().any(&eval_loop) {
            out.extend(groups[next_group].clone().map(MergedRef::Python));
            next_group += 1;
        } else {
            out.extend(pf.map(MergedRef::Native));
        }
    }
    for g in &groups[next_group..] {
        out.extend(g.clone().map(MergedRef::Python));
    }
    out
}

/// Puts Python frames in the place of the interpreter's eval-loop frames:
/// the k-th `_PyEval_EvalFrameDefault` physical frame (innermost first)
/// becomes the k-th group of Python frames (see [`eval_groups`]). Python
/// groups left over (native unwinding stopped early) go at the end.
pub fn merge_stacks(
    native: &[NativeFrame],
    python_raw: &[PyRawFrame],
    python: &[PythonFrame],
) -> Vec<MergedFrame> {
    merged_order(
        native,
        python_raw,
        |a, b| a.address == b.address,
        |f| is_eval_loop(f.function.as_deref()),
    )
    .into_iter()
    .map(|m| match m {
        MergedRef::Native(i) => MergedFrame::Native(native[i].clone()),
        MergedRef::Python(i) => MergedFrame::Python(python[i].clone()),
    })
    .collect()
}

/// Adds group `g`, made by another raw stack with the same key, to `m`:
/// counts, examples, and both raw stacks in `raw_stacks`, largest first;
/// the group shows the largest one's stacks.
fn add_raw_stack(m: &mut Group, g: Group) {
    if m.raw_stacks.is_empty() {
        m.raw_stacks.push(RawStack {
            blocks: m.blocks,
            bytes: m.bytes,
            native_stack: m.native_stack.clone(),
        });
    }
    let largest = (m.raw_stacks[0].bytes, m.raw_stacks[0].blocks);
    if (g.bytes, g.blocks) > largest {
        m.native_stack = g.native_stack.clone();
        m.merged_stack = g.merged_stack;
        m.python_stack = g.python_stack;
    }
    m.raw_stacks.push(RawStack {
        blocks: g.blocks,
        bytes: g.bytes,
        native_stack: g.native_stack,
    });
    // Stable: of equal ones, the first seen stays first.
    m.raw_stacks
        .sort_by_key(|r| std::cmp::Reverse((r.bytes, r.blocks)));
    m.blocks += g.blocks;
    m.bytes += g.bytes;
    m.pytorch_cache_segment |= g.pytorch_cache_segment;
    let room = EXAMPLES_PER_GROUP.saturating_sub(m.examples.len());
    m.examples.extend(g.examples.into_iter().take(room));
}

struct Acc {
    blocks: u64,
    bytes: u64,
    examples: Vec<BlockExample>,
}

/// The group of trace `t`, from its symbolized native and resolved Python
/// frames.
fn build_group(t: &TraceRef, acc: Acc, mut native: Vec<NativeFrame>, python: Vec<PythonFrame>) -> Group {
    let mut api = t.api.name();
    if !t.api.is_runtime() {
        if let Some(rt) = attribute_runtime(api, &mut native) {
            api = rt;
        }
    }
    let merged_stack = if python.is_empty() {
        Vec::new()
    } else {
        merge_stacks(&native, t.python, &python)
    };
    let pytorch_cache_segment = native
        .iter()
        .any(|f| f.function.as_deref().is_some_and(is_pytorch_caching_allocator));
    Group {
        merged_stack,
        examples: acc.examples,
        pytorch_cache_segment,
        ..Group::new(acc.blocks, acc.bytes, api, t.kind, native, python)
    }
}

/// A function of PyTorch's default CUDA caching allocator (demangled, or
/// mangled where demangling failed): a block allocated through it is a
/// segment the allocator reserved, which it carves into tensors. The
/// `backend:cudaMallocAsync` allocator lives in the same namespace
/// (`c10::cuda::CUDACachingAllocator::CudaMallocAsync`) but makes one
/// allocation per tensor: not a cache.
pub fn is_pytorch_caching_allocator(function: &str) -> bool {
    let caching = function.contains("c10::cuda::CUDACachingAllocator")
        || function.contains("3c104cuda20CUDACachingAllocator");
    caching && !function.contains("CudaMallocAsync")
}

/// The group of blocks whose trace is not in the depot.
fn unknown_group(acc: Acc) -> Group {
    Group {
        examples: acc.examples,
        ..Group::new(
            acc.blocks,
            acc.bytes,
            UNKNOWN_API,
            MemoryKind::Device,
            vec![],
            vec![],
        )
    }
}

/// One trace's live blocks in a dump, and the group it joined.
#[derive(Clone, Copy)]
struct TraceCount {
    id: TraceId,
    /// index into the dump's groups
    group: u32,
    blocks: u64,
    bytes: u64,
}

/// The frame that `render::top_frame_label` names a group by (the sort's
/// last tie-breaker): its first Python frame, else its first native frame
/// with a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Label {
    Python(PythonId),
    Native(NativeId),
    Unknown,
}

/// What grouping, suppression and sorting read of one trace's group, as
/// [`build_group`] would make it.
struct TraceFacts {
    digest: KeyDigest,
    api: &'static str,
    kind: MemoryKind,
    label: Label,
    verdict: Option<usize>,
}

/// One group of a dump, before it is written (if it is): what [`Group`]
/// would hold, less its frames, examples and raw stacks. About 100 bytes.
struct GroupSummary {
    digest: KeyDigest,
    blocks: u64,
    bytes: u64,
    /// of the group's first trace, as [`add_raw_stack`] keeps them
    api: &'static str,
    kind: MemoryKind,
    /// (bytes, blocks) of the raw stack the group shows: its largest, the
    /// first seen of equal ones (as [`add_raw_stack`] picks it)
    largest: (u64, u64),
    /// of the raw stack the group shows
    label: Label,
    /// the suppression rule that matches the raw stack the group shows
    verdict: Option<usize>,
}

/// Suppression verdicts of one dump, one per distinct frame name: what
/// [`Matcher::match_group`] gives, read from the names of a [`FrameTable`].
struct NameVerdicts<'s> {
    /// none without rules
    matcher: Option<Matcher<'s>>,
    /// by string of the table; `None`: not asked yet
    by_name: Vec<Option<Option<usize>>>,
}

impl<'s> NameVerdicts<'s> {
    fn new(suppressions: &'s Suppressions) -> NameVerdicts<'s> {
        NameVerdicts {
            matcher: (!suppressions.is_empty()).then(|| suppressions.matcher()),
            by_name: Vec::new(),
        }
    }

    /// The first rule that matches `name`: the verdict on a group with
    /// that one name (`Matcher` matches groups, caching per name).
    fn of_name(&mut self, table: &FrameTable, name: StrId) -> Option<usize> {
        let matcher = self.matcher.as_mut()?;
        let i = name as usize;
        if self.by_name.len() <= i {
            self.by_name.resize(i + 1, None);
        }
        if let Some(v) = self.by_name[i] {
            return v;
        }
        let one_name = NativeFrame {
            function: Some(table.string(name).to_string()),
            ..NativeFrame::default()
        };
        let probe = Group::new(0, 0, "", MemoryKind::Device, vec![one_name], vec![]);
        let v = matcher.match_group(&probe);
        self.by_name[i] = Some(v);
        v
    }

    /// The first rule that matches a frame of the stack, as
    /// [`Matcher::match_group`]: native frames (function, file, module),
    /// then Python frames (function, file), innermost first.
    fn of_stack(&mut self, table: &FrameTable, native: &[NativeId], python: &[PythonId]) -> Option<usize> {
        self.matcher.as_ref()?;
        let native_names = native
            .iter()
            .flat_map(|&f| table.native_names(f).into_iter().flatten());
        let python_names = python.iter().flat_map(|&p| table.python_names(p));
        native_names
            .chain(python_names)
            .find_map(|name| self.of_name(table, name))
    }
}

/// The text `render::top_frame_label` gives a group named by `label`
/// (it reads that one frame).
fn label_text(table: &FrameTable, label: Label) -> String {
    let (native, python) = match label {
        Label::Python(p) => (vec![], vec![table.python_frame_owned(p)]),
        Label::Native(f) => (vec![table.native_frame(f)], vec![]),
        Label::Unknown => (vec![], vec![]),
    };
    crate::report::render::top_frame_label(&Group::new(0, 0, "", MemoryKind::Device, native, python))
}

/// Each group's label as a rank: groups compare by rank as by label text,
/// and each distinct label's text is made once.
fn label_ranks(table: &FrameTable, groups: &[GroupSummary]) -> Vec<u32> {
    let mut text: HashMap<Label, String> = HashMap::new();
    for g in groups {
        text.entry(g.label).or_insert_with(|| label_text(table, g.label));
    }
    let mut by_text: Vec<(&String, Label)> = text.iter().map(|(l, t)| (t, *l)).collect();
    by_text.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut rank: HashMap<Label, u32> = HashMap::with_capacity(by_text.len());
    let mut r = 0u32;
    for (i, (t, l)) in by_text.iter().enumerate() {
        if i > 0 && by_text[i - 1].0 != *t {
            r += 1;
        }
        rank.insert(*l, r);
    }
    groups.iter().map(|g| rank[&g.label]).collect()
}

/// The order of a dump's lists: bytes, then blocks (both largest first),
/// API, and the label's rank ([`label_ranks`]).
fn group_order(groups: &[GroupSummary], ranks: &[u32], a: u32, b: u32) -> Ordering {
    let (x, y) = (&groups[a as usize], &groups[b as usize]);
    y.bytes
        .cmp(&x.bytes)
        .then(y.blocks.cmp(&x.blocks))
        .then_with(|| x.api.cmp(y.api))
        .then_with(|| ranks[a as usize].cmp(&ranks[b as usize]))
}

/// Everything a dump needs besides the snapshot.
pub struct Assembler<'a> {
    pub depot: &'a Depot,
    pub codes: &'a CodeTable,
    pub symbols: &'a mut dyn SymbolSource,
    pub suppressions: &'a Suppressions,
    pub growth: &'a mut GrowthTracker,
}

impl Assembler<'_> {
    /// The call site of trace `id` as a group with no blocks or bytes,
    /// symbolized as in the report (the sampled timeline names its sites
    /// with it).
    pub fn site_group(&mut self, id: TraceId) -> Option<Group> {
        let t = self.depot.get(id)?;
        let mut native: Vec<NativeFrame> = Vec::with_capacity(t.native.len());
        for &ra in t.native {
            native.extend(self.symbols.symbolize(ra));
        }
        let python: Vec<_> = t.python.iter().map(|f| self.codes.resolve(f)).collect();
        let acc = Acc {
            blocks: 0,
            bytes: 0,
            examples: Vec::new(),
        };
        Some(build_group(&t, acc, native, python))
    }

    /// What grouping, suppression and sorting need of trace `id`, its
    /// frames symbolized and resolved through `table`. `native` and
    /// `python` are scratch space.
    fn facts(
        &mut self,
        table: &mut FrameTable,
        verdicts: &mut NameVerdicts,
        digests: &mut FrameDigests,
        native: &mut Vec<NativeId>,
        python: &mut Vec<PythonId>,
        id: TraceId,
    ) -> TraceFacts {
        let Some(t) = self.depot.get(id) else {
            return TraceFacts {
                digest: KeyDigest::of(UNKNOWN_API, MemoryKind::Device.shared_kind(), []),
                api: UNKNOWN_API,
                kind: MemoryKind::Device,
                label: Label::Unknown,
                verdict: None,
            };
        };
        native.clear();
        for &ra in t.native {
            native.extend(table.native_frames(&mut *self.symbols, ra));
        }
        python.clear();
        python.extend(t.python.iter().map(|f| table.python_frame(self.codes, f)));
        let table = &*table;
        let same_address = |a: &NativeId, b: &NativeId| table.address(*a) == table.address(*b);
        let mut api = t.api.name();
        if !t.api.is_runtime() {
            let driver = api;
            if let Some(rt) = attribute_runtime_by(native, same_address, |f| {
                runtime_entry(driver, table.function(*f))
            }) {
                api = rt;
            }
        }
        // The key as `GroupKey::of` makes it from the group `build_group`
        // would make.
        let memory = t.kind.shared_kind();
        let merged = if python.is_empty() {
            Vec::new()
        } else {
            merged_order(native, t.python, same_address, |f| {
                is_eval_loop(table.function(*f))
            })
        };
        let digest = if merged.is_empty() {
            KeyDigest::of_digests(api, memory, native.iter().map(|&f| digests.native(table, f)))
        } else {
            let frames = merged.iter().filter_map(|m| match *m {
                MergedRef::Python(i) => Some(digests.python(table, python[i])),
                MergedRef::Native(i)
                    if is_call_machinery_named(table.module(native[i]), table.function(native[i])) =>
                {
                    None
                }
                MergedRef::Native(i) => Some(digests.native(table, native[i])),
            });
            KeyDigest::of_digests(api, memory, frames)
        };
        let label = match python.first() {
            Some(&p) => Label::Python(p),
            None => native
                .iter()
                .find(|&&f| table.function(f).is_some())
                .map_or(Label::Unknown, |&f| Label::Native(f)),
        };
        TraceFacts {
            digest,
            api,
            kind: t.kind,
            label,
            verdict: verdicts.of_stack(table, native, python),
        }
    }

    /// Groups `traces` (sorted by trace id) by merged stack
    /// (`group_key.rs`), symbolizing each through `table`: one summary per
    /// group, in order of first trace; each trace's `group` is set.
    fn summarize(
        &mut self,
        table: &mut FrameTable,
        verdicts: &mut NameVerdicts,
        traces: &mut [TraceCount],
    ) -> Vec<GroupSummary> {
        let mut groups: Vec<GroupSummary> = Vec::new();
        let mut index: HashMap<KeyDigest, u32> = HashMap::with_capacity(traces.len());
        let (mut native, mut python) = (Vec::new(), Vec::new());
        let mut digests = FrameDigests::default();
        for t in traces.iter_mut() {
            let f = self.facts(table, verdicts, &mut digests, &mut native, &mut python, t.id);
            match index.entry(f.digest) {
                Entry::Occupied(e) => {
                    t.group = *e.get();
                    let g = &mut groups[t.group as usize];
                    // `add_raw_stack`: the group shows its largest raw stack.
                    if (t.bytes, t.blocks) > g.largest {
                        g.largest = (t.bytes, t.blocks);
                        g.label = f.label;
                        g.verdict = f.verdict;
                    }
                    g.blocks += t.blocks;
                    g.bytes += t.bytes;
                }
                Entry::Vacant(e) => {
                    t.group = groups.len() as u32;
                    e.insert(t.group);
                    groups.push(GroupSummary {
                        digest: f.digest,
                        blocks: t.blocks,
                        bytes: t.bytes,
                        api: f.api,
                        kind: f.kind,
                        largest: (t.bytes, t.blocks),
                        label: f.label,
                        verdict: f.verdict,
                    });
                }
            }
        }
        groups
    }

    /// The groups of the call-site counts `traces` (the process's peak),
    /// largest first, at most `max_groups` of them and what the rest hold.
    /// No suppressions apply: the peak is what held memory, whoever it was.
    fn plain_groups(
        &mut self,
        table: &mut FrameTable,
        mut traces: Vec<TraceCount>,
        max_groups: usize,
    ) -> (Vec<Group>, Option<LeftOut>) {
        traces.sort_unstable_by_key(|t| t.id);
        let no_rules = Suppressions::none();
        let mut verdicts = NameVerdicts::new(&no_rules);
        let groups = self.summarize(table, &mut verdicts, &mut traces);
        let ranks = label_ranks(table, &groups);
        let mut order: Vec<u32> = (0..groups.len() as u32).collect();
        order.sort_by(|a, b| group_order(&groups, &ranks, *a, *b));
        let mut left_out = None;
        if order.len() > max_groups {
            let mut left = LeftOut::default();
            for &i in &order[max_groups..] {
                let g = &groups[i as usize];
                left.groups += 1;
                left.blocks = left.blocks.saturating_add(g.blocks);
                left.bytes = left.bytes.saturating_add(g.bytes);
            }
            left_out = Some(left);
        }
        order.truncate(max_groups);
        let mut made = self.materialize(table, &Snapshot::default(), &traces, &order);
        (order.iter().filter_map(|i| made.remove(i)).collect(), left_out)
    }

    /// The full group of trace `id`, from the frames in `table`.
    fn group_from_table(&mut self, table: &mut FrameTable, id: TraceId, acc: Acc) -> Group {
        let Some(t) = self.depot.get(id) else {
            return unknown_group(acc);
        };
        let mut native = Vec::with_capacity(t.native.len());
        for &ra in t.native {
            for f in table.native_frames(&mut *self.symbols, ra) {
                native.push(table.native_frame(f));
            }
        }
        let python = t
            .python
            .iter()
            .map(|f| {
                let p = table.python_frame(self.codes, f);
                table.python_frame_owned(p)
            })
            .collect();
        build_group(&t, acc, native, python)
    }

    /// The full groups `wanted` (indices of the dump's groups), each made
    /// as a dump without a cap makes it: its traces in order, merged by
    /// [`add_raw_stack`], with their first examples.
    fn materialize(
        &mut self,
        table: &mut FrameTable,
        snap: &Snapshot,
        traces: &[TraceCount],
        wanted: &[u32],
    ) -> HashMap<u32, Group> {
        let slot: HashMap<u32, usize> = wanted.iter().enumerate().map(|(s, &g)| (g, s)).collect();
        let mut members: Vec<Vec<&TraceCount>> = vec![Vec::new(); wanted.len()];
        for t in traces {
            if let Some(&s) = slot.get(&t.group) {
                members[s].push(t);
            }
        }
        let mut examples: HashMap<TraceId, Vec<BlockExample>> =
            members.iter().flatten().map(|t| (t.id, Vec::new())).collect();
        for &(addr, b) in &snap.blocks {
            if let Some(e) = examples.get_mut(&b.trace) {
                if e.len() < EXAMPLES_PER_GROUP {
                    e.push(BlockExample {
                        address: hex(addr),
                        size: b.size(),
                        device: b.device(),
                    });
                }
            }
        }
        let mut out = HashMap::with_capacity(wanted.len());
        for (s, traces) in members.into_iter().enumerate() {
            let mut group: Option<Group> = None;
            for t in traces {
                let acc = Acc {
                    blocks: t.blocks,
                    bytes: t.bytes,
                    examples: examples.remove(&t.id).unwrap_or_default(),
                };
                let g = self.group_from_table(table, t.id, acc);
                match &mut group {
                    Some(m) => add_raw_stack(m, g),
                    None => group = Some(g),
                }
            }
            if let Some(g) = group {
                out.insert(wanted[s], g);
            }
        }
        out
    }

    /// The report of `snap`, every group written.
    pub fn assemble(&mut self, snap: &Snapshot, meta: DumpMeta) -> Report {
        self.assemble_at_most(snap, meta, usize::MAX)
    }

    /// The report of `snap` with at most `max_groups` groups in each list
    /// (`leaks`, `suppressed`, `growth`): the largest ones of
    /// [`Assembler::assemble`]'s lists, what `leaks` leaves out counted in
    /// `totals.groups_left_out`. The groups left out are counted, never
    /// made (issue 15).
    pub fn assemble_at_most(&mut self, snap: &Snapshot, meta: DumpMeta, max_groups: usize) -> Report {
        let mut per_trace: HashMap<TraceId, (u64, u64)> = HashMap::new();
        let mut by_memory: BTreeMap<MemoryKind, KindTotals> = BTreeMap::new();
        let mut live_bytes = 0u64;
        for &(_, b) in &snap.blocks {
            let counts = per_trace.entry(b.trace).or_default();
            counts.0 += 1;
            counts.1 = counts.1.saturating_add(b.size());
            let kind = self.depot.get(b.trace).map_or(MemoryKind::Device, |t| t.kind);
            if kind.counts_in_live_bytes() {
                live_bytes = live_bytes.saturating_add(b.size());
            }
            let k = by_memory.entry(kind).or_default();
            k.blocks += 1;
            k.bytes = k.bytes.saturating_add(b.size());
        }
        let mut traces: Vec<TraceCount> = per_trace
            .into_iter()
            .map(|(id, (blocks, bytes))| TraceCount {
                id,
                group: 0,
                blocks,
                bytes,
            })
            .collect();
        traces.sort_unstable_by_key(|t| t.id);

        // One group per merged stack (`group_key.rs`), not per raw trace:
        // traces are symbolized first, then merged by key, in trace order.
        let mut table = FrameTable::new();
        let mut verdicts = NameVerdicts::new(self.suppressions);
        let groups = self.summarize(&mut table, &mut verdicts, &mut traces);
        let changes = self
            .growth
            .observe(groups.iter().map(|g| (&g.digest, g.blocks, g.bytes)));

        let ranks = label_ranks(&table, &groups);
        let order = |a: &u32, b: &u32| -> Ordering { group_order(&groups, &ranks, *a, *b) };
        let all: Vec<u32> = (0..groups.len() as u32).collect();
        // Growth: unsuppressed groups that grew, in group order, then
        // sorted (stable, as every sort here).
        let mut growth_order: Vec<u32> = all
            .iter()
            .copied()
            .filter(|&i| changes[i as usize].bytes_delta > 0 && groups[i as usize].verdict.is_none())
            .collect();
        growth_order.sort_by(|a, b| {
            changes[*b as usize]
                .bytes_delta
                .cmp(&changes[*a as usize].bytes_delta)
                .then_with(|| order(a, b))
        });
        let mut sorted = all;
        sorted.sort_by(order);
        let (mut leak_order, mut suppressed_order): (Vec<u32>, Vec<u32>) = sorted
            .into_iter()
            .partition(|&i| groups[i as usize].verdict.is_none());

        // What each rule matched, in the order of the sorted groups (as
        // `Matcher::apply` tallies it), every suppressed group counted.
        let mut suppressions_used: Vec<SuppressionUse> = Vec::new();
        for &i in &suppressed_order {
            let g = &groups[i as usize];
            let Some(rule) = g.verdict else { continue };
            let pattern = &self.suppressions.rules[rule].pattern;
            crate::report::suppress::tally_use(&mut suppressions_used, pattern, g.blocks, g.bytes);
        }

        // The cap: the largest groups of each list; what `leaks` leaves out
        // is counted (issue 15: 100,000 leaked groups made a 1 GB report).
        let mut groups_left_out = None;
        if leak_order.len() > max_groups {
            let mut left = LeftOut::default();
            for &i in &leak_order[max_groups..] {
                let g = &groups[i as usize];
                left.groups += 1;
                left.blocks = left.blocks.saturating_add(g.blocks);
                if !g.kind.shared_kind().is_address_space() {
                    left.bytes = left.bytes.saturating_add(g.bytes);
                }
            }
            groups_left_out = Some(left);
        }
        leak_order.truncate(max_groups);
        suppressed_order.truncate(max_groups);
        growth_order.truncate(max_groups);

        // Only now full groups, for the lists as written.
        let mut wanted_mark = vec![false; groups.len()];
        let mut wanted = Vec::new();
        for &i in leak_order.iter().chain(&suppressed_order).chain(&growth_order) {
            if !std::mem::replace(&mut wanted_mark[i as usize], true) {
                wanted.push(i);
            }
        }
        drop(wanted_mark);
        let mut made = self.materialize(&mut table, snap, &traces, &wanted);
        for (&i, g) in made.iter_mut() {
            g.trend = changes[i as usize].trend;
        }
        let growth: Vec<Group> = growth_order
            .iter()
            .filter_map(|&i| {
                let c = changes[i as usize];
                let mut g = made.get(&i)?.clone();
                g.blocks_delta = Some(c.blocks_delta);
                g.bytes_delta = Some(c.bytes_delta);
                Some(g)
            })
            .collect();
        let leaks: Vec<Group> = leak_order.iter().filter_map(|i| made.remove(i)).collect();
        let suppressed: Vec<Group> = suppressed_order
            .iter()
            .filter_map(|i| {
                let mut g = made.remove(i)?;
                let rule = groups[*i as usize].verdict?;
                g.suppression = Some(self.suppressions.rules[rule].pattern.clone());
                Some(g)
            })
            .collect();

        let live_blocks = snap.blocks.len() as u64;
        let peak_bytes = snap.peak_bytes.max(live_bytes);
        let peak = snap.peak.as_ref().map(|p| {
            // Live bytes above the peak the counters were read at (a race
            // between the two reads): this snapshot is the peak.
            let (counts, timestamp_ms) = if live_bytes > p.bytes {
                let here = traces
                    .iter()
                    .filter(|t| {
                        self.depot
                            .get(t.id)
                            .is_none_or(|tr| tr.kind.counts_in_live_bytes())
                    })
                    .map(|t| TraceCount { group: 0, ..*t })
                    .collect();
                (here, meta.timestamp_ms)
            } else {
                let sites = p
                    .sites
                    .iter()
                    .map(|&(id, blocks, bytes)| TraceCount {
                        id,
                        group: 0,
                        blocks,
                        bytes,
                    })
                    .collect();
                (
                    sites,
                    if p.timestamp_ms > 0 {
                        p.timestamp_ms
                    } else {
                        meta.timestamp_ms
                    },
                )
            };
            let (groups, groups_left_out) = self.plain_groups(&mut table, counts, max_groups);
            Peak {
                bytes: peak_bytes,
                timestamp_ms,
                groups,
                groups_left_out,
            }
        });
        Report {
            format: FORMAT.into(),
            version: VERSION,
            trigger: meta.trigger,
            sequence: meta.sequence,
            pid: meta.pid,
            ppid: meta.ppid,
            command: meta.command,
            hostname: meta.hostname,
            rank: meta.rank,
            instance: meta.instance,
            timestamp_ms: meta.timestamp_ms,
            totals: Totals {
                live_blocks,
                live_bytes,
                peak_bytes,
                allocations: snap.allocations,
                frees: snap.frees,
                failed_allocations: snap.failed_allocations,
                invalid_frees: snap.invalid_frees,
                by_memory,
                stacks_dropped: self.depot.dropped(),
                groups_left_out,
            },
            leaks,
            growth,
            suppressed,
            reason: meta.reason,
            exit_status: meta.exit_status,
            signal: meta.signal,
            suppressions_used,
            python: meta.python,
            incomplete_shards: snap.incomplete_shards,
            merged_from: vec![],
            run_id: None,
            timeline: None,
            oom: None,
            peak,
            oom_events: Vec::new(),
            allocation_trace: None,
        }
    }
}

/// Each distinct frame's [`FrameDigest`] of one dump, by its id in the
/// dump's [`FrameTable`]: computed the first time a trace holds it.
#[derive(Default)]
struct FrameDigests {
    native: Vec<Option<FrameDigest>>,
    python: Vec<Option<FrameDigest>>,
}

impl FrameDigests {
    fn native(&mut self, table: &FrameTable, f: NativeId) -> FrameDigest {
        Self::cached(&mut self.native, f as usize, || {
            FrameDigest::of(KeyFrameRef::Native {
                function: table.function(f),
                file: table.file(f),
                line: table.line(f),
                module: table.module(f),
            })
        })
    }

    fn python(&mut self, table: &FrameTable, p: PythonId) -> FrameDigest {
        Self::cached(&mut self.python, p as usize, || {
            FrameDigest::of(KeyFrameRef::Python {
                function: table.python_function(p),
                file: table.python_file(p),
                line: table.python_line(p),
            })
        })
    }

    fn cached(v: &mut Vec<Option<FrameDigest>>, i: usize, make: impl FnOnce() -> FrameDigest) -> FrameDigest {
        if v.len() <= i {
            v.resize(i + 1, None);
        }
        *v[i].get_or_insert_with(make)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::depot::TraceKey;
    use crate::record::linetable::LineFormat;
    use crate::record::python::{CodeInfo, PY_FRAME_ENTRY};
    use crate::record::Api;
    use crate::report::group_key::GroupKey;

    /// Fake symbols: address → list of (function, file, line).
    struct FakeSymbols(HashMap<u64, Vec<(&'static str, &'static str, i64)>>);

    impl SymbolSource for FakeSymbols {
        fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
            let pc = ra - 1;
            match self.0.get(&ra) {
                Some(v) => v
                    .iter()
                    .map(|(f, file, line)| NativeFrame {
                        address: hex(pc),
                        function: Some(f.to_string()),
                        file: Some(file.to_string()),
                        line: Some(*line),
                        module: Some("/bin/app".into()),
                        ..NativeFrame::default()
                    })
                    .collect(),
                None => vec![NativeFrame {
                    address: hex(pc),
                    function: None,
                    file: None,
                    line: None,
                    module: None,
                    ..NativeFrame::default()
                }],
            }
        }
    }

    fn meta(seq: u64) -> DumpMeta {
        DumpMeta {
            trigger: Trigger::Exit,
            sequence: seq,
            pid: 42,
            ppid: Some(1),
            command: vec!["app".into()],
            hostname: Some("h".into()),
            rank: None,
            instance: None,
            timestamp_ms: 1,
            reason: None,
            exit_status: Some(0),
            signal: None,
            python: None,
        }
    }

    fn symbols() -> FakeSymbols {
        FakeSymbols(HashMap::from([
            (0x101, vec![("leak_a", "app.c", 10)]),
            (0x201, vec![("leak_b", "app.c", 20)]),
            (0x301, vec![("main", "app.c", 30)]),
            (0x401, vec![("cudaMalloc", "cudart.c", 5)]),
            (0x501, vec![("internal_alloc", "cudart.c", 2)]),
            (0x601, vec![("_PyEval_EvalFrameDefault", "ceval.c", 1)]),
            (0x611, vec![("_PyEval_EvalFrameDefault", "ceval.c", 2)]),
            (0x701, vec![("ffi_call", "ffi.c", 1)]),
            (
                0x801,
                vec![("inlined_helper", "app.c", 7), ("outer", "app.c", 70)],
            ),
        ]))
    }

    fn key(api: &str, native: &'static [u64]) -> TraceKey<'static> {
        TraceKey {
            api: Api::by_name(api).unwrap(),
            kind: MemoryKind::Device,
            native,
            python: &[],
        }
    }

    #[test]
    fn pytorch_cache_segments_are_the_native_allocator_s_only() {
        for (name, cache) in [
            ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)", true),
            ("c10::cuda::CUDACachingAllocator::Native::ExpandableSegment::map(c10::cuda::CUDACachingAllocator::Native::SegmentRange)", true),
            ("c10::cuda::CUDACachingAllocator::THCCachingAllocator::malloc(void**, int, unsigned long, CUstream_st*)", true),
            ("_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator6mallocEimP11CUstream_st", true),
            ("c10::cuda::CUDACachingAllocator::CudaMallocAsync::mallocAsync(void**, int, unsigned long, CUstream_st*)", false),
            ("_ZN3c104cuda20CUDACachingAllocator15CudaMallocAsync11mallocAsyncEPPvimP11CUstream_st", false),
            ("at::cuda::setWorkspaceForHandle()", false),
            ("cudaMalloc", false),
        ] {
            assert_eq!(is_pytorch_caching_allocator(name), cache, "{name}");
        }
    }

    #[test]
    fn groups_sorted_by_bytes_with_symbolized_frames() {
        let depot = Box::new(Depot::new());
        let a = depot.intern(&key("cudaMalloc", &[0x101, 0x301]), |_| {});
        let b = depot.intern(&key("cudaMalloc", &[0x201, 0x301]), |_| {});
        let snap = Snapshot {
            blocks: vec![
                (0x1000, Block::new(100, a, MemoryKind::Device, 1, Some(0), 0)),
                (0x2000, Block::new(100, a, MemoryKind::Device, 1, Some(0), 0)),
                (0x3000, Block::new(500, b, MemoryKind::Device, 1, Some(0), 0)),
            ],
            allocations: 5,
            frees: 2,
            peak_bytes: 900,
            ..Default::default()
        };
        let mut syms = symbols();
        let sup = Suppressions::default();
        let mut growth = GrowthTracker::default();
        let r = Assembler {
            depot: &depot,
            codes: &CodeTable::new(),
            symbols: &mut syms,
            suppressions: &sup,
            growth: &mut growth,
        }
        .assemble(&snap, meta(1));
        assert_eq!(r.totals.live_blocks, 3);
        assert_eq!(r.totals.live_bytes, 700);
        assert_eq!(r.totals.peak_bytes, 900);
        assert_eq!(r.leaks.len(), 2);
        assert_eq!(r.leaks[0].bytes, 500);
        assert_eq!(r.leaks[0].native_stack[0].function.as_deref(), Some("leak_b"));
        assert_eq!(r.leaks[0].native_stack[0].line, Some(20));
        assert_eq!(r.leaks[0].native_stack[0].address, "0x200");
        assert_eq!(r.leaks[1].blocks, 2);
        assert_eq!(r.leaks[1].examples.len(), 2);
        assert_eq!(r.totals.by_memory[&MemoryKind::Device].bytes, 700);
        // First dump: everything grew since process start.
        assert_eq!(r.growth.len(), 2);
        assert_eq!(r.growth[0].bytes_delta, Some(500));
    }

    #[test]
    fn static_runtime_frames_are_attributed_and_dropped() {
        let depot = Box::new(Depot::new());
        let t = depot.intern(&key("cuMemAlloc_v2", &[0x501, 0x401, 0x101, 0x301]), |_| {});
        let wrong = depot.intern(&key("cuMemAllocManaged", &[0x401, 0x101]), |_| {});
        let snap = Snapshot {
            blocks: vec![
                (0x1000, Block::new(64, t, MemoryKind::Device, 0, None, 0)),
                (0x2000, Block::new(32, wrong, MemoryKind::Device, 0, None, 0)),
            ],
            ..Default::default()
        };
        let mut syms = symbols();
        let r = Assembler {
            depot: &depot,
            codes: &CodeTable::new(),
            symbols: &mut syms,
            suppressions: &Suppressions::default(),
            growth: &mut GrowthTracker::default(),
        }
        .assemble(&snap, meta(1));
        assert_eq!(r.leaks[0].api, "cudaMalloc");
        assert_eq!(r.leaks[0].native_stack[0].function.as_deref(), Some("leak_a"));
        // cudaMalloc never calls cuMemAllocManaged: no attribution.
        assert_eq!(r.leaks[1].api, "cuMemAllocManaged");
        assert_eq!(r.leaks[1].native_stack.len(), 2);
    }

    #[test]
    fn inlined_frames_expand_in_place() {
        let depot = Box::new(Depot::new());
        let t = depot.intern(&key("cudaMalloc", &[0x801, 0x301]), |_| {});
        let snap = Snapshot {
            blocks: vec![(0x1000, Block::new(1, t, MemoryKind::Device, 0, None, 0))],
            ..Default::default()
        };
        let r = Assembler {
            depot: &depot,
            codes: &CodeTable::new(),
            symbols: &mut symbols(),
            suppressions: &Suppressions::default(),
            growth: &mut GrowthTracker::default(),
        }
        .assemble(&snap, meta(1));
        let names: Vec<_> = r.leaks[0]
            .native_stack
            .iter()
            .map(|f| f.function.clone().unwrap())
            .collect();
        assert_eq!(names, ["inlined_helper", "outer", "main"]);
    }

    #[test]
    fn python_frames_replace_eval_loop_frames() {
        let depot = Box::new(Depot::new());
        let codes = CodeTable::new();
        for (code, name, first) in [(1u64, "inner", 10), (2, "middle", 20), (3, "outer", 30)] {
            codes.insert(
                code,
                0,
                CodeInfo {
                    filename: "t.py".into(),
                    qualname: name.into(),
                    firstlineno: first,
                    format: LineFormat::Lnotab,
                    linetable: vec![],
                },
            );
        }
        // inner+middle ran in one eval invocation (middle entered from C),
        // outer in another.
        let py = [
            PyRawFrame {
                code: 1,
                guard: 0,
                offset: 0,
                flags: 0,
            },
            PyRawFrame {
                code: 2,
                guard: 0,
                offset: 0,
                flags: PY_FRAME_ENTRY,
            },
            PyRawFrame {
                code: 3,
                guard: 0,
                offset: 0,
                flags: PY_FRAME_ENTRY,
            },
        ];
        static NATIVE: [u64; 5] = [0x701, 0x601, 0x701, 0x601, 0x301];
        let t = depot.intern(
            &TraceKey {
                api: Api::cudaMalloc,
                kind: MemoryKind::Device,
                native: &NATIVE,
                python: &py,
            },
            |_| {},
        );
        let snap = Snapshot {
            blocks: vec![(0x1000, Block::new(1, t, MemoryKind::Device, 0, None, 0))],
            ..Default::default()
        };
        let r = Assembler {
            depot: &depot,
            codes: &codes,
            symbols: &mut symbols(),
            suppressions: &Suppressions::default(),
            growth: &mut GrowthTracker::default(),
        }
        .assemble(&snap, meta(1));
        let g = &r.leaks[0];
        assert_eq!(g.python_stack.len(), 3);
        assert_eq!(g.python_stack[0].function, "inner");
        assert_eq!(g.python_stack[0].line, Some(10));
        let merged: Vec<String> = g
            .merged_stack
            .iter()
            .map(|f| match f {
                MergedFrame::Native(n) => n.function.clone().unwrap(),
                MergedFrame::Python(p) => format!("py:{}", p.function),
            })
            .collect();
        assert_eq!(
            merged,
            [
                "ffi_call",
                "py:inner",
                "py:middle",
                "ffi_call",
                "py:outer",
                "main"
            ]
        );
    }

    /// CPython 3.13 reached one Python line through two call sites in
    /// the eval loop (specialized and generic): one group, both raw
    /// stacks kept, and blocks moving between them is not growth.
    #[test]
    fn one_python_line_is_one_group_whatever_the_eval_loop_call_site() {
        let depot = Box::new(Depot::new());
        let codes = CodeTable::new();
        codes.insert(
            1,
            0,
            CodeInfo {
                filename: "train.py".into(),
                qualname: "allocate".into(),
                firstlineno: 13,
                format: LineFormat::Lnotab,
                linetable: vec![],
            },
        );
        let py = [PyRawFrame {
            code: 1,
            guard: 0,
            offset: 0,
            flags: PY_FRAME_ENTRY,
        }];
        static SPECIALIZED: [u64; 3] = [0x701, 0x601, 0x301];
        static GENERIC: [u64; 3] = [0x701, 0x611, 0x301];
        let trace = |native: &'static [u64]| {
            depot.intern(
                &TraceKey {
                    api: Api::cudaMalloc,
                    kind: MemoryKind::Device,
                    native,
                    python: &py,
                },
                |_| {},
            )
        };
        let (a, b) = (trace(&SPECIALIZED), trace(&GENERIC));
        assert_ne!(a, b);
        let block = |t| Block::new(100, t, MemoryKind::Device, 0, None, 0);
        let mut growth = GrowthTracker::default();
        let mut dump = |blocks: Vec<(u64, Block)>, seq| {
            Assembler {
                depot: &depot,
                codes: &codes,
                symbols: &mut symbols(),
                suppressions: &Suppressions::default(),
                growth: &mut growth,
            }
            .assemble(
                &Snapshot {
                    blocks,
                    ..Default::default()
                },
                meta(seq),
            )
        };
        let r = dump(
            vec![(0x1000, block(a)), (0x2000, block(a)), (0x3000, block(b))],
            1,
        );
        assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
        let g = &r.leaks[0];
        assert_eq!((g.blocks, g.bytes), (3, 300));
        assert_eq!(g.raw_stacks.len(), 2);
        assert_eq!((g.raw_stacks[0].blocks, g.raw_stacks[1].blocks), (2, 1));
        assert_eq!(g.native_stack[1].line, Some(1), "the largest raw stack shows");
        assert_eq!(g.raw_stacks[1].native_stack[1].line, Some(2));
        assert_eq!(g.examples.len(), 3);
        // Same blocks, moved to the other call site: no growth.
        let r = dump(
            vec![(0x1000, block(b)), (0x2000, block(b)), (0x3000, block(a))],
            2,
        );
        assert_eq!(r.leaks.len(), 1);
        assert!(r.growth.is_empty(), "{:#?}", r.growth);
        assert_eq!(r.leaks[0].native_stack[1].line, Some(2));
    }

    #[test]
    fn suppressed_groups_leave_leaks_and_growth() {
        let depot = Box::new(Depot::new());
        let a = depot.intern(&key("cudaMalloc", &[0x101, 0x301]), |_| {});
        let b = depot.intern(&key("cudaMalloc", &[0x201, 0x301]), |_| {});
        let snap = Snapshot {
            blocks: vec![
                (0x1000, Block::new(10, a, MemoryKind::Device, 0, None, 0)),
                (0x2000, Block::new(20, b, MemoryKind::Device, 0, None, 0)),
            ],
            ..Default::default()
        };
        let sup = Suppressions::parse("leak:^leak_b$", "t").unwrap();
        let r = Assembler {
            depot: &depot,
            codes: &CodeTable::new(),
            symbols: &mut symbols(),
            suppressions: &sup,
            growth: &mut GrowthTracker::default(),
        }
        .assemble(&snap, meta(1));
        assert_eq!(r.leaks.len(), 1);
        assert_eq!(r.suppressed.len(), 1);
        assert_eq!(r.suppressed[0].suppression.as_deref(), Some("^leak_b$"));
        assert_eq!(r.growth.len(), 1);
        assert_eq!(r.suppressions_used[0].bytes, 20);
        // Totals still count every live block.
        assert_eq!(r.totals.live_bytes, 30);
    }

    #[test]
    fn growth_and_trends_over_dumps() {
        let mut g = GrowthTracker::<TraceId>::default();
        let (leak, cache, steady) = (TraceId(1), TraceId(2), TraceId(3));
        // Changes of (leak, cache, steady), in that order.
        let dump = |g: &mut GrowthTracker<TraceId>, l: u64, c: u64| {
            g.observe([(&leak, l, l * 10), (&cache, c, c * 10), (&steady, 1, 5)])
        };
        let d1 = dump(&mut g, 1, 4);
        assert_eq!(d1[0].bytes_delta, 10);
        assert_eq!(d1[2].bytes_delta, 5);
        assert_eq!(d1[0].trend, None);
        let d2 = dump(&mut g, 2, 8);
        assert_eq!(d2[2].bytes_delta, 0, "unchanged group is not growth");
        let d3 = dump(&mut g, 3, 8);
        assert_eq!(d3[0].trend, Some(Trend::Growing));
        assert_eq!(d3[1].trend, Some(Trend::Bounded));
        assert_eq!(d3[2].trend, Some(Trend::Bounded));
        assert_eq!(d3[1].bytes_delta, 0);
        let d4 = dump(&mut g, 4, 8);
        assert_eq!(d4[0].trend, Some(Trend::Growing));
        assert_eq!(d4[0].blocks_delta, 1);
        // A group absent from a dump starts over when it comes back.
        g.observe([(&leak, 4, 40)]);
        let d6 = g.observe([(&leak, 4, 40), (&cache, 8, 80)]);
        assert_eq!(d6[1].bytes_delta, 80);
    }

    /// The cap as the dump applied it before issue 15's bound, to a report
    /// already made: the `max` largest groups of each list kept, what
    /// `leaks` leaves out counted in `totals.groups_left_out`.
    fn cap_groups(r: &mut Report, max: usize) {
        if r.leaks.len() > max {
            let mut left = LeftOut::default();
            for g in r.leaks.drain(max..) {
                left.groups += 1;
                left.blocks = left.blocks.saturating_add(g.blocks);
                if !g.memory.is_address_space() {
                    left.bytes = left.bytes.saturating_add(g.bytes);
                }
            }
            r.totals.groups_left_out = Some(left);
        }
        r.suppressed.truncate(max);
        r.growth.truncate(max);
    }

    // ---- the bounded dump gives what the straightforward one gave ----

    /// The dump as it was made before issue 15's bound: every trace a full
    /// group first, merged by `GroupKey`, growth keyed by `GroupKey`, then
    /// sorted, suppressed and capped by `cap_groups`.
    #[allow(clippy::too_many_arguments)]
    fn straightforward(
        depot: &Depot,
        codes: &CodeTable,
        symbols: &mut dyn SymbolSource,
        suppressions: &Suppressions,
        growth: &mut GrowthTracker<GroupKey>,
        snap: &Snapshot,
        meta: DumpMeta,
        max: usize,
    ) -> Report {
        let mut by_trace: HashMap<TraceId, Acc> = HashMap::new();
        let mut by_memory: BTreeMap<MemoryKind, KindTotals> = BTreeMap::new();
        let mut live_bytes = 0u64;
        for &(addr, b) in &snap.blocks {
            let kind = depot.get(b.trace).map_or(MemoryKind::Device, |t| t.kind);
            if kind.counts_in_live_bytes() {
                live_bytes += b.size();
            }
            let k = by_memory.entry(kind).or_default();
            k.blocks += 1;
            k.bytes += b.size();
            let acc = by_trace.entry(b.trace).or_insert(Acc {
                blocks: 0,
                bytes: 0,
                examples: Vec::new(),
            });
            acc.blocks += 1;
            acc.bytes += b.size();
            if acc.examples.len() < EXAMPLES_PER_GROUP {
                acc.examples.push(BlockExample {
                    address: hex(addr),
                    size: b.size(),
                    device: b.device(),
                });
            }
        }
        let mut ids: Vec<TraceId> = by_trace.keys().copied().collect();
        ids.sort();
        let mut groups: Vec<Group> = Vec::new();
        let mut index: HashMap<GroupKey, usize> = HashMap::new();
        for id in ids {
            let acc = by_trace.remove(&id).unwrap();
            let g = match depot.get(id) {
                Some(t) => {
                    let mut native = Vec::new();
                    for &ra in t.native {
                        native.extend(symbols.symbolize(ra));
                    }
                    let python = t.python.iter().map(|f| codes.resolve(f)).collect();
                    build_group(&t, acc, native, python)
                }
                None => unknown_group(acc),
            };
            match index.entry(GroupKey::of(&g)) {
                Entry::Occupied(e) => add_raw_stack(&mut groups[*e.get()], g),
                Entry::Vacant(e) => {
                    e.insert(groups.len());
                    groups.push(g);
                }
            }
        }
        let mut keys: Vec<(&GroupKey, usize)> = index.iter().map(|(k, &i)| (k, i)).collect();
        keys.sort_unstable_by_key(|&(_, i)| i);
        let changes = growth.observe(keys.iter().map(|&(k, i)| (k, groups[i].blocks, groups[i].bytes)));
        let mut suppress = suppressions.matcher();
        let mut leaks = Vec::new();
        let mut grown = Vec::new();
        for (mut g, c) in groups.into_iter().zip(changes) {
            g.trend = c.trend;
            if c.bytes_delta > 0 && suppress.match_group(&g).is_none() {
                let mut gg = g.clone();
                gg.blocks_delta = Some(c.blocks_delta);
                gg.bytes_delta = Some(c.bytes_delta);
                grown.push(gg);
            }
            leaks.push(g);
        }
        let order = |a: &Group, b: &Group| {
            b.bytes
                .cmp(&a.bytes)
                .then(b.blocks.cmp(&a.blocks))
                .then_with(|| a.api.cmp(&b.api))
                .then_with(|| {
                    crate::report::render::top_frame_label(a).cmp(&crate::report::render::top_frame_label(b))
                })
        };
        leaks.sort_by(order);
        grown.sort_by(|a, b| b.bytes_delta.cmp(&a.bytes_delta).then_with(|| order(a, b)));
        let mut suppressed = Vec::new();
        let suppressions_used = suppress.apply(&mut leaks, &mut suppressed);
        let mut r = Report {
            format: FORMAT.into(),
            version: VERSION,
            trigger: meta.trigger,
            sequence: meta.sequence,
            pid: meta.pid,
            ppid: meta.ppid,
            command: meta.command,
            hostname: meta.hostname,
            rank: meta.rank,
            instance: meta.instance,
            timestamp_ms: meta.timestamp_ms,
            totals: Totals {
                live_blocks: snap.blocks.len() as u64,
                live_bytes,
                peak_bytes: snap.peak_bytes.max(live_bytes),
                allocations: snap.allocations,
                frees: snap.frees,
                failed_allocations: snap.failed_allocations,
                invalid_frees: snap.invalid_frees,
                by_memory,
                stacks_dropped: depot.dropped(),
                groups_left_out: None,
            },
            leaks,
            growth: grown,
            suppressed,
            reason: meta.reason,
            exit_status: meta.exit_status,
            signal: meta.signal,
            suppressions_used,
            python: meta.python,
            incomplete_shards: snap.incomplete_shards,
            merged_from: vec![],
            run_id: None,
            timeline: None,
            oom: None,
            peak: None,
            oom_events: Vec::new(),
            allocation_trace: None,
        };
        cap_groups(&mut r, max);
        r
    }

    /// Symbols for a made-up program: application functions (two addresses
    /// with the same symbols), an inlined pair, an address without symbols,
    /// the interpreter's eval loop at two call sites, call machinery, a
    /// static runtime entry point, a frame without a module.
    fn program_symbols() -> FakeSymbols {
        let mut m: HashMap<u64, Vec<(&'static str, &'static str, i64)>> = HashMap::from([
            (0x2001, vec![("helper", "app.c", 7), ("outer", "app.c", 70)]),
            (0x4001, vec![("_PyEval_EvalFrameDefault", "ceval.c", 1)]),
            (0x4011, vec![("_PyEval_EvalFrameDefault", "ceval.c", 2)]),
            (0x5001, vec![("ffi_call", "ffi.c", 1)]),
            (0x6001, vec![("cudaMalloc", "cudart.c", 5)]),
            (0x7001, vec![("PyObject_Vectorcall", "call.c", 3)]),
        ]);
        const NAMES: [&str; 10] = ["f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9"];
        for (i, name) in NAMES.iter().enumerate() {
            let line = 10 * i as i64;
            m.insert(0x1001 + 0x10 * i as u64, vec![(name, "app.c", line)]);
        }
        // Another call of f0 with the same line: one group with 0x1001.
        m.insert(0x1101, vec![("f0", "app.c", 0)]);
        FakeSymbols(m)
    }

    /// Modules as the real symbolizer gives them: what call machinery and
    /// suppressions look at.
    struct ProgramSymbols(FakeSymbols);

    impl SymbolSource for ProgramSymbols {
        fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
            let module = match ra {
                0x4001 | 0x4011 | 0x7001 => Some("/usr/lib/libpython3.12.so.1.0"),
                0x5001 => Some("/usr/lib/libffi.so.8"),
                0x6001 => Some("/usr/lib/libtorch.so"),
                0x1091 => None,
                _ => Some("/bin/app"),
            };
            let mut frames = self.0.symbolize(ra);
            for f in &mut frames {
                if f.function.is_some() {
                    f.module = module.map(String::from);
                }
            }
            frames
        }
    }

    /// Counts the calls per address.
    struct Counting<S>(S, HashMap<u64, u32>);

    impl<S: SymbolSource> SymbolSource for Counting<S> {
        fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
            *self.1.entry(ra).or_default() += 1;
            self.0.symbolize(ra)
        }
    }

    struct Program {
        depot: Box<Depot>,
        codes: CodeTable,
        traces: Vec<(TraceId, MemoryKind)>,
    }

    /// About 400 traces made at random (fixed seed) from the symbols above
    /// and five Python code objects (one unknown to the code table).
    fn program() -> Program {
        let depot = Box::new(Depot::new());
        let codes = CodeTable::new();
        for (code, file, name) in [
            (1u64, "train_a.py", "step"),
            (2, "train_a.py", "forward"),
            (3, "train_b.py", "main"),
            (4, "train_b.py", "<module>"),
        ] {
            codes.insert(
                code,
                0,
                CodeInfo {
                    filename: file.into(),
                    qualname: name.into(),
                    firstlineno: 10 * code as i32,
                    format: LineFormat::Lnotab,
                    linetable: vec![6, 2, 6, 3],
                },
            );
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let apis = [
            Api::cudaMalloc,
            Api::by_name("cuMemAlloc_v2").unwrap(),
            Api::by_name("cuMemAllocManaged").unwrap(),
            Api::by_name("cuMemAddressReserve").unwrap(),
        ];
        let kinds = [
            MemoryKind::Device,
            MemoryKind::Device,
            MemoryKind::Managed,
            MemoryKind::Reservation,
        ];
        let addresses = [
            0x1001, 0x1011, 0x1021, 0x1031, 0x1041, 0x1051, 0x1061, 0x1071, 0x1081, 0x1091, 0x1101, 0x2001,
            0x3001, 0x5001, 0x7001,
        ];
        let mut traces = Vec::new();
        for _ in 0..600 {
            let a = next(apis.len() as u64) as usize;
            let mut native: Vec<u64> = Vec::new();
            if a == 1 && next(2) == 0 {
                native.push(0x6001);
            }
            let depth = 1 + next(4);
            for _ in 0..depth {
                native.push(addresses[next(addresses.len() as u64) as usize]);
            }
            let mut python = Vec::new();
            if next(3) == 0 {
                for level in 0..1 + next(3) {
                    if next(2) == 0 {
                        native.push(0x5001);
                    }
                    native.push([0x4001, 0x4011][next(2) as usize]);
                    if level == 0 && next(2) == 0 {
                        native.push(0x7001);
                    }
                    python.push(PyRawFrame {
                        code: [1, 2, 3, 4, 9][next(5) as usize],
                        guard: 0,
                        offset: [0, 6, 12][next(3) as usize] as u32,
                        flags: PY_FRAME_ENTRY,
                    });
                }
                if next(4) == 0 {
                    // One more Python frame than eval-loop frames.
                    python.push(PyRawFrame {
                        code: 4,
                        guard: 0,
                        offset: 0,
                        flags: 0,
                    });
                }
            }
            native.push(0x1001);
            let id = depot.intern(
                &TraceKey {
                    api: apis[a],
                    kind: kinds[a],
                    native: &native,
                    python: &python,
                },
                |_| {},
            );
            if !traces.iter().any(|&(t, _)| t == id) {
                traces.push((id, kinds[a]));
            }
        }
        // Blocks whose stack was not stored.
        traces.push((TraceId(0), MemoryKind::Device));
        Program { depot, codes, traces }
    }

    /// Live blocks of dump `dump`: trace i has a number of blocks that
    /// grows, stays, or comes and goes with the dump, of 1, 2 or 4 bytes
    /// (many ties for the sort's later keys).
    fn snapshot(p: &Program, dump: u64) -> Snapshot {
        let mut blocks = Vec::new();
        let mut address = 0x10_0000u64;
        for (i, &(id, kind)) in p.traces.iter().enumerate() {
            let i = i as u64;
            let n = match i % 4 {
                0 => 1 + dump,
                1 => 2,
                2 => (i + dump) % 3,
                _ => 1 + (dump % 2) * (i % 5),
            };
            for _ in 0..n {
                address += 0x100;
                blocks.push((address, Block::new(1 << (i % 3), id, kind, 0, Some(0), 0)));
            }
        }
        Snapshot {
            blocks,
            allocations: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn bounded_assembly_gives_the_reports_of_the_straightforward_one() {
        let p = program();
        let rules = "leak:^f3$\nleak:libffi\nleak:train_b.py\nleak:^f3$\nleak:outer\n";
        for supp in [Suppressions::default(), Suppressions::parse(rules, "t").unwrap()] {
            for max in [usize::MAX, 0, 1, 7, 40] {
                let mut new_growth = GrowthTracker::default();
                let mut old_growth = GrowthTracker::<GroupKey>::default();
                for dump in 0..5 {
                    let snap = snapshot(&p, dump);
                    let new = Assembler {
                        depot: &p.depot,
                        codes: &p.codes,
                        symbols: &mut ProgramSymbols(program_symbols()),
                        suppressions: &supp,
                        growth: &mut new_growth,
                    }
                    .assemble_at_most(&snap, meta(dump), max);
                    let old = straightforward(
                        &p.depot,
                        &p.codes,
                        &mut ProgramSymbols(program_symbols()),
                        &supp,
                        &mut old_growth,
                        &snap,
                        meta(dump),
                        max,
                    );
                    assert_eq!(new, old, "max {max}, dump {dump}, {} rules", supp.rules.len());
                    if max == usize::MAX && dump == 3 {
                        // The test sees what it claims to see.
                        assert!(new.leaks.len() > 100, "{}", new.leaks.len());
                        assert!(new.leaks.iter().filter(|g| g.raw_stacks.len() > 1).count() >= 5);
                        assert!(new.leaks.iter().any(|g| g.api == "cudaMalloc"
                            && g.native_stack[0].function.as_deref() != Some("cudaMalloc")));
                        assert!(new.leaks.iter().any(|g| g.trend == Some(Trend::Growing)));
                        assert!(new.leaks.iter().any(|g| g.trend == Some(Trend::Bounded)));
                        assert!(new.leaks.iter().any(|g| g.api == "unknown"));
                        assert!(new.growth.len() > 10);
                        if !supp.is_empty() {
                            assert!(new.suppressed.len() > 10);
                            assert_eq!(new.suppressions_used.len(), 4, "{:#?}", new.suppressions_used);
                        }
                    }
                    if max == 7 {
                        let left = new.totals.groups_left_out.expect("more than 7 groups");
                        assert!(left.bytes < left.blocks * 4, "reserved bytes are not counted");
                    }
                }
            }
        }
    }

    /// Each return address is symbolized once per dump, whatever the
    /// number of traces through it (they were symbolized once per trace).
    #[test]
    fn each_address_is_symbolized_once_per_dump() {
        let p = program();
        let mut growth = GrowthTracker::default();
        for dump in 0..2 {
            let mut symbols = Counting(ProgramSymbols(program_symbols()), HashMap::new());
            let r = Assembler {
                depot: &p.depot,
                codes: &p.codes,
                symbols: &mut symbols,
                suppressions: &Suppressions::default(),
                growth: &mut growth,
            }
            .assemble_at_most(&snapshot(&p, dump), meta(dump), 3);
            assert_eq!(r.leaks.len(), 3);
            assert!(symbols.1.len() > 10);
            assert!(symbols.1.values().all(|&n| n == 1), "{:?}", symbols.1);
        }
    }
}
