//! Micro-benchmarks of the work the core does on every allocation and
//! release: the live-map insert/remove pair, the stack-depot lookup, and the
//! live and peak bytes bookkeeping with its per-call-site counters.
//! They were used to tune those two structures; the end-to-end figures and
//! the goals live in `scripts/bench.py` and docs/performance.md.
//!
//!     cargo bench -p cudaleak-core --bench hot_paths
//!
//! Stack capture itself (the unwinder) lives in the preload cdylib, whose
//! exported `dlsym` and CUDA symbols would interpose on a bench binary that
//! linked it; it is measured end to end instead (stacks on vs
//! `CUDALEAK_STACK_DEPTH=0` in scripts/bench.py).

use cudaleak_core::base::tid_lock::gettid;
use cudaleak_core::record::depot::{Depot, TraceKey};
use cudaleak_core::record::live_map::{Caller, Flight, LiveMap};
use cudaleak_core::record::python::PyRawFrame;
use cudaleak_core::record::site_counters::SiteCounters;
use cudaleak_core::record::{Api, Block, MemoryKind, TraceId};
use std::sync::atomic::{AtomicU64, Ordering};

fn main() {
    divan::main();
}

/// One allocation and its release, at an address spaced like a device
/// allocator's (256-byte aligned) and distinct per call, so that threads
/// never collide on a key.
fn alloc_free_pair(map: &LiveMap, counter: &AtomicU64) -> Option<Block> {
    thread_local! {
        static FLIGHT: Flight = const { Flight::new() };
        static TID: u32 = gettid();
    }
    let key = 0x7f00_0000_0000 + counter.fetch_add(1, Ordering::Relaxed) * 256;
    FLIGHT.with(|flight| {
        let me = Caller {
            tid: TID.with(|t| *t),
            flight,
        };
        map.insert(
            me,
            key,
            Block::new(256, TraceId(2), MemoryKind::Device, 1, Some(0), 0),
        );
        map.remove(me, divan::black_box(key))
    })
}

/// One allocation and its release, with `live` other blocks in the map.
#[divan::bench(args = [0, 100_000, 1_000_000], threads = [1])]
fn live_map_pair(bencher: divan::Bencher, live: u64) {
    let map = Box::new(LiveMap::new());
    let flight = Flight::new();
    let me = Caller {
        tid: gettid(),
        flight: &flight,
    };
    for i in 0..live {
        map.insert(
            me,
            0x1000_0000_0000 + i * 4096,
            Block::new(4096, TraceId(1), MemoryKind::Device, 1, Some(0), 0),
        );
    }
    let counter = AtomicU64::new(0);
    bencher.bench(|| alloc_free_pair(&map, &counter));
}

/// The same pair from several threads at once: shard contention. (The
/// development machine has 2 CPUs; more threads time-share.)
#[divan::bench(threads = [1, 2, 4, 8])]
fn live_map_pair_threads(bencher: divan::Bencher) {
    static MAP: LiveMap = LiveMap::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    bencher.bench(|| alloc_free_pair(&MAP, &COUNTER));
}

/// The process's live and peak bytes, as `tracker.rs` keeps them.
struct Bytes {
    live: AtomicU64,
    peak: AtomicU64,
}

/// What an allocation and its release of 256 bytes cost the byte counts
/// without the per-call-site counters (the library before every report
/// carried the peak, with the timeline off): a locked add each, a compare with the peak.
#[divan::bench]
fn bytes_pair_without_sites(bencher: divan::Bencher) {
    let b = Bytes {
        live: AtomicU64::new(1 << 20),
        peak: AtomicU64::new(2 << 20),
    };
    bencher.bench(|| {
        let now = b.live.fetch_add(256, Ordering::Relaxed) + 256;
        if now > b.peak.load(Ordering::Relaxed) {
            b.peak.fetch_max(now, Ordering::Relaxed);
        }
        b.live.fetch_sub(divan::black_box(256), Ordering::Relaxed);
    });
}

/// The same with the call site's counters and the peak's lazy snapshot
/// (`site_counters.rs`), as `tracker::add_bytes`/`sub_bytes` do them: the
/// difference from the benchmark above is what the peak costs an
/// alloc/free pair (budget: 5 ns; docs/decisions.md, "Every report carries
/// the peak, for about 5 ns a pair").
#[divan::bench]
fn bytes_pair_with_sites(bencher: divan::Bencher) {
    let b = Bytes {
        live: AtomicU64::new(1 << 20),
        peak: AtomicU64::new(2 << 20),
    };
    let sites = Box::new(SiteCounters::new());
    let trace = TraceId(3);
    sites.add(trace, 1 << 20, 0);
    bencher.bench(|| {
        let peak = b.peak.load(Ordering::Relaxed);
        sites.add(divan::black_box(trace), 256, peak);
        let now = b.live.fetch_add(256, Ordering::Relaxed) + 256;
        if now > peak {
            b.peak.fetch_max(now, Ordering::Relaxed);
        }
        sites.sub(divan::black_box(trace), 256, b.peak.load(Ordering::Relaxed));
        b.live.fetch_sub(divan::black_box(256), Ordering::Relaxed);
    });
}

fn native_stack(depth: usize, salt: u64) -> Vec<u64> {
    (0..depth as u64)
        .map(|i| 0x5555_0000_1000 + i * 0x1f3 + salt * 0x10_0000)
        .collect()
}

fn python_stack(depth: usize) -> Vec<PyRawFrame> {
    (0..depth as u64)
        .map(|i| PyRawFrame {
            code: 0x7f12_0000_0000 + i * 0x200,
            guard: i * 7 + 1,
            offset: 40,
            flags: 0,
        })
        .collect()
}

/// Interning a stack that is already stored: what every allocation from a
/// known place pays when the unwinder could not reuse the previous trace.
#[divan::bench(args = [(20, 0), (60, 0), (20, 20)])]
fn depot_lookup_hit(bencher: divan::Bencher, (native_depth, python_depth): (usize, usize)) {
    let depot = Box::new(Depot::new());
    // 1024 other stacks, so the lookup walks real buckets.
    for salt in 1..=1024 {
        let native = native_stack(native_depth, salt);
        depot.intern(
            &TraceKey {
                api: Api::cudaMalloc,
                kind: MemoryKind::Device,
                native: &native,
                python: &[],
            },
            |_| {},
        );
    }
    let native = native_stack(native_depth, 0);
    let python = python_stack(python_depth);
    let key = TraceKey {
        api: Api::cudaMalloc,
        kind: MemoryKind::Device,
        native: &native,
        python: &python,
    };
    let id = depot.intern(&key, |_| {});
    bencher.bench(|| {
        let found = depot.intern(divan::black_box(&key), |_| {});
        assert_eq!(found, id);
        found
    });
}

/// Storing a new stack (first allocation from a new place): hash, insert
/// lock, two small boxes.
#[divan::bench(args = [20, 60])]
fn depot_insert_new(bencher: divan::Bencher, native_depth: usize) {
    let depot = Box::new(Depot::new());
    let mut salt = 0u64;
    bencher
        .with_inputs(|| {
            salt += 1;
            native_stack(native_depth, salt)
        })
        .bench_local_refs(|native| {
            depot.intern(
                &TraceKey {
                    api: Api::cudaMalloc,
                    kind: MemoryKind::Device,
                    native,
                    python: &[],
                },
                |_| {},
            )
        });
}
