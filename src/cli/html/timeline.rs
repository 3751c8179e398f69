//! The timeline of the page: its points (from the dumps, or from a
//! report's sampled timeline), the call sites given a band of their own
//! among many (largest at the end, at the peak, fastest growing), and the
//! marks on it (dumps, the peak, out-of-memory episodes).

use super::{frames_of, FrameTable, OomMark, MAX_TIMELINE_POINTS, TIMELINE_SITES};
use cudaleak_core::combine::{self, GroupKey};
use cudaleak_core::report::render;
use cudaleak_core::report::{Group, Report, SampledTimeline};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
#[derive(Serialize)]
pub struct Series {
    pub label: String,
    /// the site's stack, innermost first, as indices into [`Page::frames`](super::Page::frames)
    /// (empty for "other")
    pub stack: Vec<u32>,
    pub values: Vec<u64>,
    /// why it is drawn: "largest at the end", "largest at the peak",
    /// "fastest growing"
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub why: Vec<&'static str>,
    /// index of its row in the table, when it has one: the legend gives
    /// the table's figure
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<usize>,
    /// what is missing when the series is not whole
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
    /// its bytes at the process's peak, exact (the report's `peak`), where
    /// the report has one: the values are samples, and the most a sample
    /// saw is not the peak
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_peak: Option<u64>,
    /// the site's group, to find it in the report's peak
    #[serde(skip)]
    pub(super) key: Option<GroupKey>,
}

/// A call site's series before the choice of what to draw.
struct SiteRow<'a> {
    group: &'a Group,
    values: Vec<u64>,
    partial: Option<String>,
}

/// The call sites a timeline draws, chosen when the page is made from
/// every site's series (sites chosen early, or by their largest
/// sample, lost the ones that grew late to "other"): the largest at the
/// end, the largest at the highest point, and those that grew the most
/// over the second half of the run; then the largest at the end again up
/// to [`TIMELINE_SITES`]. Drawn largest at the end first (bottom band).
fn choose_sites(rows: &[SiteRow], total: &[u64]) -> Vec<(usize, Vec<&'static str>)> {
    let n = total.len();
    if n == 0 || rows.is_empty() {
        return Vec::new();
    }
    let last = n - 1;
    let peak = total
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(last, |(i, _)| i);
    let mid = n / 2;
    let at = |r: &SiteRow, i: usize| r.values.get(i).copied().unwrap_or(0);
    let order = |key: &dyn Fn(&SiteRow) -> i128| {
        let mut v: Vec<usize> = (0..rows.len()).filter(|&i| key(&rows[i]) > 0).collect();
        v.sort_by(|&a, &b| key(&rows[b]).cmp(&key(&rows[a])).then(a.cmp(&b)));
        v
    };
    let by_end = order(&|r| at(r, last) as i128);
    let by_peak = order(&|r| at(r, peak) as i128);
    let by_growth = order(&|r| at(r, last) as i128 - at(r, mid) as i128);
    let mut chosen: Vec<(usize, Vec<&'static str>)> = Vec::new();
    let add = |i: usize, why: &'static str, chosen: &mut Vec<(usize, Vec<&'static str>)>, room: bool| {
        if let Some(c) = chosen.iter_mut().find(|c| c.0 == i) {
            if !c.1.contains(&why) {
                c.1.push(why);
            }
        } else if room && chosen.len() < TIMELINE_SITES {
            chosen.push((i, vec![why]));
        }
    };
    // Each list's first share, then the rest by the end and by the peak.
    let shares = [
        (&by_end, TIMELINE_SITES / 2, "largest at the end"),
        (&by_peak, TIMELINE_SITES / 3, "largest at the peak"),
        (&by_growth, TIMELINE_SITES / 4, "fastest growing"),
    ];
    let fill = [
        (&by_end, usize::MAX, "largest at the end"),
        (&by_peak, usize::MAX, "largest at the peak"),
    ];
    for &(list, n, why) in shares.iter().chain(&fill) {
        for &i in list.iter().take(n) {
            add(i, why, &mut chosen, true);
        }
    }
    // Tags for every list a shown site is in, so the tooltip says all.
    for &(list, n, why) in &shares {
        for &i in list.iter().take(n) {
            add(i, why, &mut chosen, false);
        }
    }
    chosen.sort_by(|a, b| {
        at(&rows[b.0], last)
            .cmp(&at(&rows[a.0], last))
            .then(at(&rows[b.0], peak).cmp(&at(&rows[a.0], peak)))
            .then(a.0.cmp(&b.0))
    });
    chosen
}

