use super::*;
use crate::base::tid_lock::gettid;
use crate::record::{MemoryKind, TraceId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::Arc;

/// Whether this thread is inside the allocator. The tests below run
/// signal handlers that insert into the map, which may grow a table: on
/// top of the interrupted thread's own growth (inside glibc's malloc,
/// holding its arena lock) that waits for good, as any allocating handler
/// of a real program would, with or without the library. The handlers
/// ask this flag and stand back, so that the tests fail only on the map's
/// own waits.
mod allocator_flag {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::sync::atomic::{compiler_fence, Ordering};

    thread_local! {
        static INSIDE: Cell<bool> = const { Cell::new(false) };
    }

    pub fn inside() -> bool {
        INSIDE.with(Cell::get)
    }

    fn flagged<T>(f: impl FnOnce() -> T) -> T {
        let was = INSIDE.with(|c| c.replace(true));
        // A handler on this thread reads the flag: the stores stay on
        // their side of the call (without the fences the first was
        // dropped, as nothing the compiler sees reads it).
        compiler_fence(Ordering::SeqCst);
        let r = f();
        compiler_fence(Ordering::SeqCst);
        INSIDE.with(|c| c.set(was));
        r
    }

    pub struct Flagged;

    // SAFETY: every call is System's, unchanged.
    unsafe impl GlobalAlloc for Flagged {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            flagged(|| unsafe { System.alloc(l) })
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            flagged(|| unsafe { System.alloc_zeroed(l) })
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: the caller's contract, passed on.
            flagged(|| unsafe { System.dealloc(p, l) })
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            flagged(|| unsafe { System.realloc(p, l, n) })
        }
    }

    #[global_allocator]
    static FLAGGED: Flagged = Flagged;
}

fn blk(size: u64) -> Block {
    Block::new(size, TraceId(1), MemoryKind::Device, 0, None, 0)
}

/// The calling thread, with a flight of its own for the test.
fn me(flight: &Flight) -> Caller<'_> {
    Caller {
        tid: gettid(),
        flight,
    }
}

fn never() -> bool {
    false
}

/// Every block and the summed counts, read by `reader`.
fn read_all(m: &LiveMap, reader: u32, stopped: Option<Stopped>) -> (HashMap<u64, Block>, MapCounts) {
    let mut all = HashMap::new();
    let mut counts = MapCounts::default();
    let skipped = m
        .for_each_shard(reader, stopped, Some(Duration::from_secs(5)), &never, |it, c| {
            all.extend(it);
            counts.add(c);
        })
        .unwrap();
    assert_eq!(skipped, 0);
    assert_eq!(counts.live, all.len() as u64);
    assert_eq!(
        counts.inserted - counts.removed - counts.moved,
        counts.live,
        "{counts:?}"
    );
    (all, counts)
}

#[test]
fn insert_remove_restore_keep_counts() {
    let f = Flight::new();
    let m = LiveMap::new();
    assert!(m.insert(me(&f), 0x1000, blk(10)).is_none());
    assert!(m.insert(me(&f), 0x2000, blk(20)).is_none());
    let b = m.remove(me(&f), 0x1000).unwrap();
    assert_eq!(b.size(), 10);
    assert!(m.remove(me(&f), 0x1000).is_none());
    assert!(m.remove_if(me(&f), 0x2000, |b| b.size() == 99).is_none());
    m.restore(me(&f), 0x1000, b);
    let c = m.counts(me(&f));
    assert_eq!((c.inserted, c.removed, c.live), (2, 0, 2));
    // A second insert at a live key retires the old block.
    assert_eq!(m.insert(me(&f), 0x2000, blk(30)).unwrap().size(), 20);
    let c = m.counts(me(&f));
    assert_eq!(c.inserted - c.removed - c.moved, c.live);
    assert_eq!(m.get(me(&f), 0x2000), Some(blk(30)));
}

#[test]
fn drain_moves_blocks_out() {
    let f = Flight::new();
    let m = LiveMap::new();
    for i in 0..100u64 {
        m.insert(
            me(&f),
            0x10000 + i * 512,
            Block::new(i, TraceId(1), MemoryKind::Device, (i % 2) as u8, None, 0),
        );
    }
    let drained = m.drain_where(me(&f), |b| b.context_slot() == 1);
    assert_eq!(drained.len(), 50);
    let c = m.counts(me(&f));
    assert_eq!((c.inserted, c.removed, c.moved, c.live), (100, 0, 50, 50));
}

