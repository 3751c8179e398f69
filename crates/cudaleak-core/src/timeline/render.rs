//! A timeline as text (`cudaleak report X.timeline.json`): a file the
//! library writes that no command showed. Above both the
//! timeline model and the report renderer, so neither imports the other.

use crate::base::units::{count, size, size_exact};
use crate::report::render::{escape, RULE};
use crate::timeline::{Point, Timeline};
use std::fmt::Write;

/// A timeline (`*.timeline.json`, from `CUDALEAK_INTERVAL`) as text: a
/// sparkline of live bytes over all points, a table of at most
/// `max_rows` points (the highest always among them) and the peak.
pub fn timeline_text(t: &Timeline, source: Option<&str>, max_rows: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let mut out = String::new();
    let _ = writeln!(out, "{RULE}");
    let pts = &t.points;
    let _ = writeln!(
        out,
        "cudaleak timeline: {}, {} kept",
        count(t.dumps, "dump"),
        count(pts.len() as u64, "point")
    );
    if let Some(s) = source {
        let _ = writeln!(out, "file: {}", escape(s));
    }
    let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
        let _ = writeln!(out, "no points recorded");
        return out;
    };
    let secs = |p: &Point| (p.timestamp_ms - first.timestamp_ms) as f64 / 1000.0;
    let max_live = pts.iter().map(|p| p.live_bytes).max().unwrap_or(0);
    let highest = pts
        .iter()
        .enumerate()
        .max_by_key(|(i, p)| (p.live_bytes, std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i);
    // Sparkline: at most 60 columns, each the highest point of its span.
    let columns = pts.len().min(60);
    let spark: String = (0..columns)
        .map(|c| {
            let span = &pts
                [c * pts.len() / columns..((c + 1) * pts.len() / columns).max(c * pts.len() / columns + 1)];
            let v = span.iter().map(|p| p.live_bytes).max().unwrap_or(0);
            let level = if max_live == 0 {
                0
            } else {
                ((v as u128 * 7) / max_live as u128) as usize
            };
            BARS[level.min(7)]
        })
        .collect();
    let _ = writeln!(out, "live: {spark}  (0 to {})", size(max_live));
    out.push('\n');
    let _ = writeln!(
        out,
        "  {:>10} {:>6}  {:>28} {:>10}",
        "time", "dump", "live", "blocks"
    );
    let rows = max_rows.max(2).min(pts.len());
    let mut picked: Vec<usize> = (0..rows)
        .map(|r| r * (pts.len() - 1) / (rows - 1).max(1))
        .collect();
    if !picked.contains(&highest) {
        picked.push(highest);
        picked.sort_unstable();
    }
    picked.dedup();
    for i in picked {
        let p = &pts[i];
        let width = if max_live == 0 {
            0
        } else {
            ((p.live_bytes as u128 * 20) / max_live as u128) as usize
        };
        let _ = writeln!(
            out,
            "  {:>+9.1}s {:>6}  {:>28} {:>10}  {}{}",
            secs(p),
            format!("#{}", p.sequence),
            size_exact(p.live_bytes),
            p.live_blocks,
            "#".repeat(width),
            if i == highest { "  <- highest" } else { "" }
        );
    }
    out.push('\n');
    let h = &pts[highest];
    let _ = writeln!(
        out,
        "highest live: {} at {:+.1}s (dump #{}); process peak: {}; last: {} in {} at {:+.1}s",
        size_exact(h.live_bytes),
        secs(h),
        h.sequence,
        size_exact(pts.iter().map(|p| p.peak_bytes).max().unwrap_or(0)),
        size_exact(last.live_bytes),
        count(last.live_blocks, "block"),
        secs(last)
    );
    out
}
