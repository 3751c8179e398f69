//! The concurrent map of live blocks: address (or VMM handle) → [`Block`].
//!
//! 64 shards, each a [`TidMutex`] over a [`BlockTable`] plus counters that
//! change only under that shard's lock. That is what makes a dump exact
//! while other threads keep allocating: the dump visits one shard at a time,
//! and within a shard `inserted - removed - moved == live` always holds, so
//! the sums over shards satisfy `allocations - frees == live blocks` no
//! matter how traffic interleaves with the dump. A dump never holds more
//! than one shard lock, so allocating threads wait at most one shard's copy.
//!
//! Numbered cases worth knowing:
//! 1. **A thread that never runs again.** A program may end inside a
//!    hook: SIGTERM lands while its only allocating thread records a
//!    block, and the handler calls `exit(0)`, or the default action ends
//!    it after the library's fatal-signal report. That thread waits, in
//!    the library's exit path, for the report; it will never finish its
//!    change nor let its shard go. The report still reads everything: the
//!    thread announced its change in its [`Flight`] before touching the
//!    shard, the shard's lock names its holder, and the table is
//!    consistent at every instruction of the thread that changes it
//!    (`block_table.rs`). The reader passes the stopped thread's id and
//!    flight ([`Stopped`]); a shard that thread holds is read without its
//!    lock and the announced change applied to the copy, as if it had
//!    finished. Hooks of other threads are waited for, bounded.
//! 2. **The stages of a change**, kept in the caller's [`Flight`] with
//!    plain stores: *announced* (the key and its block or its removal,
//!    before the lock: the shard is untouched), then *applying* (under the
//!    lock, with the counters the change ends with), then idle (before the
//!    unlock). A reader taking over applies an announced insertion (the
//!    block is in the device: it is live) but not an announced removal
//!    (the release call had not reached the driver: the block is still
//!    allocated); an applying change it applies whole, counters included.
//! 3. **A signal handler on a thread inside a change** (allocating in a
//!    handler is not async-signal-safe, but programs do it) finds the
//!    thread busy, or the shard held by its own thread (a read, a
//!    teardown's drain, a fork under way on it). A call on a shard the thread holds reads through the
//!    same view as case 1, and its changes are deferred: kept in the
//!    flight's few slots and made by the interrupted thread once it has
//!    let the shard go. Its calls on other shards lock them as usual.
//!    With locks taken by the same thread twice, such a call deadlocked;
//!    in the sole owner's section it was skipped, and its block lost.
//! 4. `inserted` counts stores, a replaced block (a release we did not
//!    see) counts as removed too; `moved` counts blocks taken out by a
//!    context teardown.

use crate::base::hash::mix64;
use crate::base::tid_lock::TidMutex;
use crate::record::block_table::BlockTable;
use crate::record::Block;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const SHARDS: usize = 64;

/// Slots for a signal handler's changes to a shard its thread holds
/// (case 3); past them a change is counted in [`Flight::lost`].
const DEFERRED: usize = 4;

struct Shard {
    table: BlockTable,
    inserted: AtomicU64,
    removed: AtomicU64,
    moved: AtomicU64,
}

impl Shard {
    fn counts(&self) -> MapCounts {
        MapCounts {
            inserted: self.inserted.load(Ordering::Relaxed),
            removed: self.removed.load(Ordering::Relaxed),
            moved: self.moved.load(Ordering::Relaxed),
            live: self.table.len() as u64,
        }
    }
}

/// Counts change by one plain load and store: only the shard's holder
/// writes them.
fn bump(c: &AtomicU64, by: i64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by as u64),
        Ordering::Relaxed,
    );
}

#[repr(align(64))]
struct PaddedShard(TidMutex<Shard>);

pub struct LiveMap {
    shards: [PaddedShard; SHARDS],
}

/// Counter totals read together with the blocks of the same shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapCounts {
    pub inserted: u64,
    pub removed: u64,
    pub moved: u64,
    pub live: u64,
}

