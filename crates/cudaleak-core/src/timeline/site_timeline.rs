//! The sampled timeline (`CUDALEAK_TIMELINE`): every period (100 ms by
//! default) the dumper thread reads the per-call-site counters
//! ([`crate::record::site_counters`]) and keeps the totals, the live bytes by
//! memory kind and the top call sites, plus "other". Reports carry it up
//! to the moment they are written ([`SampledTimeline`]).
//!
//! Memory stays bounded on runs of any length: past [`MAX_SAMPLES`] the
//! older half is merged pairwise, keeping the sample with more live bytes
//! so that peaks survive (as [`crate::timeline`] does with dumps). A week
//! at 100 ms stays under [`MAX_SAMPLES`] samples of at most
//! [`SITES_PER_SAMPLE`] sites: well under a few MB of JSON.
//!
//! The sample with the most live bytes is kept apart with more of its call
//! sites ([`SITES_AT_PEAK`]): what `max_memory_allocated` would say if it
//! had stacks. It is the peak as sampled: a spike shorter than the period
//! shows in `peak_bytes`, not in the sites.
//!
//! Every call site's own series is kept too ([`SiteSeries`]), thinned with
//! the samples, so that the picture can choose its call sites when it is
//! drawn, from the whole run (a choice made from each sample's
//! largest 8 lost the sites that grew late, and drew a site that held
//! 28.1 MiB at exit as "max 288.0 KiB"). Memory stays bounded: past
//! [`SERIES_CELLS`] values in all, samples are thinned sooner; with still
//! too many sites, the smallest sites' series are dropped (counted in
//! `series_dropped`; their bytes stay in the samples' totals).

use crate::base::hash::AddrHash;
use crate::record::{MemoryKind, TraceId};
use crate::report::{Group, SampledTimeline, SiteSeries, TimelineSample};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);
pub const MIN_PERIOD: Duration = Duration::from_millis(10);
pub const MAX_SAMPLES: usize = 2048;
pub const SITES_PER_SAMPLE: usize = 8;
pub const SITES_AT_PEAK: usize = 16;
/// The most values all call sites' series hold together (2 MiB).
pub const SERIES_CELLS: usize = 1 << 18;
/// Series a report writes per way a page chooses its call sites (largest
/// at the end, at the highest sample, fastest growing, largest ever):
/// a page draws 12, so the choice is the same as from every site's.
pub const SERIES_PER_CHOICE: usize = 64;
/// Below this many samples, series are dropped rather than thinned.
const MIN_SAMPLES: usize = 64;

/// One call site's live bytes at each sample, from the sample where it
/// first held memory; past its last value, zero.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct RawSeries {
    start: usize,
    values: Vec<u64>,
    max: u64,
}

/// `CUDALEAK_TIMELINE`: `0`/`off` (no sampling), `1`/`on` (every 100 ms),
/// or a period such as `250ms` or `2s` (at least 10 ms).
pub fn parse_period(v: &str) -> Result<Option<Duration>, String> {
    let t = v.trim().to_ascii_lowercase();
    match t.as_str() {
        "0" | "off" | "false" | "no" => return Ok(None),
        "1" | "on" | "true" | "yes" => return Ok(Some(DEFAULT_PERIOD)),
        _ => {}
    }
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err("expected 0, 1, or a period like 250ms or 2s".into());
    };
    match num.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x * scale >= MIN_PERIOD.as_secs_f64() && x * scale <= 3600.0 => {
            Ok(Some(Duration::from_secs_f64(x * scale)))
        }
        _ => Err("the period must be between 10ms and 3600s".into()),
    }
}

/// One sample with trace ids, before the sites are named.
#[derive(Clone, Debug, PartialEq)]
struct Raw {
    timestamp_ms: i64,
    live_bytes: u64,
    live_blocks: u64,
    peak_bytes: u64,
    by_memory: BTreeMap<MemoryKind, u64>,
    sites: Vec<(TraceId, u64)>,
    other_bytes: u64,
}

