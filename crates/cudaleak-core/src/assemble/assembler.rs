//! The assembler: a snapshot and the depot become a report.

use super::grouping::{
    add_raw_stack, build_group, group_order, label_ranks, unknown_group, Acc, FactsMemo, FrameDigests,
    GroupSummary, Label, NameVerdicts, TraceCount, TraceFacts, UNKNOWN_API,
};
use super::growth::GrowthTracker;
use super::merge::{attribute_runtime_by, is_eval_loop, merged_order, runtime_entry, MergedRef};
use super::{DumpMeta, Snapshot, EXAMPLES_PER_GROUP};
use crate::base::hash::AddrHash;
use crate::record::depot::Depot;
use crate::record::python::CodeTable;
use crate::record::{MemoryKind, TraceId};
use crate::report::group_key::{is_call_machinery_named, KeyDigest};
use crate::report::suppress::Suppressions;
use crate::report::{
    BlockExample, Group, KindTotals, LeftOut, NativeFrame, Peak, Report, SuppressionUse, Totals, FORMAT,
    VERSION,
};
use crate::symbolize::frame_table::{FrameTable, NativeId, PythonId};
use crate::symbolize::{hex, SymbolSource};
use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

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
    ///
    /// `memo` carries the facts from one call to the next over the same
    /// `table`: the peak's groups are mostly the leaks' traces
    /// again, and symbolizing and digesting a million of them twice was a
    /// fifth of a 1M-stack exit report. `Remember` fills it (in
    /// trace order); `Reuse` takes a trace's facts from it when there, if
    /// `verdicts` has no rules (the peak's have none).
    fn summarize(
        &mut self,
        table: &mut FrameTable,
        verdicts: &mut NameVerdicts,
        traces: &mut [TraceCount],
        memo: &mut FactsMemo,
    ) -> Vec<GroupSummary> {
        let mut groups: Vec<GroupSummary> = Vec::new();
        // The digests are hashes already: one mix, not SipHash over 16
        // bytes, per trace.
        let mut index: HashMap<KeyDigest, u32, AddrHash> =
            HashMap::with_capacity_and_hasher(traces.len(), AddrHash);
        let (mut native, mut python) = (Vec::new(), Vec::new());
        let mut digests = FrameDigests::default();
        let mut known = 0;
        for t in traces.iter_mut() {
            let reused = match memo {
                FactsMemo::Reuse(kept) => {
                    while known < kept.len() && kept[known].0 < t.id {
                        known += 1;
                    }
                    kept.get(known)
                        .filter(|k| k.0 == t.id && !verdicts.has_rules())
                        .map(|&(_, f)| TraceFacts { verdict: None, ..f })
                }
                _ => None,
            };
            let f = match reused {
                Some(f) => f,
                None => self.facts(table, verdicts, &mut digests, &mut native, &mut python, t.id),
            };
            if let FactsMemo::Remember(kept) = memo {
                kept.push((t.id, f));
            }
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
        memo: &mut FactsMemo,
    ) -> (Vec<Group>, Option<LeftOut>) {
        traces.sort_unstable_by_key(|t| t.id);
        let no_rules = Suppressions::none();
        let mut verdicts = NameVerdicts::new(&no_rules);
        let groups = self.summarize(table, &mut verdicts, &mut traces, memo);
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
        for &(addr, b) in snap.blocks.iter().chain(&snap.torn_down) {
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
            let (mut torn_down_blocks, mut torn_down_bytes) = (0u64, 0u64);
            for t in traces {
                torn_down_blocks += t.torn_down_blocks;
                torn_down_bytes = torn_down_bytes.saturating_add(t.torn_down_bytes);
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
            if let Some(mut g) = group {
                g.torn_down_blocks = torn_down_blocks;
                g.torn_down_bytes = torn_down_bytes;
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
    /// made.
    pub fn assemble_at_most(&mut self, snap: &Snapshot, meta: DumpMeta, max_groups: usize) -> Report {
        // By call site, hashed by one mix of the id (SipHash here was a
        // tenth of a 1M-stack exit report; docs/decisions.md, "Hash maps
        // keyed by one multiply-mix, not SipHash").
        // (blocks, bytes, of them torn down: blocks, bytes)
        let mut per_trace: HashMap<TraceId, [u64; 4], AddrHash> = HashMap::default();
        let mut by_memory: BTreeMap<MemoryKind, KindTotals> = BTreeMap::new();
        let mut live_bytes = 0u64;
        let (mut torn_down_blocks, mut torn_down_bytes) = (0u64, 0u64);
        for &(_, b) in &snap.blocks {
            let counts = per_trace.entry(b.trace).or_default();
            counts[0] += 1;
            counts[1] = counts[1].saturating_add(b.size());
            let kind = self.depot.get(b.trace).map_or(MemoryKind::Device, |t| t.kind);
            if kind.counts_in_live_bytes() {
                live_bytes = live_bytes.saturating_add(b.size());
            }
            let k = by_memory.entry(kind).or_default();
            k.blocks += 1;
            k.bytes = k.bytes.saturating_add(b.size());
        }
        // Leaks the device no longer holds: in their groups, apart in the
        // totals.
        for &(_, b) in &snap.torn_down {
            let counts = per_trace.entry(b.trace).or_default();
            counts[0] += 1;
            counts[1] = counts[1].saturating_add(b.size());
            counts[2] += 1;
            counts[3] = counts[3].saturating_add(b.size());
            let kind = self.depot.get(b.trace).map_or(MemoryKind::Device, |t| t.kind);
            // A module that went with its context is no leak either.
            if kind.is_leak() {
                torn_down_blocks += 1;
            }
            if kind.counts_in_live_bytes() {
                torn_down_bytes = torn_down_bytes.saturating_add(b.size());
            }
        }
        let mut traces: Vec<TraceCount> = per_trace
            .into_iter()
            .map(|(id, [blocks, bytes, torn_blocks, torn_bytes])| TraceCount {
                id,
                group: 0,
                blocks,
                bytes,
                torn_down_blocks: torn_blocks,
                torn_down_bytes: torn_bytes,
            })
            .collect();
        traces.sort_unstable_by_key(|t| t.id);

        // One group per merged stack (`group_key.rs`), not per raw trace:
        // traces are symbolized first, then merged by key, in trace order.
        let mut table = FrameTable::new();
        let mut verdicts = NameVerdicts::new(self.suppressions);
        let mut memo = if snap.peak.is_some() {
            FactsMemo::Remember(Vec::with_capacity(traces.len()))
        } else {
            FactsMemo::Off
        };
        let groups = self.summarize(&mut table, &mut verdicts, &mut traces, &mut memo);
        if let FactsMemo::Remember(kept) = memo {
            memo = FactsMemo::Reuse(kept);
        }
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
        // Loaded modules, which are no leaks, after every leak: the cap
        // below cuts them first.
        leak_order.sort_by_key(|&i| !groups[i as usize].kind.is_leak());

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
        // is counted (100,000 leaked groups made a 1 GB report).
        let mut groups_left_out = None;
        if leak_order.len() > max_groups {
            let mut left = LeftOut::default();
            for &i in &leak_order[max_groups..] {
                let g = &groups[i as usize];
                if !g.kind.is_leak() {
                    continue;
                }
                left.groups += 1;
                left.blocks = left.blocks.saturating_add(g.blocks);
                if !g.kind.shared_kind().is_address_space() {
                    left.bytes = left.bytes.saturating_add(g.bytes);
                }
            }
            groups_left_out = (left.groups > 0).then_some(left);
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
                    .map(|t| TraceCount {
                        group: 0,
                        blocks: t.blocks - t.torn_down_blocks,
                        bytes: t.bytes.saturating_sub(t.torn_down_bytes),
                        torn_down_blocks: 0,
                        torn_down_bytes: 0,
                        ..*t
                    })
                    .filter(|t| t.blocks > 0)
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
                        torn_down_blocks: 0,
                        torn_down_bytes: 0,
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
            let (groups, groups_left_out) = self.plain_groups(&mut table, counts, max_groups, &mut memo);
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
                stacks_skipped_nested: snap.stacks_skipped_nested,
                groups_left_out,
                torn_down_blocks,
                torn_down_bytes,
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
