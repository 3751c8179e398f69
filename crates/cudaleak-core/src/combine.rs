//! Working across reports: the same group in different processes, merged
//! views, growth between two reports, and per-rank views of a distributed
//! run. Groups are matched by symbolized frames, never by addresses, which
//! differ between processes (ASLR) and runs.

use crate::report::{Group, KindTotals, Report, SuppressionUse, Totals, Trigger, FORMAT, VERSION};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// Matching groups across reports uses the same key as a dump's own
/// grouping and its growth (`group_key.rs`).
pub use crate::report::group_key::GroupKey;

/// One identity for the process that wrote a report.
pub fn process_id(r: &Report) -> (String, i64, String) {
    (
        r.hostname.clone().unwrap_or_default(),
        r.pid,
        r.instance.clone().unwrap_or_default(),
    )
}

/// Keeps the newest dump (highest sequence) of every process: summing
/// several dumps of one process would count its blocks more than once.
pub fn latest_per_process(reports: Vec<(PathBuf, Report)>) -> Vec<(PathBuf, Report)> {
    let mut best: HashMap<(String, i64, String), (PathBuf, Report)> = HashMap::new();
    for (p, r) in reports {
        let id = process_id(&r);
        match best.get(&id) {
            Some((_, old)) if old.sequence >= r.sequence => {}
            _ => {
                best.insert(id, (p, r));
            }
        }
    }
    let mut out: Vec<_> = best.into_values().collect();
    out.sort_by(|a, b| (a.1.rank, a.1.pid, &a.0).cmp(&(b.1.rank, b.1.pid, &b.0)));
    out
}

fn merge_groups(lists: impl Iterator<Item = Group>) -> Vec<Group> {
    let mut order: Vec<GroupKey> = Vec::new();
    let mut merged: HashMap<GroupKey, Group> = HashMap::new();
    for g in lists {
        let key = GroupKey::of(&g);
        match merged.get_mut(&key) {
            Some(m) => {
                m.blocks = m.blocks.saturating_add(g.blocks);
                m.bytes = m.bytes.saturating_add(g.bytes);
                m.torn_down_blocks = m.torn_down_blocks.saturating_add(g.torn_down_blocks);
                m.torn_down_bytes = m.torn_down_bytes.saturating_add(g.torn_down_bytes);
                if let (Some(a), Some(b)) = (m.blocks_delta.as_mut(), g.blocks_delta) {
                    *a = a.saturating_add(b);
                }
                if let (Some(a), Some(b)) = (m.bytes_delta.as_mut(), g.bytes_delta) {
                    *a = a.saturating_add(b);
                }
                for e in g.examples {
                    if m.examples.len() < crate::assemble::EXAMPLES_PER_GROUP {
                        m.examples.push(e);
                    }
                }
                if m.trend != g.trend {
                    // Different processes disagree: growing wins, it is the
                    // one to look at.
                    m.trend = m.trend.max_by_growth(g.trend);
                }
            }
            None => {
                order.push(key.clone());
                merged.insert(key, g);
            }
        }
    }
    let mut out: Vec<Group> = order.into_iter().filter_map(|k| merged.remove(&k)).collect();
    sort_groups(&mut out);
    out
}

trait TrendMax {
    fn max_by_growth(self, other: Self) -> Self;
}

impl TrendMax for Option<crate::report::Trend> {
    fn max_by_growth(self, other: Self) -> Self {
        use crate::report::Trend::*;
        match (self, other) {
            (Some(Growing), _) | (_, Some(Growing)) => Some(Growing),
            (Some(Bounded), _) | (_, Some(Bounded)) => Some(Bounded),
            (Some(Steady), _) | (_, Some(Steady)) => Some(Steady),
            _ => None,
        }
    }
}