impl MapCounts {
    pub fn add(&mut self, o: MapCounts) {
        self.inserted += o.inserted;
        self.removed += o.removed;
        self.moved += o.moved;
        self.live += o.live;
    }
}

// ---- what a thread is doing (cases 1 to 3) ----

const IDLE: u8 = 0;
const ANNOUNCED: u8 = 1;
const APPLYING: u8 = 2;

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const READY: u8 = 2;

const OP_INSERT: u8 = 1;
const OP_REMOVE: u8 = 2;
const OP_RESTORE: u8 = 3;

/// A deferred change (case 3).
#[derive(Default)]
struct Deferred {
    state: AtomicU8,
    op: AtomicU8,
    key: AtomicU64,
    packed: AtomicU64,
    trace_epoch: AtomicU64,
}

/// One thread's change to a live map, as far as it got (cases 1 to 3).
/// Each thread keeps one (the preload library: in its thread state) and
/// passes it with every call; all zero is idle. Only its thread writes
/// it, with plain stores; another thread reads it only while that thread
/// never runs again.
#[derive(Default)]
pub struct Flight {
    /// the thread is inside a call of a live map (a signal handler's call
    /// then goes the nested way, case 3)
    busy: AtomicBool,
    stage: AtomicU8,
    /// which shard the change is for (its address)
    shard: AtomicUsize,
    key: AtomicU64,
    /// the key holds `block` after the change (else it is gone)
    present: AtomicBool,
    /// the change's kind (an insert, a removal, a restore)
    op: AtomicU8,
    packed: AtomicU64,
    trace_epoch: AtomicU64,
    /// the shard's counters once the change is done (stage applying)
    inserted: AtomicU64,
    removed: AtomicU64,
    deferred: [Deferred; DEFERRED],
    /// a deferred change may be ready: set by the handler that made it
    /// ready, cleared by the thread before it runs them (one test at the
    /// end of every change, where reading every slot's state cost four)
    any_ready: AtomicBool,
    /// a handler's changes that found no free slot
    lost: AtomicU64,
}

impl Flight {
    pub const fn new() -> Flight {
        // A const for the array's repeat: each element is its own copy.
        #[allow(clippy::declare_interior_mutable_const)]
        const D: Deferred = Deferred {
            state: AtomicU8::new(FREE),
            op: AtomicU8::new(0),
            key: AtomicU64::new(0),
            packed: AtomicU64::new(0),
            trace_epoch: AtomicU64::new(0),
        };
        Flight {
            busy: AtomicBool::new(false),
            stage: AtomicU8::new(IDLE),
            shard: AtomicUsize::new(0),
            key: AtomicU64::new(0),
            present: AtomicBool::new(false),
            op: AtomicU8::new(0),
            packed: AtomicU64::new(0),
            trace_epoch: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            deferred: [D; DEFERRED],
            any_ready: AtomicBool::new(false),
            lost: AtomicU64::new(0),
        }
    }

    /// A handler's changes that could not be kept (case 3), for the count
    /// of internal losses.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// The child of `fork`: whatever the parent's thread was doing is not
    /// the child's.
    pub fn reset(&self) {
        self.busy.store(false, Ordering::Relaxed);
        self.stage.store(IDLE, Ordering::Relaxed);
        for d in &self.deferred {
            d.state.store(FREE, Ordering::Relaxed);
        }
        self.any_ready.store(false, Ordering::Relaxed);
    }

    fn block(&self) -> Block {
        Block::from_words(
            self.packed.load(Ordering::Relaxed),
            self.trace_epoch.load(Ordering::Relaxed),
        )
    }
}

/// The calling thread: its kernel id (the shard locks name it) and its
/// flight.
#[derive(Clone, Copy)]
pub struct Caller<'a> {
    pub tid: u32,
    pub flight: &'a Flight,
}