/// The drawn series of `rows`, labelled so that they tell apart
/// ([`cudaleak_core::report::render::group_labels`]), with "other" for the rest.
fn chosen_series(
    rows: &[SiteRow],
    total: &[u64],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Vec<Series> {
    let chosen = choose_sites(rows, total);
    let groups: Vec<&Group> = chosen.iter().map(|&(i, _)| rows[i].group).collect();
    let labels = render::group_labels(&groups);
    let mut series: Vec<Series> = chosen
        .iter()
        .zip(labels)
        .map(|((i, why), label)| {
            let r = &rows[*i];
            Series {
                label,
                stack: frames_of(r.group, table).0,
                values: r.values.clone(),
                why: why.clone(),
                group: table_rows.get(&GroupKey::of(r.group)).copied(),
                partial: r.partial.clone(),
                at_peak: None,
                key: Some(GroupKey::of(r.group)),
            }
        })
        .collect();
    let other: Vec<u64> = total
        .iter()
        .enumerate()
        .map(|(k, &t)| {
            let listed = series.iter().map(|s| s.values[k]).fold(0u64, u64::saturating_add);
            t.saturating_sub(listed)
        })
        .collect();
    push_other(&mut series, other);
    series
}

/// The "other" series of a timeline: live bytes outside the listed call
/// sites, drawn only when there are any.
fn push_other(series: &mut Vec<Series>, other: Vec<u64>) {
    if other.iter().any(|&v| v > 0) {
        series.push(Series {
            label: "other".into(),
            stack: Vec::new(),
            values: other,
            why: Vec::new(),
            group: None,
            partial: None,
            at_peak: None,
            key: None,
        });
    }
}

#[derive(Serialize)]
pub struct Mark {
    pub t_ms: i64,
    /// exit, signal, interval, api, context-teardown, fatal-signal
    pub trigger: String,
    pub label: String,
}

#[derive(Serialize)]
pub struct PeakSite {
    pub label: String,
    pub bytes: u64,
}

#[derive(Serialize)]
pub struct Peak {
    pub t_ms: i64,
    pub bytes: u64,
    pub sites: Vec<PeakSite>,
}

#[derive(Serialize)]
pub struct PageTimeline {
    /// where the points come from: "dumps" or "sampler"
    pub source: &'static str,
    pub t_ms: Vec<i64>,
    /// total live bytes at each point (all kinds, all sites)
    pub total: Vec<u64>,
    /// one band per call site, largest first, "other" last
    pub series: Vec<Series>,
    pub peak: Option<Peak>,
    /// the process's own peak (`peak_bytes`), which a spike shorter than
    /// the sampling period can put above every sample
    pub process_peak: u64,
    pub marks: Vec<Mark>,
    /// the out-of-memory episodes of the report
    pub ooms: Vec<OomMark>,
    /// call sites summed in "other"
    pub other_sites: usize,
    /// the report's own peak with its time (`peak`), when it has one
    pub report_peak: Option<ReportPeak>,
}

#[derive(Serialize)]
pub struct ReportPeak {
    pub t_ms: i64,
    pub bytes: u64,
}

/// A process's latest dump so far, and its groups' bytes.
type LatestDump<'a> = (&'a Report, Vec<(GroupKey, u64)>);

