//! Benchmark for docs/performance.md (a measurement, not a test: as an
//! ignored test it asserted nothing and never ran; docs/decisions.md, "A
//! test can fail, or it is not a test"): the heap a dump of
//! many distinct leaked stacks needs beyond what the process already holds.
//!
//! `cargo bench -p cudaleak-core --bench dump_memory`
//!
//! The stacks are those of `tests/c/reliability.c`'s `stacks 17` mode:
//! 2^17 paths through two recursive functions, 17 branch frames plus the
//! leaking function and the program's outer frames, each path one leaked
//! block. Frames carry strings as long as the real symbolizer's (paths,
//! build-ids).

use cudaleak_core::assemble::{Assembler, DumpMeta, GrowthTracker, Snapshot};
use cudaleak_core::record::depot::{Depot, TraceKey};
use cudaleak_core::record::python::CodeTable;
use cudaleak_core::record::{Api, Block, MemoryKind};
use cudaleak_core::report::suppress::Suppressions;
use cudaleak_core::report::{NativeFrame, Trigger};
use cudaleak_core::symbolize::{hex, SymbolSource};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counters are atomics
// and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is: the caller's `layout` meets `alloc`'s
        // contract (non-zero size) for `System` as for us.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is: `ptr` came from `System.alloc` (through
        // `alloc` above) with this same `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `reliability.c`'s frames look like to the real symbolizer.
struct Program;

impl SymbolSource for Program {
    fn symbolize(&mut self, ra: u64) -> Vec<NativeFrame> {
        let function = match ra & 0xf00 {
            0x100 => "branch_a",
            0x200 => "branch_b",
            0x300 => "branch",
            0x400 => "leak_at",
            _ => "main",
        };
        vec![NativeFrame {
            address: hex(ra - 1),
            function: Some(function.into()),
            file: Some("/work/main/tests/c/reliability.c".into()),
            line: Some((ra & 0xff) as i64),
            module: Some("/work/wt/dumpmem/target/release/cudaleak-tests/reliability".into()),
            offset: Some(hex((ra - 1) & 0xffff)),
            build_id: Some("a0c3487435dc89cc41c367a088ca6641204fcef8".into()),
        }]
    }
}

fn meta(sequence: u64) -> DumpMeta {
    DumpMeta {
        trigger: Trigger::Exit,
        sequence,
        pid: 1,
        ppid: None,
        command: vec![],
        hostname: None,
        rank: None,
        instance: None,
        timestamp_ms: 0,
        reason: None,
        exit_status: None,
        signal: None,
        python: None,
    }
}

fn main() {
    const BITS: u32 = 17;
    let depot = Box::new(Depot::new());
    let codes = CodeTable::new();
    let mut blocks = Vec::new();
    for path in 0..1u64 << BITS {
        // leak_at, then per level: branch, and branch_a or branch_b
        // below it; then the outer frames.
        let mut native = vec![0x1_0401];
        for level in 0..BITS {
            native.push(0x1_0311);
            native.push(if path >> level & 1 == 1 {
                0x1_0121
            } else {
                0x1_0221
            });
        }
        native.extend([0x1_0331, 0x1_0541, 0x1_0551]);
        let key = TraceKey {
            api: Api::cudaMalloc,
            kind: MemoryKind::Device,
            native: &native,
            python: &[],
        };
        let id = depot.intern(&key, |_| {});
        blocks.push((
            0x7f00_0000_0000 + path * 512,
            Block::new(1, id, MemoryKind::Device, 0, Some(0), 0),
        ));
    }
    let snap = Snapshot {
        blocks,
        allocations: 1 << BITS,
        ..Default::default()
    };
    let stacks = (1u64 << BITS) as f64;
    println!(
        "{} distinct leaked stacks of {} frames",
        1u64 << BITS,
        2 * BITS + 4
    );
    for max in [1000, usize::MAX] {
        let mut growth = GrowthTracker::default();
        for dump in 1..=2 {
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            let report = Assembler {
                depot: &depot,
                codes: &codes,
                symbols: &mut Program,
                suppressions: &Suppressions::default(),
                growth: &mut growth,
            }
            .assemble_at_most(&snap, meta(dump), max);
            let peak = PEAK.load(Ordering::Relaxed) - before;
            let kept = LIVE.load(Ordering::Relaxed) - before;
            let report_bytes = {
                let with_report = LIVE.load(Ordering::Relaxed);
                drop(report);
                with_report - LIVE.load(Ordering::Relaxed)
            };
            let history = kept - report_bytes;
            println!(
                "cap {max}, dump {dump}: peak {:.1} MiB ({:.0} B per stack), report {:.1} MiB, growth history kept {:.1} MiB ({:.0} B per stack)",
                peak as f64 / 1048576.0,
                peak as f64 / stacks,
                report_bytes as f64 / 1048576.0,
                history as f64 / 1048576.0,
                history as f64 / stacks,
            );
        }
    }
}