/// A thread that will never run again, whose changes a reader takes over
/// (case 1): the thread that asked for the report it waits for.
#[derive(Clone, Copy)]
pub struct Stopped<'a> {
    pub tid: u32,
    pub flight: &'a Flight,
}

/// Sets `busy` for one call and clears it, however the call ends.
struct Busy<'a>(&'a Flight);

impl Drop for Busy<'_> {
    #[inline]
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        self.0.busy.store(false, Ordering::Relaxed);
    }
}

/// A shard's blocks and counts as a reader sees them: the table, with a
/// stopped thread's changes laid over it (case 1), at most one per change
/// a thread can have under way (its own, and its deferred ones).
struct View<'a> {
    table: &'a BlockTable,
    counts: MapCounts,
    overlay: Overlay,
}

/// Keys whose state a stopped thread's changes set: each with its block
/// (or none: gone) and whether the table holds it.
#[derive(Default)]
struct Overlay {
    n: usize,
    keys: [u64; DEFERRED + 1],
    now: [Option<Block>; DEFERRED + 1],
    in_table: [bool; DEFERRED + 1],
}

impl Overlay {
    fn find(&self, key: u64) -> Option<usize> {
        self.keys[..self.n].iter().position(|k| *k == key)
    }

    fn set(&mut self, key: u64, now: Option<Block>, table: &BlockTable) {
        let i = match self.find(key) {
            Some(i) => i,
            None if self.n < self.keys.len() => {
                self.n += 1;
                self.keys[self.n - 1] = key;
                self.in_table[self.n - 1] = table.get(key).is_some();
                self.n - 1
            }
            None => return,
        };
        self.now[i] = now;
    }
}

impl View<'_> {
    fn get(&self, key: u64) -> Option<Block> {
        match self.overlay.find(key) {
            Some(i) => self.overlay.now[i],
            None => self.table.get(key),
        }
    }

    /// A change as the stopped thread would have made it.
    fn apply(&mut self, op: u8, key: u64, block: Block) {
        let before = self.get(key);
        let c = &mut self.counts;
        match op {
            OP_INSERT => {
                c.inserted += 1;
                if before.is_some() {
                    c.removed += 1;
                }
            }
            OP_RESTORE if before.is_none() => c.removed = c.removed.wrapping_sub(1),
            OP_RESTORE => c.inserted += 1,
            _ if before.is_some() => c.removed += 1,
            _ => return,
        }
        let now = (op != OP_REMOVE).then_some(block);
        self.overlay.set(key, now, self.table);
    }

    fn iter(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        let o = &self.overlay;
        self.table
            .iter()
            .filter(move |(k, _)| o.find(*k).is_none())
            .chain((0..o.n).filter_map(move |i| o.now[i].map(|b| (o.keys[i], b))))
    }
}

impl Default for LiveMap {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveMap {
    pub const fn new() -> LiveMap {
        LiveMap {
            shards: [const {
                PaddedShard(TidMutex::new(Shard {
                    table: BlockTable::new(),
                    inserted: AtomicU64::new(0),
                    removed: AtomicU64::new(0),
                    moved: AtomicU64::new(0),
                }))
            }; SHARDS],
        }
    }

    #[inline]
    fn shard(&self, key: u64) -> &TidMutex<Shard> {
        self.shard_of_hash(mix64(key))
    }

    /// The shard of a key whose mix is `hash`: its top bits. The shard's
    /// table starts its probe at the low bits of the same mix (a table
    /// never has 2^58 slots), so a change mixes its key once.
    #[inline]
    fn shard_of_hash(&self, hash: u64) -> &TidMutex<Shard> {
        &self.shards[(hash >> 58) as usize].0
    }

    fn shard_address(m: &TidMutex<Shard>) -> usize {
        m as *const TidMutex<Shard> as usize
    }

    /// Records an allocation. If the key was already live (a release we did
    /// not see), the old block counts as released so that the counters stay
    /// exact; it is returned.
    #[inline]
    pub fn insert(&self, me: Caller, key: u64, block: Block) -> Option<Block> {
        self.change(me, key, OP_INSERT, block, |_| true)
    }