/// The timeline a set of dumps shows by themselves: one point per dump
/// (of every process, summed), one band per call site. Reports that carry
/// a sampled timeline give more points; see [`timeline_from_samples`].
fn timeline_from_dumps(
    all: &[(PathBuf, Report)],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Option<PageTimeline> {
    let mut dumps: Vec<&Report> = all.iter().map(|(_, r)| r).collect();
    if dumps.is_empty() {
        return None;
    }
    dumps.sort_by_key(|r| (r.timestamp_ms, r.sequence));
    // Per process, the groups of its latest dump so far.
    let mut current: HashMap<(String, i64, String), LatestDump> = HashMap::new();
    let mut keys: Vec<GroupKey> = Vec::new();
    let mut key_index: HashMap<GroupKey, usize> = HashMap::new();
    let mut key_group: Vec<&Group> = Vec::new();
    let mut t_ms = Vec::new();
    let mut total = Vec::new();
    let mut columns: Vec<HashMap<usize, u64>> = Vec::new();
    // Points at which a dump listed only some of its groups
    // (`groups_left_out`): a site absent there may only have been cut.
    let mut cut: Vec<bool> = Vec::new();
    let mut marks = Vec::new();
    for r in &dumps {
        let mut row = Vec::new();
        for g in r.leaks.iter().filter(|g| g.kind().counts_in_live_bytes()) {
            let key = GroupKey::of(g);
            if !key_index.contains_key(&key) {
                key_index.insert(key.clone(), keys.len());
                keys.push(key.clone());
                key_group.push(g);
            }
            row.push((key, g.bytes));
        }
        current.insert(combine::process_id(r), (r, row));
        let mut column: HashMap<usize, u64> = HashMap::new();
        let mut live = 0u64;
        for (proc_report, row) in current.values() {
            live = live.saturating_add(proc_report.totals.live_bytes);
            for (k, b) in row {
                let e = column.entry(key_index[k]).or_default();
                *e = e.saturating_add(*b);
            }
        }
        let some_cut = current
            .values()
            .any(|(d, _)| d.totals.groups_left_out.is_some_and(|l| l.groups > 0));
        if t_ms.last() == Some(&r.timestamp_ms) {
            // Two processes dumped in the same millisecond: one point.
            t_ms.pop();
            total.pop();
            columns.pop();
            cut.pop();
        }
        t_ms.push(r.timestamp_ms);
        total.push(live);
        columns.push(column);
        cut.push(some_cut);
        marks.push(Mark {
            t_ms: r.timestamp_ms,
            trigger: r.trigger.name().to_string(),
            label: format!("{} dump #{} of pid {}", r.trigger.name(), r.sequence, r.pid),
        });
    }
    let rows: Vec<SiteRow> = (0..keys.len())
        .map(|i| SiteRow {
            group: key_group[i],
            values: columns.iter().map(|c| c.get(&i).copied().unwrap_or(0)).collect(),
            partial: columns
                .iter()
                .zip(&cut)
                .any(|(c, &cut)| cut && !c.contains_key(&i))
                .then(|| {
                    "partial: not listed at every dump (CUDALEAK_MAX_GROUPS left groups out)".to_string()
                }),
        })
        .collect();
    let series = chosen_series(&rows, &total, table, table_rows);
    let other_sites = rows.len()
        - series
            .iter()
            .filter(|s| s.label != "other" || !s.stack.is_empty())
            .count();
    let peak = total
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(i, &bytes)| Peak {
            t_ms: t_ms[i],
            bytes,
            sites: series
                .iter()
                .filter(|s| s.values[i] > 0)
                .map(|s| PeakSite {
                    label: s.label.clone(),
                    bytes: s.values[i],
                })
                .collect(),
        });
    Some(thin(PageTimeline {
        source: "dumps",
        process_peak: dumps.iter().map(|r| r.totals.peak_bytes).max().unwrap_or(0),
        t_ms,
        total,
        series,
        peak,
        marks,
        ooms: Vec::new(),
        report_peak: None,
        other_sites,
    }))
}

fn dump_marks(all: &[(PathBuf, Report)]) -> Vec<Mark> {
    let mut dumps: Vec<&Report> = all.iter().map(|(_, r)| r).collect();
    dumps.sort_by_key(|r| (r.timestamp_ms, r.sequence));
    dumps
        .iter()
        .map(|r| Mark {
            t_ms: r.timestamp_ms,
            trigger: r.trigger.name().to_string(),
            label: format!("{} dump #{} of pid {}", r.trigger.name(), r.sequence, r.pid),
        })
        .collect()
}

/// The timeline a report carries (`CUDALEAK_TIMELINE`): one point per
/// sample, one band per call site among the largest, the rest "other".
fn timeline_from_samples(
    t: &SampledTimeline,
    all: &[(PathBuf, Report)],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Option<PageTimeline> {
    if t.samples.is_empty() {
        return None;
    }
    let total: Vec<u64> = t.samples.iter().map(|s| s.live_bytes).collect();
    // Per site: its whole series where the report kept it,
    // else what the samples' largest 8 say of it (partial).
    let mut whole = t.whole_series();
    // Sites of one group (the same stack less the interpreter's return
    // addresses) are one series, as they are one row of the table.
    let mut rows: Vec<SiteRow> = Vec::new();
    let mut row_of: HashMap<GroupKey, usize> = HashMap::new();
    for (i, g) in t.sites.iter().enumerate() {
        let (values, partial) = match whole[i].take() {
            Some(v) => (v, None),
            // Whole where it is listed at every sample that left bytes
            // out; else it may hide in "other" there.
            None => (
                t.samples.iter().map(|s| s.listed(i)).collect(),
                t.samples
                    .iter()
                    .any(|s| s.other_bytes > 0 && !s.sites.iter().any(|&(j, _)| j as usize == i))
                    .then(|| {
                        format!(
                            "partial: only where it was among the {} largest at a sample",
                            cudaleak_core::timeline::site_timeline::SITES_PER_SAMPLE
                        )
                    }),
            ),
        };
        match row_of.entry(GroupKey::of(g)) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let r = &mut rows[*e.get()];
                for (a, b) in r.values.iter_mut().zip(values) {
                    *a = a.saturating_add(b);
                }
                r.partial = r.partial.take().or(partial);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(rows.len());
                rows.push(SiteRow {
                    group: g,
                    values,
                    partial,
                });
            }
        }
    }
    let series = chosen_series(&rows, &total, table, table_rows);
    let other_sites = rows.len()
        - series
            .iter()
            .filter(|s| s.label != "other" || !s.stack.is_empty())
            .count();
    let site_labels = render::group_labels(&t.sites.iter().collect::<Vec<_>>());
    let peak = t.peak.as_ref().map(|p| Peak {
        t_ms: p.timestamp_ms,
        bytes: p.live_bytes,
        sites: p
            .sites
            .iter()
            .filter_map(|&(i, bytes)| {
                site_labels.get(i as usize).map(|label| PeakSite {
                    label: label.clone(),
                    bytes,
                })
            })
            .collect(),
    });
    Some(thin(PageTimeline {
        source: "sampler",
        process_peak: t.samples.iter().map(|s| s.peak_bytes).max().unwrap_or(0),
        t_ms: t.samples.iter().map(|s| s.timestamp_ms).collect(),
        total,
        series,
        peak,
        marks: dump_marks(all),
        ooms: Vec::new(),
        report_peak: None,
        other_sites,
    }))
}