/// A set of trace ids as bits by id (ids are dense): every sample asks it
/// of every live site, and a hashed set of a million dropped sites missed
/// the cache on each (two thirds of a sample's time).
#[derive(Debug, Default)]
struct TraceSet {
    bits: Vec<u64>,
    len: u64,
}

impl TraceSet {
    fn contains(&self, t: &TraceId) -> bool {
        let i = t.0 as usize;
        self.bits.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn insert(&mut self, t: TraceId) {
        let i = t.0 as usize;
        if self.bits.len() <= i / 64 {
            self.bits.resize(i / 64 + 1, 0);
        }
        let bit = 1 << (i % 64);
        if self.bits[i / 64] & bit == 0 {
            self.bits[i / 64] |= bit;
            self.len += 1;
        }
    }
}

#[derive(Debug)]
pub struct SiteHistory {
    period: Duration,
    samples: Vec<Raw>,
    taken: u64,
    peak: Option<Raw>,
    /// by call site; hashed by one mix of the id, not SipHash: a sample
    /// of a million sites looks each up
    series: HashMap<TraceId, RawSeries, AddrHash>,
    /// values held by `series` together
    cells: usize,
    /// sites whose series were dropped for memory: never kept again
    dropped: TraceSet,
}

impl SiteHistory {
    pub fn new(period: Duration) -> SiteHistory {
        SiteHistory {
            period,
            samples: Vec::new(),
            taken: 0,
            peak: None,
            series: HashMap::default(),
            cells: 0,
            dropped: Default::default(),
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Records one sample: `live` holds (trace, live bytes, live blocks,
    /// memory kind) for each call site with live memory; `peak_bytes` is
    /// the process's peak so far. What the report's totals leave out
    /// (reserved address space, imported memory, pools) is left out.
    pub fn record(&mut self, timestamp_ms: i64, peak_bytes: u64, live: &[(TraceId, u64, u64, MemoryKind)]) {
        let mut by_memory: BTreeMap<MemoryKind, u64> = BTreeMap::new();
        let (mut live_bytes, mut live_blocks) = (0u64, 0u64);
        let mut sites: Vec<(TraceId, u64)> = Vec::with_capacity(live.len());
        for &(trace, bytes, blocks, kind) in live {
            if !kind.counts_in_live_bytes() {
                continue;
            }
            live_bytes = live_bytes.saturating_add(bytes);
            live_blocks = live_blocks.saturating_add(blocks);
            let k = by_memory.entry(kind).or_default();
            *k = k.saturating_add(bytes);
            if bytes > 0 {
                sites.push((trace, bytes));
            }
        }
        // Only the largest few are listed: select them, then sort those
        // (a full sort of a million sites every sample cost a fifth of a
        // second).
        let largest_first = |a: &(TraceId, u64), b: &(TraceId, u64)| b.1.cmp(&a.1).then(a.0 .0.cmp(&b.0 .0));
        let listed = SITES_PER_SAMPLE.max(SITES_AT_PEAK);
        if sites.len() > listed {
            sites.select_nth_unstable_by(listed, largest_first);
        }
        let head = listed.min(sites.len());
        sites[..head].sort_by(largest_first);
        let top = |n: usize| {
            let kept: Vec<(TraceId, u64)> = sites.iter().take(n).copied().collect();
            let listed = kept.iter().fold(0u64, |s, x| s.saturating_add(x.1));
            (kept, live_bytes.saturating_sub(listed))
        };
        let (kept, other_bytes) = top(SITES_PER_SAMPLE);
        let sample = Raw {
            timestamp_ms,
            live_bytes,
            live_blocks,
            peak_bytes: peak_bytes.max(live_bytes),
            by_memory,
            sites: kept,
            other_bytes,
        };
        if self.peak.as_ref().is_none_or(|p| live_bytes > p.live_bytes) {
            let (kept, other_bytes) = top(SITES_AT_PEAK);
            self.peak = Some(Raw {
                sites: kept,
                other_bytes,
                ..sample.clone()
            });
        }
        self.taken += 1;
        let at = self.samples.len();
        for &(trace, bytes) in &sites {
            if self.dropped.contains(&trace) {
                continue;
            }
            let s = self.series.entry(trace).or_insert_with(|| RawSeries {
                start: at,
                ..RawSeries::default()
            });
            let len = at - s.start;
            self.cells += len + 1 - s.values.len();
            s.values.resize(len, 0);
            s.values.push(bytes);
            s.max = s.max.max(bytes);
        }
        self.samples.push(sample);
        while self.samples.len() > MAX_SAMPLES
            || (self.cells > SERIES_CELLS && self.samples.len() > MIN_SAMPLES)
        {
            self.thin();
        }
        if self.cells > SERIES_CELLS {
            self.drop_smallest_series();
        }
    }

    /// Merges the older half of the samples pairwise, keeping the sample
    /// with more live bytes, and every series with them.
    fn thin(&mut self) {
        let n = self.samples.len();
        let half = n / 2;
        let mut keep: Vec<usize> = Vec::with_capacity(n);
        let mut i = 0;
        while i < half {
            if i + 1 < half && self.samples[i + 1].live_bytes > self.samples[i].live_bytes {
                keep.push(i + 1);
            } else {
                keep.push(i);
            }
            i += 2;
        }
        keep.extend(half..n);
        // `keep` is in ascending order: the samples move, none is copied.
        let mut next = keep.iter().peekable();
        let old = std::mem::take(&mut self.samples);
        self.samples = old
            .into_iter()
            .enumerate()
            .filter(|(i, _)| {
                let kept = next.peek() == Some(&i);
                if kept {
                    next.next();
                }
                kept
            })
            .map(|(_, s)| s)
            .collect();
        let mut cells = 0;
        self.series.retain(|_, s| {
            let end = s.start + s.values.len();
            let first = keep.partition_point(|&k| k < s.start);
            let values: Vec<u64> = keep[first..]
                .iter()
                .take_while(|&&k| k < end)
                .map(|&k| s.values[k - s.start])
                .collect();
            s.start = first;
            s.values = values;
            cells += s.values.len();
            // A site that lived only in samples merged away is gone from
            // the picture as from the samples; `max` keeps its high.
            !s.values.is_empty()
        });
        self.cells = cells;
    }

    /// Too many sites for [`SERIES_CELLS`] even at [`MIN_SAMPLES`]: the
    /// series of the sites that held the least are dropped.
    fn drop_smallest_series(&mut self) {
        let mut by_max: Vec<(u64, TraceId, usize)> = self
            .series
            .iter()
            .map(|(&t, s)| (s.max, t, s.values.len()))
            .collect();
        by_max.sort_by(|a, b| a.0.cmp(&b.0).then(b.1 .0.cmp(&a.1 .0)));
        for (_, t, len) in by_max {
            if self.cells <= SERIES_CELLS * 3 / 4 {
                break;
            }
            self.series.remove(&t);
            self.dropped.insert(t);
            self.cells -= len;
        }
    }

    /// The timeline for a report: the call sites named by `name` (a group
    /// with no counts; `None` leaves the site out and its bytes in "other").
    pub fn to_report(&self, mut name: impl FnMut(TraceId) -> Option<Group>) -> SampledTimeline {
        let mut named = NamedSites {
            name: &mut name,
            index: HashMap::new(),
            sites: Vec::new(),
        };
        let mut convert = |raw: &Raw| -> TimelineSample {
            let mut out_sites = Vec::with_capacity(raw.sites.len());
            let mut other = raw.other_bytes;
            for &(trace, bytes) in &raw.sites {
                match named.site(trace, bytes) {
                    Some(i) => out_sites.push((i, bytes)),
                    None => other = other.saturating_add(bytes),
                }
            }
            TimelineSample {
                timestamp_ms: raw.timestamp_ms,
                live_bytes: raw.live_bytes,
                live_blocks: raw.live_blocks,
                peak_bytes: raw.peak_bytes,
                by_memory: raw.by_memory.clone(),
                sites: out_sites,
                other_bytes: other,
            }
        };
        let samples: Vec<TimelineSample> = self.samples.iter().map(&mut convert).collect();
        let peak = self.peak.as_ref().map(&mut convert);
        // The series of the sites a page can choose from (largest at the
        // end, at the highest sample, fastest growing, largest ever), in a
        // stable order (largest first). Every site's series, as kept here,
        // made a report of 100k call sites 830 MB (bench.py --only exit):
        // each written series names its site with a whole stack.
        let mut traces: Vec<(&TraceId, &RawSeries)> = self.series.iter().collect();
        traces.sort_by(|a, b| b.1.max.cmp(&a.1.max).then(a.0 .0.cmp(&b.0 .0)));
        let n = self.samples.len();
        let last = n.saturating_sub(1);
        let highest = self
            .samples
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.live_bytes.cmp(&b.1.live_bytes).then(b.0.cmp(&a.0)))
            .map_or(last, |(i, _)| i);
        let at = |s: &RawSeries, k: usize| {
            k.checked_sub(s.start)
                .and_then(|i| s.values.get(i))
                .copied()
                .unwrap_or(0)
        };
        let mut keep: std::collections::HashSet<TraceId> = std::collections::HashSet::new();
        let mut choose = |key: &dyn Fn(&RawSeries) -> i128| {
            let mut v: Vec<(i128, TraceId)> = traces
                .iter()
                .map(|(t, s)| (key(s), **t))
                .filter(|(k, _)| *k > 0)
                .collect();
            v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1 .0.cmp(&b.1 .0)));
            keep.extend(v.into_iter().take(SERIES_PER_CHOICE).map(|(_, t)| t));
        };
        choose(&|s| at(s, last) as i128);
        choose(&|s| at(s, highest) as i128);
        choose(&|s| at(s, last) as i128 - at(s, n / 2) as i128);
        choose(&|s| s.max as i128);
        let mut series = Vec::with_capacity(keep.len());
        let mut dropped = self.dropped.len;
        for (&trace, s) in traces {
            if !keep.contains(&trace) {
                dropped += 1;
                continue;
            }
            match named.site(trace, s.values.iter().copied().max().unwrap_or(0)) {
                Some(i) => {
                    series.push(SiteSeries {
                        site: i,
                        start: s.start as u32,
                        values: s.values.clone(),
                    });
                }
                None => dropped += 1,
            }
        }
        SampledTimeline {
            period_ms: self.period.as_millis() as u64,
            samples_taken: self.taken,
            sites: named.sites,
            samples,
            peak,
            series,
            series_dropped: dropped,
        }
    }
}

/// The call sites a report's timeline names, each once, by trace.
struct NamedSites<'n, F> {
    name: &'n mut F,
    index: HashMap<TraceId, Option<u32>>,
    sites: Vec<Group>,
}

