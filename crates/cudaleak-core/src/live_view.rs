//! The live view of a running process (`cudaleak top PID`): a small,
//! bounded summary that the library's own thread publishes once a second
//! while a viewer asks for it, and the viewer reads without pausing the
//! program or making it write a report. The viewer's request is a file in
//! the process's report directory, as `cudaleak dump`'s is
//! ([`view_request_name`]); the summary goes to a directory of the
//! library's own inside it, readable by the process's user only
//! ([`VIEW_DIR`]).

use crate::base::units::size;
use crate::metrics::{DeviceLive, Sample};
use crate::report::render::escape;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The directory, inside the report directory, of the views (mode 0700).
pub const VIEW_DIR: &str = ".cudaleak-view";

/// Call sites a view lists, those holding the most live bytes.
pub const VIEW_SITES: usize = 50;

/// How long a request keeps the library publishing: a viewer that stops
/// asking (quit, crashed) stops the publishing with it.
pub const VIEW_LEASE_MS: i64 = 10_000;

/// The request file of process `pid` in its report directory.
pub fn view_request_name(pid: i32) -> String {
    format!(".cudaleak-view-request.{pid}")
}

/// The view file of process `pid` in [`VIEW_DIR`].
pub fn view_file_name(pid: i32) -> String {
    format!("view.{pid}.json")
}

/// One call site in a view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewSite {
    pub site_id: String,
    /// the reports' label among the sites listed
    pub label: String,
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// its bytes when the process reached its peak
    pub peak_bytes: u64,
    /// live bytes now less at the previous publish (0 at the first)
    pub change_bytes: i64,
    /// its stack as the text report shows it, a frame a line
    #[serde(default)]
    pub stack: Vec<String>,
}

/// What one publish says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveView {
    pub pid: i64,
    pub command: Vec<String>,
    /// when it was published (Unix ms)
    pub timestamp_ms: i64,
    /// publishes since the request that started them (1: the first)
    pub sequence: u64,
    /// the process has ended: this is its last state
    pub exited: bool,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub peak_bytes: u64,
    pub failed_allocations: u64,
    pub oom_events: u64,
    /// what each device the process has held memory on holds now
    #[serde(default)]
    pub devices: Vec<DeviceLive>,
    pub sites: Vec<ViewSite>,
}

impl LiveView {
    /// The view of `now`, its changes against `previous` (the last one
    /// published, if any).
    pub fn of(
        now: &Sample,
        previous: Option<&LiveView>,
        command: Vec<String>,
        timestamp_ms: i64,
    ) -> LiveView {
        let before = |id: &str| {
            previous
                .and_then(|p| p.sites.iter().find(|s| s.site_id == id))
                .map_or(0, |s| s.live_bytes)
        };
        LiveView {
            pid: now.labels.pid,
            command,
            timestamp_ms,
            sequence: previous.map_or(1, |p| p.sequence + 1),
            exited: false,
            live_bytes: now.live_bytes,
            live_blocks: now.live_blocks,
            peak_bytes: now.peak_bytes,
            failed_allocations: now.failed_allocations,
            oom_events: now.oom_events,
            devices: now.devices.clone(),
            sites: now
                .sites
                .iter()
                .map(|s| ViewSite {
                    site_id: s.site_id.clone(),
                    label: s.label.clone(),
                    live_bytes: s.live_bytes,
                    live_blocks: s.live_blocks,
                    peak_bytes: s.peak_bytes,
                    change_bytes: if previous.is_some() {
                        s.live_bytes as i64 - before(&s.site_id) as i64
                    } else {
                        0
                    },
                    stack: s.stack.clone(),
                })
                .collect(),
        }
    }

    /// As text: a header, then one line per call site, the largest first.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cudaleak top: pid {} {}{}",
            self.pid,
            escape(&self.command.join(" ")),
            if self.exited {
                " (process exited; its last state)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "live {} in {} blocks, peak {}; {} out-of-memory events, {} failed calls",
            size(self.live_bytes),
            self.live_blocks,
            size(self.peak_bytes),
            self.oom_events,
            self.failed_allocations
        );
        let _ = writeln!(
            out,
            "{:>12} {:>8} {:>12} {:>12}  call site",
            "live", "blocks", "change", "at peak"
        );
        for s in &self.sites {
            let change = match s.change_bytes {
                0 => "0".to_string(),
                c if c > 0 => format!("+{}", size(c as u64)),
                c => format!("-{}", size(c.unsigned_abs())),
            };
            let _ = writeln!(
                out,
                "{:>12} {:>8} {:>12} {:>12}  {}",
                size(s.live_bytes),
                s.live_blocks,
                change,
                size(s.peak_bytes),
                escape(&s.label)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Labels, Site};

    fn sample(grow: u64) -> Sample {
        Sample {
            labels: Labels {
                pid: 7,
                ..Default::default()
            },
            live_bytes: grow + 5,
            live_blocks: 2,
            sites: vec![
                Site {
                    label: "cudaMalloc (device memory) at grow t.py:3".into(),
                    site_id: "a".into(),
                    live_bytes: grow,
                    live_blocks: 1,
                    peak_bytes: grow,
                    stack: vec!["in grow t.py:3 [python]".into()],
                },
                Site {
                    label: "cudaMalloc (device memory) at steady t.py:4\u{1b}[2J".into(),
                    site_id: "b".into(),
                    live_bytes: 5,
                    live_blocks: 1,
                    peak_bytes: 5,
                    stack: Vec::new(),
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn changes_against_the_previous_publish() {
        let first = LiveView::of(&sample(10), None, vec!["p".into()], 1);
        assert_eq!((first.sequence, first.sites[0].change_bytes), (1, 0));
        let second = LiveView::of(&sample(30), Some(&first), vec!["p".into()], 2);
        assert_eq!(second.sequence, 2);
        assert_eq!(second.sites[0].change_bytes, 20);
        assert_eq!(second.sites[1].change_bytes, 0);
        let text = second.text();
        assert!(text.contains("+20 bytes"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
        let round: LiveView = serde_json::from_str(&serde_json::to_string(&second).unwrap()).unwrap();
        assert_eq!(round, second);
    }
}
