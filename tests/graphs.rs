//! CUDA graph memory on the simulated driver: a memory-alloc node's block
//! is recorded when a launch runs the node, with the stack of the call
//! that added it (or of the stream-ordered allocation a capture turned
//! into the node), and freed by a free node, a free call, or an
//! `AUTO_FREE_ON_LAUNCH` relaunch (`state/graphs.rs`).

mod support;

use cudaleak_core::record::MemoryKind;
use cudaleak_core::report::Report;
use support::*;

const MIB: u64 = 1 << 20;
const FILE: &str = "tests/c/graphs.c";

/// `graphs MODE` without and under the library: both succeed; the report.
fn run(mode: &str) -> Report {
    let (out, plain) = run_traced_and_untraced(&program("graphs"), &[mode], &[]);
    plain.assert_success();
    out.assert_success();
    assert_eq!(out.stdout, plain.stdout);
    out.report()
}

/// The one leak of `r`: (blocks, bytes, api, precise kind) at `function`'s
/// marked line.
fn the_leak(r: &Report, function: &str, marker: &str) -> (u64, u64, String, MemoryKind) {
    assert_eq!(r.leaks.len(), 1, "{:#?}", r.leaks);
    let g = group_at(r, function, "graphs.c", line_of(FILE, marker));
    (g.blocks, g.bytes, g.api.clone(), g.kind())
}

#[test]
fn an_alloc_node_freed_by_its_free_node_leaves_nothing() {
    let r = run("paired");
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    // Two launches, each allocating and freeing 2 MiB.
    assert_eq!((r.totals.allocations, r.totals.frees), (2, 2));
    assert_eq!(r.totals.peak_bytes, 2 * MIB, "held while the graph ran");
    assert_eq!(r.totals.invalid_frees, 0);
}

#[test]
fn an_alloc_node_freed_outside_the_graph_leaves_nothing() {
    let r = run("freed_outside");
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!((r.totals.allocations, r.totals.frees), (1, 1));
    assert_eq!(r.totals.invalid_frees, 0);
}

#[test]
fn an_alloc_node_never_freed_is_a_leak_at_the_line_that_added_it() {
    let r = run("leak");
    assert_eq!(
        the_leak(&r, "add_leaking_node", "/* LEAK node */"),
        (1, 3 * MIB, "cudaGraphAddMemAllocNode".into(), MemoryKind::Graph)
    );
    let g = &r.leaks[0];
    assert_eq!(g.memory, MemoryKind::Device, "graph memory is device memory");
    assert_eq!(r.totals.live_bytes, 3 * MIB);
}

#[test]
fn a_trim_gives_back_nothing_the_program_holds() {
    let r = run("trim");
    assert_eq!(
        the_leak(&r, "add_leaking_node", "/* LEAK node */"),
        (1, 3 * MIB, "cudaGraphAddMemAllocNode".into(), MemoryKind::Graph)
    );
    assert_eq!((r.totals.allocations, r.totals.frees), (2, 1));
}

#[test]
fn a_stream_ordered_allocation_during_capture_is_allocated_at_launch() {
    let r = run("capture");
    assert_eq!(
        the_leak(&r, "captured_alloc", "/* LEAK capture */"),
        (1, 5 * MIB, "cudaMallocAsync".into(), MemoryKind::Graph)
    );
    assert_eq!((r.totals.allocations, r.totals.frees), (1, 0));
}

#[test]
fn a_captured_allocation_freed_in_the_capture_leaves_nothing() {
    let r = run("capture_freed");
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!((r.totals.allocations, r.totals.frees), (1, 1));
    assert_eq!(r.totals.invalid_frees, 0);
}

#[test]
fn a_captured_graph_never_launched_allocated_nothing() {
    let r = run("never_launched");
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!((r.totals.allocations, r.totals.peak_bytes), (0, 0));
}

#[test]
fn cu_graph_add_node_with_an_alloc_node_is_recorded_too() {
    let r = run("generic");
    assert_eq!(
        the_leak(&r, "generic_alloc_node", "/* LEAK generic */"),
        (1, 6 * MIB, "cuGraphAddNode".into(), MemoryKind::Graph)
    );
}

#[test]
fn cu_graph_add_node_v2_s_alloc_and_free_nodes_are_followed() {
    let r = run("generic_v2");
    assert_eq!(
        the_leak(&r, "add_node_v2", "/* LEAK generic_v2 */"),
        (1, 7 * MIB, "cuGraphAddNode_v2".into(), MemoryKind::Graph)
    );
    assert_eq!((r.totals.allocations, r.totals.frees), (2, 1));
    assert_eq!(r.totals.peak_bytes, 9 * MIB);
}

#[test]
fn a_free_node_frees_memory_allocated_outside_the_graph_when_the_graph_runs() {
    let r = run("outside_free");
    assert!(r.leaks.is_empty(), "{:#?}", r.leaks);
    assert_eq!((r.totals.allocations, r.totals.frees), (1, 1));
    assert_eq!(r.totals.invalid_frees, 0);
}

#[test]
fn a_relaunch_that_fails_records_nothing_more() {
    let r = run("relaunch");
    assert_eq!(
        the_leak(&r, "add_leaking_node", "/* LEAK node */"),
        (1, 3 * MIB, "cudaGraphAddMemAllocNode".into(), MemoryKind::Graph)
    );
    assert_eq!((r.totals.allocations, r.totals.frees), (1, 0));
}

#[test]
fn auto_free_on_launch_frees_the_last_launch_s_block() {
    let r = run("auto_free");
    assert_eq!(
        the_leak(&r, "add_leaking_node", "/* LEAK node */"),
        (1, MIB, "cudaGraphAddMemAllocNode".into(), MemoryKind::Graph)
    );
    assert_eq!((r.totals.allocations, r.totals.frees), (3, 2));
    assert_eq!(r.totals.peak_bytes, MIB);
}