impl<F: FnMut(TraceId) -> Option<Group>> NamedSites<'_, F> {
    /// The index of `trace`'s site in `sites`, named the first time (None:
    /// left out, its bytes in "other"); the site's bytes are raised to at
    /// least `bytes`.
    fn site(&mut self, trace: TraceId, bytes: u64) -> Option<u32> {
        let NamedSites { name, index, sites } = self;
        let slot = *index.entry(trace).or_insert_with(|| {
            name(trace).map(|g| {
                sites.push(g);
                (sites.len() - 1) as u32
            })
        });
        if let Some(i) = slot {
            let g = &mut sites[i as usize];
            g.bytes = g.bytes.max(bytes);
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(i: u32) -> Group {
        Group::new(0, 0, "cudaMalloc", MemoryKind::Device, Vec::new(), Vec::new())
            .with_api(&format!("site{i}"))
    }

    trait WithApi {
        fn with_api(self, api: &str) -> Self;
    }
    impl WithApi for Group {
        fn with_api(mut self, api: &str) -> Self {
            self.api = api.into();
            self
        }
    }

    #[test]
    fn periods_parse_with_defaults_and_bounds() {
        assert_eq!(parse_period("1"), Ok(Some(DEFAULT_PERIOD)));
        assert_eq!(parse_period("off"), Ok(None));
        assert_eq!(parse_period("250ms"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(parse_period("2s"), Ok(Some(Duration::from_secs(2))));
        assert!(parse_period("1ms").is_err());
        assert!(parse_period("fast").is_err());
        assert!(parse_period("nans").is_err());
    }

    /// Top sites plus "other", the peak with its sites, kinds summed,
    /// address space left out.
    #[test]
    fn samples_keep_top_sites_other_and_the_peak() {
        let mut h = SiteHistory::new(DEFAULT_PERIOD);
        let many: Vec<(TraceId, u64, u64, MemoryKind)> = (1..=20)
            .map(|i| (TraceId(i), i as u64 * 10, 1, MemoryKind::Device))
            .collect();
        h.record(1000, 0, &many);
        h.record(
            1100,
            5000,
            &[
                (TraceId(1), 100, 1, MemoryKind::Host),
                (TraceId(30), 1 << 40, 1, MemoryKind::Reservation),
            ],
        );
        let t = h.to_report(|id| Some(site(id.0)));
        assert_eq!(t.samples.len(), 2);
        let s0 = &t.samples[0];
        assert_eq!(s0.live_bytes, 2100);
        assert_eq!(s0.sites.len(), SITES_PER_SAMPLE);
        assert_eq!(t.sites[s0.sites[0].0 as usize].api, "site20");
        let listed: u64 = s0.sites.iter().map(|s| s.1).sum();
        assert_eq!(listed + s0.other_bytes, 2100);
        let s1 = &t.samples[1];
        assert_eq!((s1.live_bytes, s1.peak_bytes), (100, 5000));
        assert_eq!(s1.by_memory.get(&MemoryKind::Host), Some(&100));
        let peak = t.peak.unwrap();
        assert_eq!(
            (peak.timestamp_ms, peak.live_bytes, peak.sites.len()),
            (1000, 2100, SITES_AT_PEAK)
        );
        // A site's bytes in `sites` are its most at one sample.
        let one = t.sites.iter().position(|g| g.api == "site1").unwrap();
        assert_eq!(t.sites[one].bytes, 100);
    }

    /// A week of samples every 100 ms stays bounded, in time order, with
    /// the highest sample and the newest one kept, and a few MB of JSON.
    #[test]
    fn a_week_of_samples_stays_bounded() {
        let mut h = SiteHistory::new(DEFAULT_PERIOD);
        let week = 7 * 24 * 3600 * 10u64;
        let spike = week / 3;
        for i in 0..week {
            let bytes = if i == spike { 1 << 40 } else { 1 + i % 1000 };
            let live: Vec<_> = (0..12u32)
                .map(|s| (TraceId(s + 1), bytes + s as u64, 1, MemoryKind::Device))
                .collect();
            h.record(i as i64 * 100, 0, &live);
            assert!(h.len() <= MAX_SAMPLES);
        }
        let t = h.to_report(|id| Some(site(id.0)));
        assert_eq!(t.samples_taken, week);
        assert!(t
            .samples
            .windows(2)
            .all(|w| w[0].timestamp_ms < w[1].timestamp_ms));
        assert_eq!(t.samples.last().unwrap().timestamp_ms, (week as i64 - 1) * 100);
        assert!(
            t.samples.iter().any(|s| s.sites[0].1 >= 1 << 40),
            "the spike was merged away"
        );
        assert_eq!(t.peak.as_ref().unwrap().timestamp_ms, spike as i64 * 100);
        let json = serde_json::to_vec(&t).unwrap();
        assert!(json.len() < 4 << 20, "{} bytes", json.len());
    }
}

#[cfg(test)]
mod series_tests {
    use super::*;

    fn site(i: u32) -> Group {
        let mut g = Group::new(0, 0, "cudaMalloc", MemoryKind::Device, Vec::new(), Vec::new());
        g.api = format!("site{i}");
        g
    }

    /// Every site's series is kept, not only each sample's
    /// largest 8; a site that grows late is whole, and the series stay in
    /// step with the samples when they are thinned.
    #[test]
    fn a_report_writes_the_series_a_page_can_choose_from() {
        // 1000 sites of 10 bytes, one burst site that is gone at the end,
        // one that grows late: the report writes at most 4 x 64 series,
        // with the late grower and the burst among them.
        let mut h = SiteHistory::new(DEFAULT_PERIOD);
        for i in 0..100u64 {
            let mut live: Vec<_> = (1..=1000u32)
                .map(|s| (TraceId(s), 10, 1, MemoryKind::Device))
                .collect();
            if (40..50).contains(&i) {
                live.push((TraceId(5000), 1 << 20, 1, MemoryKind::Device));
            }
            if i >= 80 {
                live.push((TraceId(6000), (i - 79) * 100, 1, MemoryKind::Device));
            }
            h.record(i as i64, 0, &live);
        }
        let t = h.to_report(|id| Some(site(id.0)));
        assert!(t.series.len() <= 4 * SERIES_PER_CHOICE, "{}", t.series.len());
        assert_eq!(t.series.len() as u64 + t.series_dropped, 1002);
        for name in ["site5000", "site6000"] {
            assert!(
                t.series.iter().any(|s| t.sites[s.site as usize].api == name),
                "{name} is written"
            );
        }
        assert!(t.sites.len() < 1002 / 2, "sites named: {}", t.sites.len());
    }

    #[test]
    fn every_site_keeps_its_series_through_thinning() {
        let mut h = SiteHistory::new(DEFAULT_PERIOD);
        let n = 3 * MAX_SAMPLES as u64;
        for i in 0..n {
            // 40 steady sites of 1000 bytes; site 99 starts at the last
            // third and grows by 1 byte a sample: never among the 8
            // largest until it passes 1000.
            let mut live: Vec<_> = (1..=40u32)
                .map(|s| (TraceId(s), 1000, 1, MemoryKind::Device))
                .collect();
            if i >= 2 * MAX_SAMPLES as u64 {
                live.push((TraceId(99), i - 2 * MAX_SAMPLES as u64 + 1, 1, MemoryKind::Device));
            }
            h.record(i as i64, 0, &live);
        }
        let t = h.to_report(|id| Some(site(id.0)));
        assert_eq!(t.series.len(), 41);
        assert_eq!(t.series_dropped, 0);
        for s in &t.series {
            assert!(s.start as usize + s.values.len() <= t.samples.len());
        }
        let late = t
            .series
            .iter()
            .find(|s| t.sites[s.site as usize].api == "site99")
            .unwrap();
        // Its last value is its value at the last sample.
        assert_eq!(late.start as usize + late.values.len(), t.samples.len());
        assert_eq!(*late.values.last().unwrap(), MAX_SAMPLES as u64);
        assert!(late.values.windows(2).all(|w| w[0] <= w[1]));
        // Every sample's sites sum to its live bytes.
        for (k, sample) in t.samples.iter().enumerate() {
            let sum: u64 = t
                .series
                .iter()
                .filter(|s| (s.start as usize..s.start as usize + s.values.len()).contains(&k))
                .map(|s| s.values[k - s.start as usize])
                .sum();
            assert_eq!(sum, sample.live_bytes, "sample {k}");
        }
    }

    /// Many sites: the values held stay under the bound, the largest
    /// sites keep their series, the dropped ones are counted.
    #[test]
    fn series_memory_is_bounded() {
        let mut h = SiteHistory::new(DEFAULT_PERIOD);
        for i in 0..400i64 {
            let live: Vec<_> = (1..=20_000u32)
                .map(|s| (TraceId(s), s as u64, 1, MemoryKind::Device))
                .collect();
            h.record(i, 0, &live);
            assert!(h.cells <= SERIES_CELLS, "{} cells", h.cells);
        }
        let t = h.to_report(|id| Some(site(id.0)));
        assert!(t.series_dropped > 0);
        assert_eq!(t.series.len() as u64 + t.series_dropped, 20_000);
        assert_eq!(t.sites[t.series[0].site as usize].api, "site20000");
    }
}