/// Dumps taken while 8 threads allocate and free (also each other's
/// blocks) always satisfy allocations - frees == live blocks.
#[test]
fn snapshots_are_exact_under_traffic() {
    let m = Arc::new(LiveMap::new());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let m = m.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let f = Flight::new();
                let me = me(&f);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let a = (t << 40) | (i << 8);
                    m.insert(me, a, blk(i));
                    // free the previous thread's block of the same index,
                    // and its own of 64 steps ago if no one did (a thread
                    // that lags would leave the others' blocks, and the
                    // map would grow by millions)
                    let other = (((t + 7) % 8) << 40) | (i.saturating_sub(1) << 8);
                    m.remove(me, other);
                    if i >= 64 {
                        m.remove(me, (t << 40) | ((i - 64) << 8));
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for _ in 0..200 {
        let mut counts = MapCounts::default();
        let mut seen = 0u64;
        m.for_each_shard(gettid(), None, None, &never, |it, c| {
            seen += it.count() as u64;
            counts.add(c);
        })
        .unwrap();
        assert_eq!(seen, counts.live);
        assert_eq!(counts.inserted - counts.removed - counts.moved, seen);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
}

/// A key whose shard is `m`'s shard number `n`.
fn key_in_shard(m: &LiveMap, n: usize, skip: u64) -> u64 {
    let target = LiveMap::shard_address(&m.shards[n].0);
    (1u64..)
        .map(|i| (i + skip) << 12)
        .find(|k| LiveMap::shard_address(m.shard(*k)) == target)
        .unwrap()
}

/// Case 1, made by hand: a thread holds a shard and stopped at each stage
/// of a change; a reader that takes it over sees the change done (an
/// announced removal not: nothing was released yet), and waits for no
/// lock. Without the take-over the read would skip the shard.
#[test]
fn a_reader_takes_over_a_shard_whose_holder_stopped_at_any_stage() {
    const STOPPED: u32 = 0x3f_fffe; // no thread of this process
    let m = LiveMap::new();
    let f = Flight::new();
    let k = key_in_shard(&m, 5, 0);
    let kept = key_in_shard(&m, 5, 1000);
    m.insert(me(&f), kept, blk(1));
    let shard = &m.shards[5].0;
    let addr = LiveMap::shard_address(shard);
    let set = |stage: u8, present: bool, b: Block, ins: u64, rem: u64| {
        let (p, te) = b.to_words();
        f.shard.store(addr, Ordering::Relaxed);
        f.key.store(k, Ordering::Relaxed);
        f.present.store(present, Ordering::Relaxed);
        f.op.store(if present { OP_INSERT } else { OP_REMOVE }, Ordering::Relaxed);
        f.packed.store(p, Ordering::Relaxed);
        f.trace_epoch.store(te, Ordering::Relaxed);
        f.inserted.store(ins, Ordering::Relaxed);
        f.removed.store(rem, Ordering::Relaxed);
        f.stage.store(stage, Ordering::Relaxed);
    };
    shard.raw_lock(STOPPED);
    let stopped = Some(Stopped {
        tid: STOPPED,
        flight: &f,
    });
    // Announced insert: the block is in flight, and live.
    set(ANNOUNCED, true, blk(7), 0, 0);
    let (all, c) = read_all(&m, gettid(), stopped);
    assert_eq!(all.get(&k), Some(&blk(7)));
    assert_eq!((c.inserted, c.removed), (2, 0));
    // Applying an insert, stopped after the table changed, before the
    // counters did: the flight's counters are the truth.
    // SAFETY: this thread "is" the stopped holder, changing its shard.
    let s = unsafe { shard.get_shared_unchecked() };
    s.table.insert(k, blk(7)).unwrap();
    set(APPLYING, true, blk(7), 2, 0);
    let (all, c) = read_all(&m, gettid(), stopped);
    assert_eq!(all.get(&k), Some(&blk(7)));
    assert_eq!((c.inserted, c.removed), (2, 0));
    // An announced removal releases nothing yet.
    set(ANNOUNCED, false, blk(0), 0, 0);
    s.inserted.store(2, Ordering::Relaxed);
    let (all, c) = read_all(&m, gettid(), stopped);
    assert!(all.contains_key(&k));
    assert_eq!(c.live, 2);
    // Applying a removal, stopped before the table changed.
    set(APPLYING, false, blk(0), 2, 1);
    let (all, c) = read_all(&m, gettid(), stopped);
    assert!(!all.contains_key(&k));
    assert_eq!((c.inserted, c.removed, c.live), (2, 1, 1));
    // Without the take-over, a bounded read skips the held shard.
    let skipped = m
        .for_each_shard(gettid(), None, Some(Duration::from_millis(30)), &never, |_, _| {})
        .unwrap();
    assert_eq!(skipped, 1);
    // A read that is told to give up stops.
    assert!(m
        .for_each_shard(gettid(), None, None, &|| true, |_, _| {})
        .is_none());
    f.stage.store(IDLE, Ordering::Relaxed);
    // SAFETY: taken with `raw_lock` above for STOPPED.
    unsafe { shard.raw_unlock(STOPPED) };
}

// ---- case 3: a signal handler on top of the thread's own change ----

/// What the test's signal handler does, and what it saw.
static NESTED_MAP: AtomicUsize = AtomicUsize::new(0);
static NESTED_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static NESTED_KEY: AtomicU64 = AtomicU64::new(0);
static NESTED_RUNS: AtomicU32 = AtomicU32::new(0);
static NESTED_BAD: AtomicU32 = AtomicU32::new(0);
static NESTED_HELD: AtomicU32 = AtomicU32::new(0);
/// handler entries, runs or not, and the worker's finished changes: the
/// test sends the next signal once the last one was taken and the worker
/// has made a change since. Else a slow build spends all its time in
/// handlers, and more handlers land on one change than its thread has
/// slots to defer (those are counted lost, by design).
static NESTED_ENTERED: AtomicU32 = AtomicU32::new(0);
static WORKER_CHANGES: AtomicU64 = AtomicU64::new(0);

extern "C" fn nested_handler(_: libc::c_int) {
    NESTED_ENTERED.fetch_add(1, Ordering::Relaxed);
    let (m, f) = (
        NESTED_MAP.load(Ordering::Acquire),
        NESTED_FLIGHT.load(Ordering::Acquire),
    );
    if m == 0 || f == 0 || allocator_flag::inside() {
        return;
    }
    // SAFETY: set by the test to a map and a flight that outlive it.
    let (m, f) = unsafe { (&*(m as *const LiveMap), &*(f as *const Flight)) };
    let caller = Caller {
        tid: gettid(),
        flight: f,
    };
    // A read on top of any instruction of a change is exact.
    let mut counts = MapCounts::default();
    let mut seen = 0u64;
    let stopped = Some(Stopped {
        tid: caller.tid,
        flight: f,
    });
    let _ = m.for_each_shard(caller.tid, stopped, None, &never, |it, c| {
        seen += it.count() as u64;
        counts.add(c);
    });
    if seen != counts.live || counts.inserted - counts.removed - counts.moved != seen {
        NESTED_BAD.fetch_add(1, Ordering::Relaxed);
    }
    if m.shards.iter().any(|s| s.0.holder() == Some(caller.tid)) {
        NESTED_HELD.fetch_add(1, Ordering::Relaxed);
    }
    // A change, kept or deferred, never lost.
    let k = NESTED_KEY.fetch_add(1, Ordering::Relaxed);
    m.insert(caller, k, blk(k));
    NESTED_RUNS.fetch_add(1, Ordering::Relaxed);
}

/// Case 3, with real signals: a handler lands at random instructions of
/// a thread's inserts and removals, reads the map (exact, whatever it
/// interrupted) and inserts a block of its own (kept, or deferred and
/// made when the thread lets its shard go). Every one of the handler's
/// blocks is there at the end, and the counts are exact. Before, such a
/// call deadlocked on the shard its thread held, or (the sole owner's
/// section) was skipped and its block lost.
#[test]
fn a_signal_handler_on_top_of_a_change_reads_exactly_and_loses_nothing() {
    let m: &'static LiveMap = Box::leak(Box::new(LiveMap::new()));
    let f: &'static Flight = Box::leak(Box::new(Flight::new()));
    NESTED_KEY.store(1 << 50, Ordering::Relaxed);
    let sig = libc::SIGRTMIN() + 3;
    // SAFETY: installing a handler for a signal no other test uses; it
    // only touches statics and the leaked map and flight.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nested_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
    NESTED_MAP.store(m as *const LiveMap as usize, Ordering::Release);
    NESTED_FLIGHT.store(f as *const Flight as usize, Ordering::Release);
    let worker_id = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let worker = {
        let (worker_id, done) = (worker_id.clone(), done.clone());
        std::thread::spawn(move || {
            // SAFETY: pthread_self takes nothing.
            worker_id.store(unsafe { libc::pthread_self() } as usize, Ordering::Release);
            let caller = Caller {
                tid: gettid(),
                flight: f,
            };
            let start = Instant::now();
            let mut i = 0u64;
            while NESTED_RUNS.load(Ordering::Relaxed) < 2_000 && start.elapsed() < Duration::from_secs(20) {
                let k = (i % 64 + 1) << 12;
                m.insert(caller, k, blk(i));
                m.remove(caller, (i.wrapping_sub(7) % 64 + 1) << 12);
                i += 1;
                WORKER_CHANGES.store(i, Ordering::Release);
            }
            done.store(true, Ordering::Release);
        })
    };
    while worker_id.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    while !done.load(Ordering::Acquire) {
        let entered = NESTED_ENTERED.load(Ordering::Relaxed);
        // SAFETY: signalling a live thread of this process.
        unsafe { libc::pthread_kill(worker_id.load(Ordering::Acquire) as libc::pthread_t, sig) };
        let sent = Instant::now();
        while NESTED_ENTERED.load(Ordering::Relaxed) == entered
            && !done.load(Ordering::Acquire)
            && sent.elapsed() < Duration::from_secs(1)
        {
            std::thread::yield_now();
        }
        let changes = WORKER_CHANGES.load(Ordering::Acquire);
        while WORKER_CHANGES.load(Ordering::Acquire) < changes + 2
            && !done.load(Ordering::Acquire)
            && sent.elapsed() < Duration::from_secs(1)
        {
            std::thread::yield_now();
        }
    }
    worker.join().unwrap();
    NESTED_MAP.store(0, Ordering::Release);
    let runs = NESTED_RUNS.load(Ordering::Relaxed) as u64;
    assert!(runs >= 2_000, "only {runs} handler runs");
    assert_eq!(
        NESTED_BAD.load(Ordering::Relaxed),
        0,
        "a read on top of a change was not exact"
    );
    assert!(
        NESTED_HELD.load(Ordering::Relaxed) > 0,
        "no handler landed while its thread held a shard: the test proved nothing"
    );
    assert_eq!(f.lost(), 0);
    let (all, _) = read_all(m, gettid(), None);
    let handler_blocks = (1u64 << 50..NESTED_KEY.load(Ordering::Relaxed))
        .filter(|k| all.get(k) == Some(&blk(*k)))
        .count() as u64;
    assert_eq!(handler_blocks, runs, "a handler's block was lost");
}

// ---- a handler on top of a read that holds a shard ----

static READ_MAP: AtomicUsize = AtomicUsize::new(0);
static READ_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static READ_RUNS: AtomicU32 = AtomicU32::new(0);

extern "C" fn insert_on_top(_: libc::c_int) {
    let (m, f) = (
        READ_MAP.load(Ordering::Acquire),
        READ_FLIGHT.load(Ordering::Acquire),
    );
    if m == 0 || f == 0 || allocator_flag::inside() {
        return;
    }
    // SAFETY: set by the test to a map and a flight that outlive it.
    let (m, f) = unsafe { (&*(m as *const LiveMap), &*(f as *const Flight)) };
    let k = (1u64 << 52) + READ_RUNS.fetch_add(1, Ordering::Relaxed) as u64;
    m.insert(
        Caller {
            tid: gettid(),
            flight: f,
        },
        k,
        blk(k),
    );
}

/// A signal handler that allocates while its thread reads the map (an
/// out-of-memory snapshot, a dump on a program thread) lands on a shard
/// that thread holds outside any change: its insert must neither wait for
/// the lock its own thread holds (it hung) nor be lost.
#[test]
fn a_signal_handler_on_top_of_a_read_neither_hangs_nor_loses_its_block() {
    let m: &'static LiveMap = Box::leak(Box::new(LiveMap::new()));
    let f: &'static Flight = Box::leak(Box::new(Flight::new()));
    let caller = Caller {
        tid: gettid(),
        flight: f,
    };
    for i in 0..20_000u64 {
        m.insert(caller, (i + 1) << 12, blk(i));
    }
    let sig = libc::SIGRTMIN() + 4;
    // SAFETY: a handler for a signal no other test uses; it only touches
    // statics and the leaked map and flight.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = insert_on_top as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
    READ_MAP.store(m as *const LiveMap as usize, Ordering::Release);
    READ_FLIGHT.store(f as *const Flight as usize, Ordering::Release);
    // The reads run on this thread; a helper thread signals it.
    // SAFETY: pthread_self takes nothing.
    let me_thread = unsafe { libc::pthread_self() } as usize;
    let done = Arc::new(AtomicBool::new(false));
    let signaller = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let runs = READ_RUNS.load(Ordering::Relaxed);
                // SAFETY: signalling this test's own thread, alive until
                // `done` is set.
                unsafe { libc::pthread_kill(me_thread as libc::pthread_t, sig) };
                // The next signal once this one was taken: signals sent
                // faster than a handler runs keep the thread in handlers.
                let sent = Instant::now();
                while READ_RUNS.load(Ordering::Relaxed) == runs
                    && !done.load(Ordering::Acquire)
                    && sent.elapsed() < Duration::from_secs(1)
                {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    let start = Instant::now();
    while READ_RUNS.load(Ordering::Relaxed) < 300 && start.elapsed() < Duration::from_secs(20) {
        let stopped = Some(Stopped {
            tid: caller.tid,
            flight: f,
        });
        let _ = m.for_each_shard(caller.tid, stopped, None, &never, |it, _| {
            it.for_each(drop);
        });
    }
    done.store(true, Ordering::Release);
    signaller.join().unwrap();
    READ_MAP.store(0, Ordering::Release);
    // Deferred inserts are made by this thread's next change.
    m.insert(caller, 1 << 51, blk(1));
    let runs = READ_RUNS.load(Ordering::Relaxed) as u64;
    assert!(runs >= 300, "only {runs} handler runs");
    let (all, _) = read_all(m, gettid(), None);
    let found = (0..runs)
        .filter(|i| all.contains_key(&((1u64 << 52) + i)))
        .count() as u64;
    assert_eq!(found, runs, "a handler's block was lost");
    assert_eq!(f.lost(), 0);
}

/// A handler on top of a read defers its change on the shard the read
/// holds; its next change, on another shard, must not try to run the
/// deferred one while the shard is still held (it was deferred again and
/// again: the thread spun for good). The deferred change is made by the
/// thread's first change after the read.
#[test]
fn a_deferred_change_waits_for_its_shard_and_the_next_change_returns() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let m = LiveMap::new();
        let f = Flight::new();
        let caller = me(&f);
        let mut first = true;
        let mut keys = (0, 0);
        m.for_each_shard(caller.tid, None, None, &never, |it, _| {
            it.for_each(drop);
            if !std::mem::take(&mut first) {
                return;
            }
            let held = m
                .shards
                .iter()
                .position(|s| s.0.holder() == Some(caller.tid))
                .expect("a read holds the shard it visits");
            keys = (
                key_in_shard(&m, held, 0),
                key_in_shard(&m, (held + 1) % m.shards.len(), 0),
            );
            // as a handler would: deferred, then a change elsewhere
            m.insert(caller, keys.0, blk(1));
            m.insert(caller, keys.1, blk(2));
        })
        .unwrap();
        m.insert(caller, 1 << 40, blk(3));
        let (all, _) = read_all(&m, caller.tid, None);
        let _ = tx.send((all.get(&keys.0).copied(), all.get(&keys.1).copied(), f.lost()));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the change after a deferred one never returned");
    assert_eq!(got, (Some(blk(1)), Some(blk(2)), 0));
}
