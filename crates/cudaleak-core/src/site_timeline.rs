//! The sampled timeline (`CUDALEAK_TIMELINE`): every period (100 ms by
//! default) the dumper thread reads the per-call-site counters
//! ([`crate::site_counters`]) and keeps the totals, the live bytes by
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

use crate::record::{MemoryKind, TraceId};
use crate::report::{Group, SampledTimeline, TimelineSample};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);
pub const MIN_PERIOD: Duration = Duration::from_millis(10);
pub const MAX_SAMPLES: usize = 2048;
pub const SITES_PER_SAMPLE: usize = 8;
pub const SITES_AT_PEAK: usize = 16;

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

#[derive(Debug)]
pub struct SiteHistory {
    period: Duration,
    samples: Vec<Raw>,
    taken: u64,
    peak: Option<Raw>,
}

impl SiteHistory {
    pub fn new(period: Duration) -> SiteHistory {
        SiteHistory {
            period,
            samples: Vec::new(),
            taken: 0,
            peak: None,
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
        sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0 .0.cmp(&b.0 .0)));
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
        self.samples.push(sample);
        if self.samples.len() > MAX_SAMPLES {
            let half = self.samples.len() / 2;
            let recent = self.samples.split_off(half);
            let mut merged = Vec::with_capacity(MAX_SAMPLES);
            let mut old = std::mem::take(&mut self.samples).into_iter();
            while let Some(a) = old.next() {
                match old.next() {
                    Some(b) if b.live_bytes > a.live_bytes => merged.push(b),
                    Some(_) | None => merged.push(a),
                }
            }
            merged.extend(recent);
            self.samples = merged;
        }
    }

    /// The timeline for a report: the call sites named by `name` (a group
    /// with no counts; `None` leaves the site out and its bytes in "other").
    pub fn to_report(&self, mut name: impl FnMut(TraceId) -> Option<Group>) -> SampledTimeline {
        let mut index: HashMap<TraceId, Option<u32>> = HashMap::new();
        let mut sites: Vec<Group> = Vec::new();
        let mut convert = |raw: &Raw| -> TimelineSample {
            let mut out_sites = Vec::with_capacity(raw.sites.len());
            let mut other = raw.other_bytes;
            for &(trace, bytes) in &raw.sites {
                let slot = *index.entry(trace).or_insert_with(|| {
                    name(trace).map(|g| {
                        sites.push(g);
                        (sites.len() - 1) as u32
                    })
                });
                match slot {
                    Some(i) => {
                        let g = &mut sites[i as usize];
                        g.bytes = g.bytes.max(bytes);
                        out_sites.push((i, bytes));
                    }
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
        SampledTimeline {
            period_ms: self.period.as_millis() as u64,
            samples_taken: self.taken,
            sites,
            samples,
            peak,
        }
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
