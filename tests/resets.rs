//! Device resets: the blocks a reset takes away stay leaks, in their
//! groups' `torn_down_blocks`, but live bytes, the peak and an
//! out-of-memory report's holders count only what the device still holds.
//! Also the runtime entry points that reach the library at the driver only
//! (`cudaThreadExit`) or by a name of their own
//! (`cudaMallocFromPoolAsync_ptsz`).

mod support;

use cudaleak_core::report::{Report, Trigger};
use support::*;

const MIB: u64 = 1 << 20;
const FILE: &str = "tests/c/resets.c";

fn before(r: &Report) -> &cudaleak_core::report::Group {
    group_at(r, "before_reset", "resets.c", line_of(FILE, "/* LEAK before */"))
}

fn after(r: &Report) -> &cudaleak_core::report::Group {
    group_at(r, "after_reset", "resets.c", line_of(FILE, "/* LEAK after */"))
}

/// 1 MiB, a reset, 1 MiB: two leaks of 1 MiB; the device held 1 MiB at
/// most, and holds 1 MiB at the end.
fn check_reset_then_allocate(mode: &str) {
    let (out, plain) = run_traced_and_untraced(&program("resets"), &[mode], &[]);
    out.assert_success();
    plain.assert_success();
    let r = out.report();
    let gone = before(&r);
    assert_eq!(
        (
            gone.blocks,
            gone.bytes,
            gone.torn_down_blocks,
            gone.torn_down_bytes
        ),
        (1, MIB, 1, MIB),
        "{mode}: the reset's block is a leak, torn down"
    );
    assert_eq!(gone.api, "cudaMalloc");
    let kept = after(&r);
    assert_eq!(
        (
            kept.blocks,
            kept.bytes,
            kept.torn_down_blocks,
            kept.torn_down_bytes
        ),
        (1, MIB, 0, 0),
        "{mode}"
    );
    assert_eq!(r.leaks.len(), 2, "{mode}: {:#?}", r.leaks);
    let t = &r.totals;
    assert_eq!(
        (t.live_blocks, t.live_bytes),
        (1, MIB),
        "{mode}: what the device holds"
    );
    assert_eq!((t.torn_down_blocks, t.torn_down_bytes), (1, MIB), "{mode}");
    assert_eq!(t.peak_bytes, MIB, "{mode}: the device never held more than 1 MiB");
    let peak = r.peak.as_ref().expect("a peak section");
    assert_eq!(peak.bytes, MIB, "{mode}");
    // Both leaks, 2 MiB, fail the gate and are in the summary.
    assert_eq!((r.leaked_blocks(), r.leaked_bytes()), (2, 2 * MIB), "{mode}");
    assert!(
        out.stderr
            .contains("    (1 block (1048576 bytes) of it went with its context (a device reset,"),
        "{mode}: the text report says which leak the device no longer holds\n{}",
        out.stderr
    );
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("cudaleak: 2097152 bytes leaked in 2 blocks")),
        "{mode}: the summary counts both\n{}",
        out.stderr
    );
}

#[test]
fn a_reset_s_blocks_are_leaks_but_not_live_bytes_or_the_peak() {
    check_reset_then_allocate("reset");
}

#[test]
fn cuda_thread_exit_is_a_reset_seen_at_the_driver() {
    check_reset_then_allocate("thread_exit");
}

#[test]
fn an_out_of_memory_report_after_a_reset_lists_only_what_the_device_holds() {
    let out = run_traced(
        &program("resets"),
        &["oom"],
        &[("SIMCUDA_DEVICE_BYTES", "33554432")],
    );
    out.assert_success();
    let reports = out.reports();
    let oom: Vec<&Report> = reports.iter().filter(|r| r.trigger == Trigger::Oom).collect();
    assert_eq!(oom.len(), 1, "{}", out.stderr);
    let r = oom[0];
    assert_eq!(r.oom.as_ref().unwrap().requested_bytes, 30 * MIB);
    assert_eq!(r.leaks.len(), 1, "only the 8 MiB after the reset: {:#?}", r.leaks);
    assert_eq!((after(r).blocks, after(r).bytes), (1, 8 * MIB));
    assert_eq!((r.totals.live_blocks, r.totals.live_bytes), (1, 8 * MIB));
    assert_eq!(r.totals.peak_bytes, 16 * MIB, "the 16 MiB before the reset");
    // The stderr lines name the holders the same way.
    let holders: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("cudaleak:   ") && l.contains(" at "))
        .collect();
    assert_eq!(holders.len(), 1, "{}", out.stderr);
    assert!(holders[0].contains("8.0 MiB in 1 block"), "{}", holders[0]);
    // The exit report keeps both leaks, the torn-down one apart.
    let exit = reports.iter().find(|r| r.trigger == Trigger::Exit).unwrap();
    assert_eq!(
        (exit.totals.torn_down_blocks, exit.totals.torn_down_bytes),
        (1, 16 * MIB)
    );
    assert_eq!(exit.totals.live_bytes, 8 * MIB);
    assert_eq!(before(exit).torn_down_bytes, 16 * MIB);
}

#[test]
fn cuda_malloc_from_pool_async_ptsz_keeps_its_own_name() {
    let (out, plain) = run_traced_and_untraced(&program("resets"), &["pool_ptsz"], &[]);
    out.assert_success();
    plain.assert_success();
    let r = out.report();
    let g = group_at(
        &r,
        "from_pool_ptsz",
        "resets.c",
        line_of(FILE, "/* LEAK pool_ptsz */"),
    );
    assert_eq!(
        (g.api.as_str(), g.blocks, g.bytes),
        ("cudaMallocFromPoolAsync_ptsz", 1, 3 * MIB)
    );
    assert_eq!(r.leaks.len(), 1);
}