pub fn sort_groups(groups: &mut [Group]) {
    groups.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.blocks.cmp(&a.blocks))
            .then_with(|| a.api.cmp(&b.api))
            .then_with(|| {
                crate::report::render::top_frame_label(a).cmp(&crate::report::render::top_frame_label(b))
            })
    });
}

/// Sums saturate at `u64::MAX` (two groups of `u64::MAX` bytes
/// wrapped to 18446744073709551614).
fn add(a: &mut u64, b: u64) {
    *a = a.saturating_add(b);
}

fn add_totals(a: &mut Totals, b: &Totals) {
    add(&mut a.live_blocks, b.live_blocks);
    add(&mut a.live_bytes, b.live_bytes);
    add(&mut a.peak_bytes, b.peak_bytes);
    add(&mut a.allocations, b.allocations);
    add(&mut a.frees, b.frees);
    add(&mut a.failed_allocations, b.failed_allocations);
    add(&mut a.invalid_frees, b.invalid_frees);
    add(&mut a.stacks_dropped, b.stacks_dropped);
    add(&mut a.stacks_skipped_nested, b.stacks_skipped_nested);
    add(&mut a.torn_down_blocks, b.torn_down_blocks);
    add(&mut a.torn_down_bytes, b.torn_down_bytes);
    for (k, v) in &b.by_memory {
        let e: &mut KindTotals = a.by_memory.entry(*k).or_default();
        add(&mut e.blocks, v.blocks);
        add(&mut e.bytes, v.bytes);
    }
}