/// The sampled timeline when the reports are of one process and the
/// newest carries one; else one point per dump.
pub(super) fn page_timeline(
    all: &[(PathBuf, Report)],
    table: &mut FrameTable,
    table_rows: &HashMap<GroupKey, usize>,
) -> Option<PageTimeline> {
    let first = &all.first()?.1;
    let one_process = all
        .iter()
        .all(|(_, r)| combine::process_id(r) == combine::process_id(first));
    let newest = all
        .iter()
        .map(|(_, r)| r)
        .max_by_key(|r| (r.sequence, r.timestamp_ms))?;
    match &newest.timeline {
        Some(t) if one_process => timeline_from_samples(t, all, table, table_rows),
        _ => timeline_from_dumps(all, table, table_rows),
    }
}

/// Past [`MAX_TIMELINE_POINTS`], merges neighbouring points (keeping the
/// one with more live bytes) until it fits.
pub(super) fn thin(mut t: PageTimeline) -> PageTimeline {
    while t.t_ms.len() > MAX_TIMELINE_POINTS {
        let keep: Vec<usize> = (0..t.t_ms.len())
            .step_by(2)
            .map(|i| {
                if i + 1 < t.total.len() && t.total[i + 1] > t.total[i] {
                    i + 1
                } else {
                    i
                }
            })
            .collect();
        t.t_ms = keep.iter().map(|&i| t.t_ms[i]).collect();
        t.total = keep.iter().map(|&i| t.total[i]).collect();
        for s in &mut t.series {
            s.values = keep.iter().map(|&i| s.values[i]).collect();
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudaleak_core::record::MemoryKind;

    fn site(i: usize) -> Group {
        let mut g = Group::new(0, 0, "cudaMalloc", MemoryKind::Device, Vec::new(), Vec::new());
        g.api = format!("site{i}");
        g
    }

    /// Of 30 steady sites and one that starts late and grows,
    /// the late one is drawn (largest at the end and fastest growing), and
    /// so is the one that was largest at the peak though gone at the end.
    #[test]
    fn the_choice_keeps_late_growers_and_the_peak_s_sites() {
        let n = 100;
        let groups: Vec<Group> = (0..32).map(site).collect();
        let mut rows: Vec<SiteRow> = (0..30)
            .map(|i| SiteRow {
                group: &groups[i],
                values: vec![1000 + i as u64; n],
                partial: None,
            })
            .collect();
        rows.push(SiteRow {
            group: &groups[30],
            values: (0..n as u64)
                .map(|k| if k < 80 { 0 } else { (k - 79) * 5000 })
                .collect(),
            partial: None,
        });
        rows.push(SiteRow {
            group: &groups[31],
            values: (0..n).map(|k| if k == 50 { 1 << 30 } else { 0 }).collect(),
            partial: None,
        });
        let total: Vec<u64> = (0..n).map(|k| rows.iter().map(|r| r.values[k]).sum()).collect();
        let chosen = choose_sites(&rows, &total);
        assert_eq!(chosen.len(), TIMELINE_SITES);
        let late = chosen.iter().find(|c| c.0 == 30).expect("the late grower");
        assert!(late.1.contains(&"largest at the end") && late.1.contains(&"fastest growing"));
        assert_eq!(chosen[0].0, 30, "largest at the end first");
        let spike = chosen.iter().find(|c| c.0 == 31).expect("the peak's site");
        assert!(spike.1.contains(&"largest at the peak"));
    }
}
