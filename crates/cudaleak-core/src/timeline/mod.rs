//! Memory over time. Bottom up:
//!
//! 1. the sampled timeline, a timeline as text: `site_timeline`, `render`
//!
//! This file: the compact timeline kept next to the reports with
//! `CUDALEAK_INTERVAL`: time, live bytes and blocks per memory kind, and peak, one point per
//! dump. It stays bounded however long the job runs: past [`MAX_POINTS`]
//! the older half is thinned to every other point, keeping the higher of
//! each pair so that peaks survive. Recent history stays at full
//! resolution, older history at progressively coarser steps.

pub mod render;
pub mod site_timeline;

use crate::record::MemoryKind;
use crate::report::{KindTotals, Report};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const MAX_POINTS: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub timestamp_ms: i64,
    pub sequence: u64,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub peak_bytes: u64,
    pub by_memory: BTreeMap<MemoryKind, KindTotals>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    pub format: String,
    pub version: u32,
    /// dumps recorded in all, including points thinned away
    pub dumps: u64,
    pub points: Vec<Point>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            format: "cudaleak-timeline".into(),
            version: 1,
            dumps: 0,
            points: Vec::new(),
        }
    }
}

/// The `format` of a timeline file.
pub const TIMELINE_FORMAT: &str = "cudaleak-timeline";

impl Timeline {
    /// Reads a timeline file's text: `cudaleak report X.timeline.json`
    /// renders it (it was refused as "not a cudaleak report").
    pub fn parse(text: &str) -> Result<Timeline, String> {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("not a JSON timeline (truncated or corrupt?): {e}"))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(TIMELINE_FORMAT) {
            return Err("not a cudaleak timeline (no \"format\": \"cudaleak-timeline\")".into());
        }
        match v.get("version").and_then(|v| v.as_u64()) {
            Some(1) => {}
            Some(n) => {
                return Err(format!(
                    "timeline version {n} is not understood by this cudaleak (version 1)"
                ))
            }
            None => return Err("malformed timeline: missing or bad \"version\"".into()),
        }
        serde_json::from_value(v).map_err(|e| format!("malformed timeline: {e}"))
    }

    pub fn record(&mut self, r: &Report) {
        self.push(Point {
            timestamp_ms: r.timestamp_ms,
            sequence: r.sequence,
            live_bytes: r.totals.live_bytes,
            live_blocks: r.totals.live_blocks,
            peak_bytes: r.totals.peak_bytes,
            by_memory: r.totals.by_memory.clone(),
        });
    }

    pub fn push(&mut self, p: Point) {
        self.dumps += 1;
        self.points.push(p);
        if self.points.len() > MAX_POINTS {
            let half = self.points.len() / 2;
            let recent = self.points.split_off(half);
            let mut thinned: Vec<Point> = Vec::with_capacity(MAX_POINTS);
            let mut old = std::mem::take(&mut self.points).into_iter();
            while let Some(a) = old.next() {
                match old.next() {
                    Some(b) if b.live_bytes > a.live_bytes => thinned.push(b),
                    Some(_) | None => thinned.push(a),
                }
            }
            thinned.extend(recent);
            self.points = thinned;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(i: u64, bytes: u64) -> Point {
        Point {
            timestamp_ms: i as i64 * 1000,
            sequence: i,
            live_bytes: bytes,
            live_blocks: 1,
            peak_bytes: bytes,
            by_memory: BTreeMap::new(),
        }
    }

    #[test]
    fn a_written_timeline_reads_back() {
        let mut t = Timeline::default();
        t.push(point(1, 10));
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(Timeline::parse(&text).unwrap(), t);
        assert!(Timeline::parse("{\"format\":\"cudaleak\"}").is_err());
    }

    /// A week of one-second dumps stays under the bound, keeps the newest
    /// point exactly, keeps time order, and keeps the highest peak.
    #[test]
    fn a_week_of_points_stays_bounded() {
        let mut t = Timeline::default();
        let week = 7 * 24 * 3600u64;
        for i in 1..=week {
            let bytes = if i == 1234 { u64::MAX / 2 } else { i };
            t.push(point(i, bytes));
            assert!(t.points.len() <= MAX_POINTS);
        }
        assert_eq!(t.dumps, week);
        assert_eq!(t.points.last().unwrap().sequence, week);
        assert!(t.points.windows(2).all(|w| w[0].timestamp_ms < w[1].timestamp_ms));
        assert!(
            t.points.iter().any(|p| p.live_bytes == u64::MAX / 2),
            "peak thinned away"
        );
        let encoded = serde_json::to_vec(&t).unwrap();
        assert!(encoded.len() < 256 * 1024, "{} bytes", encoded.len());
    }
}