/// `new - old` for two counters, clamped to the range of i64 (an `as i64`
/// cast made `diff` print -3005 for a growth to `u64::MAX`).
pub fn delta(new: u64, old: u64) -> i64 {
    (new as i128 - old as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// One report over several (one per process; see [`latest_per_process`]).
/// It validates against the schema: `pid` and `command` are the first
/// report's, `merged_from` lists the sources, totals are sums (`peak_bytes`
/// the sum of peaks, an upper bound).
pub fn merge(reports: &[(PathBuf, Report)]) -> Option<Report> {
    let first = &reports.first()?.1;
    if reports.len() == 1 {
        return Some(first.clone());
    }
    let mut totals = Totals::default();
    let mut uses: Vec<SuppressionUse> = Vec::new();
    for (_, r) in reports {
        add_totals(&mut totals, &r.totals);
        for u in &r.suppressions_used {
            match uses.iter_mut().find(|x| x.pattern == u.pattern) {
                Some(x) => {
                    add(&mut x.groups, u.groups);
                    add(&mut x.blocks, u.blocks);
                    add(&mut x.bytes, u.bytes);
                }
                None => uses.push(u.clone()),
            }
        }
    }
    let same = |f: fn(&Report) -> Option<String>| {
        let v = f(first);
        reports.iter().all(|(_, r)| f(r) == v).then_some(v).flatten()
    };
    let trigger = if reports.iter().all(|(_, r)| r.trigger == first.trigger) {
        first.trigger
    } else {
        Trigger::Exit
    };
    Some(Report {
        format: FORMAT.into(),
        version: VERSION,
        trigger,
        sequence: 1,
        pid: first.pid,
        ppid: None,
        command: first.command.clone(),
        hostname: same(|r| r.hostname.clone()),
        rank: None,
        instance: None,
        timestamp_ms: reports.iter().map(|(_, r)| r.timestamp_ms).max().unwrap_or(0),
        totals,
        leaks: merge_groups(reports.iter().flat_map(|(_, r)| r.leaks.clone())),
        growth: merge_groups(reports.iter().flat_map(|(_, r)| r.growth.clone())),
        suppressed: merge_groups(reports.iter().flat_map(|(_, r)| r.suppressed.clone())),
        reason: None,
        exit_status: None,
        signal: None,
        suppressions_used: uses,
        python: None,
        incomplete_shards: crate::report::saturating_sum(reports.iter().map(|(_, r)| r.incomplete_shards)),
        merged_from: reports.iter().map(|(p, _)| p.display().to_string()).collect(),
        run_id: same(|r| r.run_id.clone()),
        timeline: None,
        // Processes peak and run out of memory at their own moments: a
        // merged report has no one moment to show.
        oom: None,
        peak: None,
        oom_events: Vec::new(),
        allocation_trace: None,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    New,
    Grew,
    Shrank,
    Gone,
    Same,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupDelta {
    pub change: Change,
    pub blocks_delta: i64,
    pub bytes_delta: i64,
    pub old_bytes: u64,
    pub new_bytes: u64,
    /// the group as it is in the newer report (the older one when gone)
    pub group: Group,
}

/// Stack-by-stack growth from `old` to `new`, largest growth first.
pub fn diff(old: &Report, new: &Report) -> Vec<GroupDelta> {
    let mut olds: HashMap<GroupKey, &Group> = HashMap::new();
    for g in &old.leaks {
        olds.insert(GroupKey::of(g), g);
    }
    let mut out = Vec::new();
    for g in &new.leaks {
        let key = GroupKey::of(g);
        let (ob, oblocks) = olds.remove(&key).map_or((0, 0), |o| (o.bytes, o.blocks));
        let change = match (ob, g.bytes) {
            (0, _) if oblocks == 0 => Change::New,
            (o, n) if n > o => Change::Grew,
            (o, n) if n < o => Change::Shrank,
            _ => Change::Same,
        };
        out.push(GroupDelta {
            change,
            blocks_delta: delta(g.blocks, oblocks),
            bytes_delta: delta(g.bytes, ob),
            old_bytes: ob,
            new_bytes: g.bytes,
            group: g.clone(),
        });
    }
    for g in old.leaks.iter().filter(|g| olds.contains_key(&GroupKey::of(g))) {
        out.push(GroupDelta {
            change: Change::Gone,
            blocks_delta: delta(0, g.blocks),
            bytes_delta: delta(0, g.bytes),
            old_bytes: g.bytes,
            new_bytes: 0,
            group: g.clone(),
        });
    }
    // Growth first, largest first; then shrinking, the largest change
    // first (-1 MiB came before -32 MiB, sorted by sign).
    let order = |d: i64| (d < 0, std::cmp::Reverse(d.unsigned_abs()));
    out.sort_by(|a, b| {
        order(a.bytes_delta).cmp(&order(b.bytes_delta)).then_with(|| {
            crate::report::render::top_frame_label(&a.group)
                .cmp(&crate::report::render::top_frame_label(&b.group))
        })
    });
    out
}

/// One process (rank) of a distributed run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankSummary {
    /// "rank 3", or "pid 1234@host" when the launcher set no rank
    pub label: String,
    pub rank: Option<i64>,
    pub hostname: Option<String>,
    pub pid: i64,
    pub file: String,
    pub leaked_bytes: u64,
    pub leaked_blocks: u64,
    pub groups: usize,
    /// leaks much more than the median rank
    pub outlier: bool,
}

/// A group and where it occurs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SharedGroup {
    pub group: Group,
    /// labels of the ranks that have it
    pub ranks: Vec<String>,
    /// on some ranks but not all: the thing to look at
    pub only_some: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankView {
    pub ranks: Vec<RankSummary>,
    pub groups: Vec<SharedGroup>,
}

pub fn rank_label(r: &Report) -> String {
    match r.rank {
        Some(k) => format!("rank {k}"),
        None => format!("pid {}@{}", r.pid, r.hostname.as_deref().unwrap_or("?")),
    }
}

/// Per-rank totals and, for each group, the ranks it occurs on.
pub fn rank_view(reports: &[(PathBuf, Report)]) -> RankView {
    let mut ranks: Vec<RankSummary> = reports
        .iter()
        .map(|(p, r)| RankSummary {
            label: rank_label(r),
            rank: r.rank,
            hostname: r.hostname.clone(),
            pid: r.pid,
            file: p.display().to_string(),
            leaked_bytes: r.leaked_bytes(),
            leaked_blocks: r.leaked_blocks(),
            groups: r.leaks.len(),
            outlier: false,
        })
        .collect();
    let mut sorted: Vec<u64> = ranks.iter().map(|r| r.leaked_bytes).collect();
    sorted.sort_unstable();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
    if ranks.len() >= 2 {
        for r in &mut ranks {
            r.outlier = r.leaked_bytes > 0 && r.leaked_bytes > median.saturating_mul(2);
        }
    }
    let mut where_: BTreeMap<GroupKey, (Group, Vec<String>)> = BTreeMap::new();
    for (_, r) in reports {
        let label = rank_label(r);
        for g in &r.leaks {
            let e = where_.entry(GroupKey::of(g)).or_insert_with(|| {
                (
                    Group {
                        blocks: 0,
                        bytes: 0,
                        torn_down_blocks: 0,
                        torn_down_bytes: 0,
                        examples: vec![],
                        ..g.clone()
                    },
                    Vec::new(),
                )
            });
            add(&mut e.0.blocks, g.blocks);
            add(&mut e.0.bytes, g.bytes);
            add(&mut e.0.torn_down_blocks, g.torn_down_blocks);
            add(&mut e.0.torn_down_bytes, g.torn_down_bytes);
            if !e.1.contains(&label) {
                e.1.push(label.clone());
            }
        }
    }
    let n = reports.len();
    let mut groups: Vec<SharedGroup> = where_
        .into_values()
        .map(|(group, ranks)| SharedGroup {
            only_some: n >= 2 && ranks.len() < n,
            group,
            ranks,
        })
        .collect();
    groups.sort_by(|a, b| {
        b.only_some
            .cmp(&a.only_some)
            .then(b.group.bytes.cmp(&a.group.bytes))
    });
    RankView { ranks, groups }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::MemoryKind;
    use crate::report::NativeFrame;

    fn group(func: &str, line: i64, addr: &str, bytes: u64) -> Group {
        let frame = NativeFrame {
            address: addr.into(),
            function: Some(func.into()),
            file: Some("train.c".into()),
            line: Some(line),
            module: Some(format!("/run/{addr}/app")),
            ..NativeFrame::default()
        };
        Group::new(1, bytes, "cudaMalloc", MemoryKind::Device, vec![frame], vec![])
    }

    fn report(pid: i64, rank: Option<i64>, seq: u64, leaks: Vec<Group>) -> Report {
        let mut r = Report::empty_for_tests();
        r.pid = pid;
        r.rank = rank;
        r.sequence = seq;
        r.hostname = Some("h".into());
        r.totals.live_bytes = leaks.iter().map(|g| g.bytes).sum();
        r.totals.live_blocks = leaks.len() as u64;
        r.leaks = leaks;
        r
    }

    #[test]
    fn sums_and_deltas_saturate() {
        let max = u64::MAX;
        let a = report(1, None, 1, vec![group("f", 1, "0x1", max)]);
        let b = report(2, None, 1, vec![group("f", 1, "0x2", max)]);
        let merged = merge(&[("a".into(), a.clone()), ("b".into(), b)]).unwrap();
        assert_eq!(merged.leaks[0].bytes, max);
        assert_eq!(merged.leaked_bytes(), max);
        let empty = report(1, None, 1, vec![]);
        assert_eq!(diff(&empty, &a)[0].bytes_delta, i64::MAX);
        assert_eq!(diff(&a, &empty)[0].bytes_delta, i64::MIN);
        assert_eq!(delta(5, 3), 2);
    }

    #[test]
    fn groups_match_by_symbols_not_addresses() {
        let a = group("step", 10, "0x1000", 100);
        let b = group("step", 10, "0x7000", 50);
        assert_eq!(GroupKey::of(&a), GroupKey::of(&b));
        assert_ne!(GroupKey::of(&a), GroupKey::of(&group("step", 11, "0x1000", 1)));
    }

    #[test]
    fn latest_dump_per_process_is_kept() {
        let rs = vec![
            (
                PathBuf::from("a1"),
                report(1, None, 1, vec![group("f", 1, "0x1", 10)]),
            ),
            (
                PathBuf::from("a2"),
                report(1, None, 2, vec![group("f", 1, "0x1", 20)]),
            ),
            (PathBuf::from("b1"), report(2, None, 1, vec![])),
        ];
        let kept = latest_per_process(rs);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].0, PathBuf::from("a2"));
    }

    #[test]
    fn merge_sums_matching_groups() {
        let rs = vec![
            (
                PathBuf::from("r0"),
                report(10, Some(0), 1, vec![group("step", 10, "0x1", 100)]),
            ),
            (
                PathBuf::from("r1"),
                report(
                    11,
                    Some(1),
                    1,
                    vec![group("step", 10, "0x9", 100), group("extra", 3, "0x9", 7)],
                ),
            ),
        ];
        let m = merge(&rs).unwrap();
        assert_eq!(m.leaks.len(), 2);
        assert_eq!(m.leaks[0].bytes, 200);
        assert_eq!(m.leaks[0].blocks, 2);
        assert_eq!(m.totals.live_bytes, 207);
        assert_eq!(m.merged_from, vec!["r0", "r1"]);
    }

    #[test]
    fn diff_between_processes() {
        let old = report(
            1,
            None,
            1,
            vec![group("a", 1, "0x1", 100), group("gone", 2, "0x1", 5)],
        );
        let new = report(
            2,
            None,
            1,
            vec![group("a", 1, "0x8", 300), group("fresh", 3, "0x8", 10)],
        );
        let d = diff(&old, &new);
        assert_eq!(d[0].change, Change::Grew);
        assert_eq!(d[0].bytes_delta, 200);
        assert_eq!(d[1].change, Change::New);
        assert_eq!(d[2].change, Change::Gone);
        assert_eq!(d[2].bytes_delta, -5);
    }

    #[test]
    fn diff_lists_shrinking_groups_by_size() {
        // Shrinking groups are listed by how much they shrank: -32 MiB
        // before -1 MiB (a sort by signed value put -1 MiB first).
        let old = report(
            1,
            None,
            1,
            vec![
                group("small", 1, "0x1", 2 << 20),
                group("large", 2, "0x1", 64 << 20),
                group("grows", 3, "0x1", 1),
            ],
        );
        let new = report(
            2,
            None,
            1,
            vec![
                group("small", 1, "0x1", 1 << 20),
                group("large", 2, "0x1", 32 << 20),
                group("grows", 3, "0x1", 5),
            ],
        );
        let d: Vec<i64> = diff(&old, &new).iter().map(|g| g.bytes_delta).collect();
        assert_eq!(d, [4, -(32 << 20), -(1 << 20)]);
    }

    #[test]
    fn rank_view_highlights_what_only_some_ranks_leak() {
        let rs: Vec<_> = (0..4)
            .map(|k| {
                let mut leaks = vec![group("common", 1, "0x1", 10)];
                if k == 2 {
                    leaks.push(group("rank2_only", 9, "0x1", 1000));
                }
                (PathBuf::from(format!("r{k}")), report(100 + k, Some(k), 1, leaks))
            })
            .collect();
        let v = rank_view(&rs);
        assert_eq!(v.ranks.len(), 4);
        assert!(v.ranks[2].outlier);
        assert!(!v.ranks[0].outlier);
        assert!(v.groups[0].only_some);
        assert_eq!(v.groups[0].ranks, vec!["rank 2"]);
        assert!(!v.groups[1].only_some);
        assert_eq!(v.groups[1].ranks.len(), 4);
    }
}
