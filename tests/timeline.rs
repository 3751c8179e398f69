//! The sampled timeline (`CUDALEAK_TIMELINE`): per-call-site
//! counters read by the dumper thread, carried by every report. The demo
//! program (sim/demo.c) holds 64 MiB of weights, 4 MiB of pinned memory
//! and a 1 MiB scratch buffer more at each of its three steps.

mod support;

use cudaleak_core::record::MemoryKind;
use cudaleak_core::report::{Report, SampledTimeline};
use std::time::Duration;
use support::{cli_command, run_command, run_traced, sim_dir, TempDir};

const MIB: u64 = 1 << 20;

fn site_bytes(t: &SampledTimeline, function: &str, sample: usize) -> Option<u64> {
    let s = &t.samples[sample];
    s.sites.iter().find_map(|&(i, bytes)| {
        let g = &t.sites[i as usize];
        g.native_stack
            .iter()
            .any(|f| f.function.as_deref() == Some(function))
            .then_some(bytes)
    })
}

fn check_demo_timeline(r: &Report) {
    let t = r.timeline.as_ref().expect("a timeline in the report");
    assert!(t.samples.len() >= 3, "{} samples", t.samples.len());
    assert_eq!(t.period_ms, 20);
    // The last sample is taken as the report is written: the leaks, by site.
    let last = t.samples.len() - 1;
    let s = &t.samples[last];
    assert_eq!(s.live_bytes, 74_448_896);
    assert_eq!(s.live_blocks, 5);
    assert_eq!(s.by_memory.get(&MemoryKind::Host), Some(&(4 * MIB)));
    assert_eq!(s.by_memory.get(&MemoryKind::Device), Some(&(67 * MIB)));
    assert_eq!(site_bytes(t, "load_weights", last), Some(64 * MIB));
    assert_eq!(site_bytes(t, "make_scratch", last), Some(3 * MIB));
    assert_eq!(site_bytes(t, "pinned_staging", last), Some(4 * MIB));
    assert_eq!(s.other_bytes, 0);
    // The scratch leak grows over the run: some earlier sample saw less.
    assert!(
        (0..last).any(|i| site_bytes(t, "make_scratch", i).unwrap_or(0) < 3 * MIB),
        "no growth seen"
    );
    // The peak carries its call sites, the weights first.
    let peak = t.peak.as_ref().expect("a peak sample");
    assert_eq!(
        peak.live_bytes,
        t.samples.iter().map(|s| s.live_bytes).max().unwrap()
    );
    let top = &t.sites[peak.sites[0].0 as usize];
    assert_eq!(top.native_stack[0].function.as_deref(), Some("load_weights"));
    assert_eq!(peak.sites[0].1, 64 * MIB);
    assert!(
        s.peak_bytes >= 79 * MIB,
        "the process peak counts the 8 MiB activations"
    );
}

#[test]
fn reports_carry_the_sampled_timeline_by_call_site() {
    let out = run_traced(&sim_dir().join("demo"), &[], &[("CUDALEAK_TIMELINE", "20ms")]);
    out.assert_success();
    check_demo_timeline(&out.report());
}

#[test]
fn no_timeline_unless_asked() {
    let out = run_traced(&sim_dir().join("demo"), &[], &[]);
    out.assert_success();
    assert!(out.report().timeline.is_none());
}

#[test]
fn a_bad_period_warns_once_and_samples_nothing() {
    let out = run_traced(&sim_dir().join("demo"), &[], &[("CUDALEAK_TIMELINE", "fast")]);
    out.assert_success();
    assert_eq!(
        out.stderr.matches("ignoring CUDALEAK_TIMELINE=\"fast\"").count(),
        1,
        "{}",
        out.stderr
    );
    assert!(out.report().timeline.is_none());
}

#[test]
fn cudaleak_run_turns_the_timeline_on() {
    let dir = TempDir::new("timeline-run");
    let demo = sim_dir().join("demo");
    let mut cmd = cli_command(
        &[
            "run",
            "--dir",
            &dir.path().display().to_string(),
            "--",
            &demo.display().to_string(),
        ],
        dir.path(),
    );
    cmd.env_remove("CUDALEAK_TIMELINE");
    let (status, _, stderr) = run_command(cmd, Duration::from_secs(60));
    assert!(status.success(), "{stderr}");
    let reports = support::reports_in(dir.path());
    assert_eq!(reports.len(), 1);
    let t = reports[0].timeline.as_ref().expect("on by default under run");
    assert_eq!(t.period_ms, 100);
    assert_eq!(t.samples.last().unwrap().live_bytes, 74_448_896);
}
