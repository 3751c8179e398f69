//! From a snapshot of live blocks to a [`Report`]: grouping by trace,
//! symbolization, Python frames and the merged stack, runtime attribution,
//! suppressions, growth since the previous dump and trend flags.
//!
//! Everything here is independent of the process it runs in: the preload
//! crate feeds real snapshots, the unit tests feed fake ones.

use crate::depot::{Depot, TraceRef};
use crate::group_key::GroupKey;
use crate::python::{eval_groups, CodeTable, PyRawFrame};
use crate::record::{Block, MemoryKind, TraceId};
use crate::report::{
    BlockExample, Group, KindTotals, MergedFrame, NativeFrame, RawStack, Report, Totals, Trend, Trigger,
    FORMAT, VERSION,
};
use crate::suppress::Suppressions;
use crate::symbolize::{hex, SymbolSource};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

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
}

/// Per-group history across the dumps of one process, by the key that
/// groups a dump ([`GroupKey`]): a group cannot "grow" by moving between
/// two interpreter call sites.
pub struct GrowthTracker<K = GroupKey> {
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
    /// once per dump and cloned only the first time it is seen: keys are
    /// whole symbolized stacks.
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
];

/// Groups frames by physical frame (one address, possibly several inlined
/// functions).
fn physical_frames(frames: &[NativeFrame]) -> Vec<&[NativeFrame]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=frames.len() {
        if i == frames.len() || frames[i].address != frames[start].address {
            out.push(&frames[start..i]);
            start = i;
        }
    }
    out
}

/// If the stack passes through a runtime entry point that makes `api`,
/// returns that entry point and drops it and everything inside it.
fn attribute_runtime(api: &str, native: &mut Vec<NativeFrame>) -> Option<&'static str> {
    let phys = physical_frames(native);
    // Only the innermost few physical frames: the runtime is directly below.
    for (depth, pf) in phys.iter().enumerate().take(8) {
        for f in pf.iter() {
            let Some(func) = f.function.as_deref() else {
                continue;
            };
            if let Some((rt, _)) = RUNTIME_ATTRIBUTION
                .iter()
                .find(|(rt, drivers)| *rt == func && drivers.contains(&api))
            {
                let drop: usize = phys[..=depth].iter().map(|p| p.len()).sum();
                native.drain(..drop);
                return Some(rt);
            }
        }
    }
    None
}

/// Puts Python frames in the place of the interpreter's eval-loop frames:
/// the k-th `_PyEval_EvalFrameDefault` physical frame (innermost first)
/// becomes the k-th group of Python frames (see [`eval_groups`]). Python
/// groups left over (native unwinding stopped early) go at the end.
pub fn merge_stacks(
    native: &[NativeFrame],
    python_raw: &[PyRawFrame],
    python: &[crate::python::PythonFrame],
) -> Vec<MergedFrame> {
    let groups = eval_groups(python_raw);
    let mut next_group = 0;
    let mut out = Vec::with_capacity(native.len() + python.len());
    for pf in physical_frames(native) {
        let is_eval = pf.iter().any(|f| {
            f.function
                .as_deref()
                .is_some_and(|n| n == "_PyEval_EvalFrameDefault" || n == "PyEval_EvalFrameEx")
        });
        if is_eval && next_group < groups.len() {
            for i in groups[next_group].clone() {
                out.push(MergedFrame::Python(python[i].clone()));
            }
            next_group += 1;
        } else {
            out.extend(pf.iter().cloned().map(MergedFrame::Native));
        }
    }
    for g in &groups[next_group..] {
        for i in g.clone() {
            out.push(MergedFrame::Python(python[i].clone()));
        }
    }
    out
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
    let room = EXAMPLES_PER_GROUP.saturating_sub(m.examples.len());
    m.examples.extend(g.examples.into_iter().take(room));
}

struct Acc {
    blocks: u64,
    bytes: u64,
    examples: Vec<BlockExample>,
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
    fn group_for(&mut self, t: TraceRef, acc: Acc) -> Group {
        let mut native: Vec<NativeFrame> = Vec::with_capacity(t.native.len());
        for &ra in t.native {
            native.extend(self.symbols.symbolize(ra));
        }
        let mut api = t.api.name();
        if !t.api.is_runtime() {
            if let Some(rt) = attribute_runtime(api, &mut native) {
                api = rt;
            }
        }
        let python: Vec<_> = t.python.iter().map(|f| self.codes.resolve(f)).collect();
        let merged_stack = if python.is_empty() {
            Vec::new()
        } else {
            merge_stacks(&native, t.python, &python)
        };
        Group {
            merged_stack,
            examples: acc.examples,
            ..Group::new(acc.blocks, acc.bytes, api, t.kind, native, python)
        }
    }