    /// Records a release; `None` when the key was not live.
    pub fn remove(&self, me: Caller, key: u64) -> Option<Block> {
        self.remove_if(me, key, |_| true)
    }

    /// Records a release if `accept` approves the live block (a release
    /// call of the wrong kind, e.g. `cuMemFreeHost` on device memory, fails
    /// in the driver and must not drop the block).
    #[inline]
    pub fn remove_if(&self, me: Caller, key: u64, accept: impl FnOnce(&Block) -> bool) -> Option<Block> {
        self.change(me, key, OP_REMOVE, Block::from_words(0, 0), accept)
    }

    /// Undoes a [`LiveMap::remove`] whose release call then failed.
    pub fn restore(&self, me: Caller, key: u64, block: Block) {
        self.change(me, key, OP_RESTORE, block, |_| true);
    }

    pub fn get(&self, me: Caller, key: u64) -> Option<Block> {
        let m = self.shard(key);
        if m.holder() == Some(me.tid) {
            // Case 3: a handler on the thread that holds this shard.
            return self
                .view_of(
                    m,
                    Some(Stopped {
                        tid: me.tid,
                        flight: me.flight,
                    }),
                )
                .get(key);
        }
        m.lock(me.tid).table.get(key)
    }

    /// One change of `op` to `key` (cases 2 and 3).
    #[inline]
    fn change(
        &self,
        me: Caller,
        key: u64,
        op: u8,
        block: Block,
        accept: impl FnOnce(&Block) -> bool,
    ) -> Option<Block> {
        let f = me.flight;
        let hash = mix64(key);
        let m = self.shard_of_hash(hash);
        // A call on top of another of this thread's: inside a change, or
        // while it holds this shard for a read, a teardown's drain or a
        // fork (the lock is not re-entrant: it would wait for itself).
        if f.busy.load(Ordering::Relaxed) || m.holder() == Some(me.tid) {
            return self.nested_change(me, m, key, op, block, accept);
        }
        let result = {
            f.busy.store(true, Ordering::Relaxed);
            let _busy = Busy(f);
            // Announced (case 2): the shard is not touched yet.
            let (packed, trace_epoch) = block.to_words();
            f.shard.store(Self::shard_address(m), Ordering::Relaxed);
            f.key.store(key, Ordering::Relaxed);
            f.present.store(op != OP_REMOVE, Ordering::Relaxed);
            f.op.store(op, Ordering::Relaxed);
            f.packed.store(packed, Ordering::Relaxed);
            f.trace_epoch.store(trace_epoch, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
            f.stage.store(ANNOUNCED, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
            let s = m.lock(me.tid);
            let probe = s.table.probe_hashed(key, hash);
            let old = probe.found;
            let (inserted, removed) = (
                s.inserted.load(Ordering::Relaxed),
                s.removed.load(Ordering::Relaxed),
            );
            let change = match op {
                OP_INSERT => Some((1, old.is_some() as u64, old)),
                OP_RESTORE if old.is_none() => Some((0, u64::MAX, None)), // removed - 1
                OP_RESTORE => Some((1, 0, None)),                         // inserted meanwhile
                _ => old.filter(accept).map(|b| (0, 1, Some(b))),
            };
            let result = match change {
                None => None,
                Some((ins, rem, result)) => {
                    let (inserted, removed) = (inserted + ins, removed.wrapping_add(rem));
                    f.inserted.store(inserted, Ordering::Relaxed);
                    f.removed.store(removed, Ordering::Relaxed);
                    compiler_fence(Ordering::SeqCst);
                    f.stage.store(APPLYING, Ordering::Relaxed);
                    compiler_fence(Ordering::SeqCst);
                    let stored = if op == OP_REMOVE {
                        s.table.remove_at(&probe).is_some()
                    } else {
                        s.table.insert_at(&probe, key, block).is_ok()
                    };
                    if stored {
                        s.inserted.store(inserted, Ordering::Relaxed);
                        s.removed.store(removed, Ordering::Relaxed);
                    }
                    result
                }
            };
            compiler_fence(Ordering::SeqCst);
            f.stage.store(IDLE, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
            drop(s);
            result
        };
        // A signal handler's changes deferred while this thread held the
        // shard (case 3): made now that it does not, and `busy` is clear,
        // so that a handler that comes later locks the shard itself rather
        // than defer to a thread that has already looked.
        compiler_fence(Ordering::SeqCst);
        if f.any_ready.load(Ordering::Relaxed) {
            self.run_deferred(me);
        }
        result
    }

    #[cold]
    fn run_deferred(&self, me: Caller) {
        // Cleared before the slots are read: a handler that makes one
        // ready after this sets it again (and one it interrupts here is
        // run by this loop or by the next change).
        me.flight.any_ready.store(false, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        loop {
            let mut ran = false;
            for d in &me.flight.deferred {
                if d.state.load(Ordering::Relaxed) != READY {
                    continue;
                }
                let (op, key) = (d.op.load(Ordering::Relaxed), d.key.load(Ordering::Relaxed));
                // A handler on top of this thread's read, drain or fork
                // that changes another shard gets here too: a change on a
                // shard still held waits for a later call (run now, it
                // would be deferred again, for ever), which must look.
                if self.shard(key).holder() == Some(me.tid) {
                    me.flight.any_ready.store(true, Ordering::Relaxed);
                    continue;
                }
                let block = Block::from_words(
                    d.packed.load(Ordering::Relaxed),
                    d.trace_epoch.load(Ordering::Relaxed),
                );
                compiler_fence(Ordering::SeqCst);
                d.state.store(FREE, Ordering::Relaxed);
                // As an ordinary call: `busy` is clear again.
                self.change(me, key, op, block, |_| true);
                ran = true;
            }
            if !ran {
                return;
            }
        }
    }

    /// A signal handler's call while its thread is inside another (case 3).
    #[cold]
    #[inline(never)]
    fn nested_change(
        &self,
        me: Caller,
        m: &TidMutex<Shard>,
        key: u64,
        op: u8,
        block: Block,
        accept: impl FnOnce(&Block) -> bool,
    ) -> Option<Block> {
        if m.holder() != Some(me.tid) {
            // Another shard than the interrupted call's (or none held
            // yet): an ordinary locked change, the flight left alone.
            let s = m.lock(me.tid);
            let old = s.table.get(key);
            return match op {
                OP_INSERT => {
                    if s.table.insert(key, block).is_ok() {
                        bump(&s.inserted, 1);
                        if old.is_some() {
                            bump(&s.removed, 1);
                        }
                    }
                    old
                }
                OP_RESTORE => {
                    if s.table.insert(key, block).is_ok() {
                        if old.is_none() {
                            bump(&s.removed, -1);
                        } else {
                            bump(&s.inserted, 1);
                        }
                    }
                    None
                }
                _ => {
                    let b = s.table.remove_if(key, accept);
                    if b.is_some() {
                        bump(&s.removed, 1);
                    }
                    b
                }
            };
        }
        // The shard this thread holds, stopped under us: read through the
        // view, change later.
        let now = self
            .view_of(
                m,
                Some(Stopped {
                    tid: me.tid,
                    flight: me.flight,
                }),
            )
            .get(key);
        let result = match op {
            OP_INSERT => now,
            OP_RESTORE => None,
            _ => match now.filter(accept) {
                Some(b) => Some(b),
                None => return None,
            },
        };
        let f = me.flight;
        match f.deferred.iter().find(|d| {
            d.state
                .compare_exchange(FREE, CLAIMED, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        }) {
            Some(d) => {
                let (packed, trace_epoch) = block.to_words();
                d.op.store(op, Ordering::Relaxed);
                d.key.store(key, Ordering::Relaxed);
                d.packed.store(packed, Ordering::Relaxed);
                d.trace_epoch.store(trace_epoch, Ordering::Relaxed);
                compiler_fence(Ordering::SeqCst);
                d.state.store(READY, Ordering::Relaxed);
                f.any_ready.store(true, Ordering::Relaxed);
            }
            None => {
                f.lost
                    .store(f.lost.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
        }
        result
    }

    /// Shard `m` as a reader sees it, with `stopped`'s change and deferred
    /// changes applied (cases 1 and 3). Nothing is allocated: a signal
    /// handler may be reading, on top of a thread that is inside malloc.
    fn view_of<'s>(&'s self, m: &'s TidMutex<Shard>, stopped: Option<Stopped>) -> View<'s> {
        // SAFETY: only reads, of atomics, through a shared reference: the
        // caller holds the shard's lock, or its holder is `stopped`, which
        // never runs again (or is the thread running this, a handler on
        // top of the interrupted change); guards hand out `&mut Shard`
        // nowhere, and the table is consistent at every instruction of its
        // changes (block_table.rs).
        let s: &Shard = unsafe { m.get_shared_unchecked() };
        let mut view = View {
            table: &s.table,
            counts: s.counts(),
            overlay: Overlay::default(),
        };
        let Some(st) = stopped else {
            return view;
        };
        let mine = Self::shard_address(m);
        let f = st.flight;
        let stage = f.stage.load(Ordering::Relaxed);
        let flight_here = stage != IDLE && f.shard.load(Ordering::Relaxed) == mine;
        let deferred_here = |d: &Deferred| {
            d.state.load(Ordering::Relaxed) == READY
                && Self::shard_address(self.shard(d.key.load(Ordering::Relaxed))) == mine
        };
        if !flight_here && !f.deferred.iter().any(deferred_here) {
            return view;
        }
        if flight_here {
            let key = f.key.load(Ordering::Relaxed);
            match stage {
                // Case 2: an announced insertion is live (a restore
                // undoes a removal whose release failed); an announced
                // removal has not released anything yet.
                ANNOUNCED => match f.op.load(Ordering::Relaxed) {
                    OP_REMOVE => {}
                    op => view.apply(op, key, f.block()),
                },
                _ => {
                    let now = f.present.load(Ordering::Relaxed).then(|| f.block());
                    view.overlay.set(key, now, &s.table);
                    view.counts.inserted = f.inserted.load(Ordering::Relaxed);
                    view.counts.removed = f.removed.load(Ordering::Relaxed);
                }
            }
        }
        for d in f.deferred.iter().filter(|d| deferred_here(d)) {
            let block = Block::from_words(
                d.packed.load(Ordering::Relaxed),
                d.trace_epoch.load(Ordering::Relaxed),
            );
            view.apply(d.op.load(Ordering::Relaxed), d.key.load(Ordering::Relaxed), block);
        }
        // The table's own count may lag its entries by the stopped change.
        view.counts.live = view.iter().count() as u64;
        view
    }

    /// Visits every shard: `visit` sees a shard's blocks and counters
    /// together, and must not change the map. Each shard is read under its
    /// lock, except one held by `stopped` (case 1) or by the calling
    /// thread itself (a handler on top of its own call, case 3), read
    /// through the view. With `timeout`, a shard whose lock cannot be had
    /// in time is skipped and counted in the return value (a thread may
    /// have died holding it). `give_up` is asked while a lock is waited
    /// for: when it says so, the read stops and returns None (a live dump
    /// that an exit report is waiting for, whose thread holds the lock).
    pub fn for_each_shard(
        &self,
        me: u32,
        stopped: Option<Stopped>,
        timeout: Option<Duration>,
        give_up: &dyn Fn() -> bool,
        mut visit: impl FnMut(&mut dyn Iterator<Item = (u64, Block)>, MapCounts),
    ) -> Option<usize> {
        let mut skipped = 0;
        let deadline = timeout.map(|t| Instant::now() + t);
        for shard in &self.shards {
            let m = &shard.0;
            let holder = m.holder();
            let taken_over = match stopped {
                Some(st) if holder == Some(st.tid) => Some(st),
                _ if holder == Some(me) => None,
                _ => {
                    // Locked, bounded; the stopped thread's change applies
                    // to this shard too if it was only announced.
                    let Some(guard) = Self::lock_patiently(m, me, deadline, give_up)? else {
                        skipped += 1;
                        continue;
                    };
                    let view = self.view_of(m, stopped);
                    visit(&mut view.iter(), view.counts);
                    drop(guard);
                    continue;
                }
            };
            let view = self.view_of(m, taken_over);
            visit(&mut view.iter(), view.counts);
        }
        Some(skipped)
    }

    /// `m`'s lock, waited for in slices: `Some(None)` when `deadline`
    /// passed, None when `give_up` said so.
    fn lock_patiently<'s>(
        m: &'s TidMutex<Shard>,
        me: u32,
        deadline: Option<Instant>,
        give_up: &dyn Fn() -> bool,
    ) -> Option<Option<crate::base::tid_lock::TidGuard<'s, Shard>>> {
        if let Some(g) = m.try_lock(me) {
            return Some(Some(g));
        }
        let slice = Duration::from_millis(10);
        loop {
            let wait = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Some(None);
                    }
                    (d - now).min(slice)
                }
                None => slice,
            };
            if let Some(g) = m.lock_for(me, wait) {
                return Some(Some(g));
            }
            if give_up() {
                return None;
            }
        }
    }

    /// Moves out every block for which `pred` holds (context teardown).
    pub fn drain_where(&self, me: Caller, mut pred: impl FnMut(&Block) -> bool) -> Vec<(u64, Block)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            if shard.0.holder() == Some(me.tid) {
                // A handler on top of this thread's own change: that shard
                // is left as it is.
                continue;
            }
            let s = shard.0.lock(me.tid);
            let before = out.len();
            s.table.drain_where(&mut pred, &mut out);
            bump(&s.moved, (out.len() - before) as i64);
        }
        out
    }