    /// The call site of trace `id` as a group with no blocks or bytes,
    /// symbolized as in the report (the sampled timeline names its sites
    /// with it).
    pub fn site_group(&mut self, id: TraceId) -> Option<Group> {
        let t = self.depot.get(id)?;
        Some(self.group_for(
            t,
            Acc {
                blocks: 0,
                bytes: 0,
                examples: Vec::new(),
            },
        ))
    }

    pub fn assemble(&mut self, snap: &Snapshot, meta: DumpMeta) -> Report {
        let mut by_trace: HashMap<TraceId, Acc> = HashMap::new();
        let mut by_memory: BTreeMap<MemoryKind, KindTotals> = BTreeMap::new();
        let mut live_bytes = 0u64;
        for &(addr, b) in &snap.blocks {
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
            let kind = self.depot.get(b.trace).map_or(MemoryKind::Device, |t| t.kind);
            if kind.counts_in_live_bytes() {
                live_bytes += b.size();
            }
            let k = by_memory.entry(kind).or_default();
            k.blocks += 1;
            k.bytes += b.size();
        }
        // One group per merged stack (`group_key.rs`), not per raw trace:
        // traces are symbolized first, then merged by key, in trace order.
        let mut ids: Vec<TraceId> = by_trace.keys().copied().collect();
        ids.sort();
        let mut groups: Vec<Group> = Vec::with_capacity(ids.len());
        let mut index: HashMap<GroupKey, usize> = HashMap::with_capacity(ids.len());
        for id in ids {
            let acc = by_trace.remove(&id).expect("key from this map");
            let g = match self.depot.get(id) {
                Some(t) => self.group_for(t, acc),
                None => Group {
                    examples: acc.examples,
                    ..Group::new(
                        acc.blocks,
                        acc.bytes,
                        "unknown",
                        MemoryKind::Device,
                        vec![],
                        vec![],
                    )
                },
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
        let changes = self
            .growth
            .observe(keys.iter().map(|&(k, i)| (k, groups[i].blocks, groups[i].bytes)));
        let mut leaks = Vec::with_capacity(groups.len());
        for (mut g, change) in groups.into_iter().zip(changes) {
            g.trend = change.trend;
            leaks.push((g, Some(change)));
        }
        let mut growth = Vec::new();
        let mut kept = Vec::new();
        let mut suppress = self.suppressions.matcher();
        for (g, change) in leaks {
            if let Some(c) = change.filter(|c| c.bytes_delta > 0) {
                if suppress.match_group(&g).is_none() {
                    let mut gg = g.clone();
                    gg.blocks_delta = Some(c.blocks_delta);
                    gg.bytes_delta = Some(c.bytes_delta);
                    growth.push(gg);
                }
            }
            kept.push(g);
        }
        let mut leaks = kept;
        let order = |a: &Group, b: &Group| {
            b.bytes
                .cmp(&a.bytes)
                .then(b.blocks.cmp(&a.blocks))
                .then_with(|| a.api.cmp(&b.api))
                .then_with(|| crate::render::top_frame_label(a).cmp(&crate::render::top_frame_label(b)))
        };
        leaks.sort_by(order);
        growth.sort_by(|a, b| b.bytes_delta.cmp(&a.bytes_delta).then_with(|| order(a, b)));
        let mut suppressed = Vec::new();
        let suppressions_used = suppress.apply(&mut leaks, &mut suppressed);

        let live_blocks = snap.blocks.len() as u64;
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
                peak_bytes: snap.peak_bytes.max(live_bytes),
                allocations: snap.allocations,
                frees: snap.frees,
                failed_allocations: snap.failed_allocations,
                invalid_frees: snap.invalid_frees,
                by_memory,
                stacks_dropped: self.depot.dropped(),
                groups_left_out: None,
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
        }
    }
}

/// Keeps the `max` largest groups of each list (`leaks`, `suppressed`,
/// `growth`; each list is sorted largest first) for writing; what `leaks`
/// leaves out is counted in `totals.groups_left_out` (issue 15: 100,000
/// leaked groups made a 1 GB report that took 13 s and 2.4 GB to write,
/// and the CLI 29 s and 6.9 GB to read).
pub fn cap_groups(r: &mut Report, max: usize) {
    if r.leaks.len() > max {
        let mut left = crate::report::LeftOut::default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::depot::TraceKey;
    use crate::linetable::LineFormat;
    use crate::python::{CodeInfo, PY_FRAME_ENTRY};
    use crate::record::Api;

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
}