    pub fn counts(&self, me: Caller) -> MapCounts {
        let mut total = MapCounts::default();
        let stopped = Stopped {
            tid: me.tid,
            flight: me.flight,
        };
        let _ = self.for_each_shard(me.tid, Some(stopped), None, &|| false, |_, c| total.add(c));
        total
    }

    /// Takes every shard lock (fork prepare handler).
    pub fn lock_all(&self, tid: u32) {
        for s in &self.shards {
            s.0.raw_lock(tid);
        }
    }

    /// # Safety
    /// Must follow [`LiveMap::lock_all`] on this thread, `tid` its id.
    pub unsafe fn unlock_all(&self, tid: u32) {
        for s in &self.shards {
            // SAFETY: the caller took every shard lock with `lock_all` on
            // this thread, so each is ours to release, once.
            unsafe { s.0.raw_unlock(tid) };
        }
    }

    /// Empties the map and its counters while the locks from
    /// [`LiveMap::lock_all`] are held, then unlocks (fork child handler).
    ///
    /// # Safety
    /// Must follow [`LiveMap::lock_all`] on this thread, in a process with
    /// no other thread (the child of `fork`).
    pub unsafe fn reset_locked_and_unlock(&self) {
        for s in &self.shards {
            // SAFETY: the caller guarantees this is the only thread (the
            // child of `fork`) and that `lock_all` holds this shard, so no
            // guard or other reference to its value exists.
            let shard = unsafe { s.0.get_unchecked() };
            shard.table.clear();
            for c in [&shard.inserted, &shard.removed, &shard.moved] {
                c.store(0, Ordering::Relaxed);
            }
            // SAFETY: held since `lock_all` by the parent's id of this
            // thread, and no other thread exists.
            unsafe { s.0.reset_in_child() };
        }
    }
}

#[cfg(test)]
mod tests;
