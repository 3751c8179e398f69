//! The concurrent map of live blocks: address (or VMM handle) → [`Block`].
//!
//! 64 shards, each a [`FutexMutex`] over a hashbrown map plus counters that
//! change only under that shard's lock. That is what makes a dump exact
//! while other threads keep allocating: the dump visits one shard at a time,
//! and within a shard `inserted - removed - moved == len` always holds, so
//! the sums over shards satisfy `allocations - frees == live blocks` no
//! matter how traffic interleaves with the dump. A dump never holds more
//! than one shard lock, so allocating threads wait at most one shard's copy.
//!
//! A map made with [`LiveMap::with_sole_owner`] takes no shard lock while
//! one thread alone uses it (`base/sole.rs`): every method takes the
//! calling thread's [`ThreadKey`], and the first thread to call becomes
//! the owner until another thread changes it. Another thread that only
//! reads (a live dump) holds the owner off instead (sole.rs, case 8), for
//! [`PAUSE_BLOCKS`] blocks' copy at a time. The owner's call nested in its own (a signal
//! handler that interrupted it) does nothing and returns what "not found"
//! returns.

use crate::base::hash::{mix64, AddrHash};
use crate::base::lock::{FutexGuard, FutexMutex};
use crate::base::sole::{Entry, Pause, PauseGuard, SoleOwner, ThreadKey};
use crate::record::Block;
use std::collections::HashMap;
use std::time::Duration;

pub const SHARDS: usize = 64;

/// How many blocks a read copies under one pause of the map's owner before
/// it lets the owner go on (sole.rs, case 8): about a quarter of a
/// millisecond, what one shard's lock held the owner with 1M blocks live.
/// A pause costs a membarrier(2) and two signal-mask calls, so a small
/// map is read under one.
const PAUSE_BLOCKS: usize = 16_384;

struct Shard {
    map: HashMap<u64, Block, AddrHash>,
    /// allocations recorded in this shard
    inserted: u64,
    /// releases that removed a block from this shard
    removed: u64,
    /// blocks moved out by a context teardown (still leaks, kept elsewhere)
    moved: u64,
}

#[repr(align(64))]
struct PaddedShard(FutexMutex<Shard>);

pub struct LiveMap {
    shards: [PaddedShard; SHARDS],
    sole: Option<&'static SoleOwner>,
}

/// A shard as one call holds it: under its lock, or the sole owner's.
enum Held<'a> {
    Locked(FutexGuard<'a, Shard>),
    Sole(&'a mut Shard),
}

impl std::ops::Deref for Held<'_> {
    type Target = Shard;
    fn deref(&self) -> &Shard {
        match self {
            Held::Locked(g) => g,
            Held::Sole(s) => s,
        }
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Shard {
        match self {
            Held::Locked(g) => g,
            Held::Sole(s) => s,
        }
    }
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

impl Default for LiveMap {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveMap {
    pub const fn new() -> LiveMap {
        LiveMap::with_sole(None)
    }

    /// A map that spares a thread using it alone the shard locks.
    pub const fn with_sole_owner(sole: &'static SoleOwner) -> LiveMap {
        LiveMap::with_sole(Some(sole))
    }

    const fn with_sole(sole: Option<&'static SoleOwner>) -> LiveMap {
        LiveMap {
            sole,
            shards: [const {
                PaddedShard(FutexMutex::new(Shard {
                    map: HashMap::with_hasher(AddrHash),
                    inserted: 0,
                    removed: 0,
                    moved: 0,
                }))
            }; SHARDS],
        }
    }

    /// Runs `f` on `key`'s shard, held by `me`: without its lock while
    /// `me` owns the map alone; not at all (`R::default()`, "not found")
    /// when `me` interrupted its own call.
    #[inline(always)]
    fn with_shard<R: Default>(&self, me: ThreadKey, key: u64, f: impl FnOnce(&mut Shard) -> R) -> R {
        let shard = self.shard(key);
        if let Some(sole) = self.sole {
            match sole.enter(me) {
                // SAFETY: `me` owns the map alone (sole.rs): no other
                // thread reads or changes a shard until the section ends,
                // and `f` cannot reach this map again.
                Entry::Sole(_section) => return f(unsafe { shard.get_unchecked() }),
                Entry::Nested(_) => return R::default(),
                Entry::Shared => {}
            }
        }
        f(&mut shard.lock())
    }

    /// For the calls over every shard: a closure over each shard in turn
    /// is what the owner's one section covers. Another thread that only
    /// reads (`changes` false: a live dump) pauses the owner rather than
    /// ending sole mode (sole.rs, case 8). `None`: `me` interrupted its
    /// own call, or the owner stayed inside past `timeout`.
    fn with_every_shard<'s, R>(
        &'s self,
        me: ThreadKey,
        timeout: Option<Duration>,
        changes: bool,
        f: impl FnOnce(&mut dyn FnMut(&'s FutexMutex<Shard>) -> Option<Held<'s>>) -> R,
    ) -> Option<R> {
        if let Some(sole) = self.sole {
            loop {
                if sole.is_owner(me) {
                    match sole.enter(me) {
                        Entry::Sole(_section) => {
                            // SAFETY: as in `with_shard`; the section lasts
                            // until `f` returns.
                            return Some(f(&mut |m| Some(Held::Sole(unsafe { m.get_unchecked() }))));
                        }
                        Entry::Nested(_) => return None,
                        Entry::Shared => break,
                    }
                }
                if !changes {
                    match sole.pause(me, timeout) {
                        Pause::Paused(held_off) => {
                            return Some(f(&mut self.paused_reads(sole, me, timeout, held_off)))
                        }
                        Pause::Owner => continue,
                        Pause::Nested | Pause::TimedOut => return None,
                        Pause::Shared => {}
                    }
                }
                // Not `enter`, whose ending of sole mode would wait without
                // the timeout.
                if !sole.end(me, timeout) {
                    return None;
                }
                break;
            }
        }
        Some(f(&mut |m| match timeout {
            Some(t) => m.lock_for(t).map(Held::Locked),
            None => Some(Held::Locked(m.lock())),
        }))
    }

    /// The shards for a read that paused the map's owner (sole.rs, case
    /// 8), in turn. The pause is given back and taken again once the
    /// shards handed out since it began held [`PAUSE_BLOCKS`] blocks, so
    /// that the owner waits for about one shard's copy at a time, as it
    /// did for a shard's lock. If sole mode ended meanwhile, the rest are
    /// locked; if a pause timed out, the rest are skipped.
    ///
    /// The caller must be done with each shard before it asks for the
    /// next (`for_each_shard`'s loop): the pause that covers a shard may
    /// end at the next call.
    fn paused_reads<'a>(
        &'a self,
        sole: &'a SoleOwner,
        me: ThreadKey,
        timeout: Option<Duration>,
        held_off: PauseGuard<'a>,
    ) -> impl FnMut(&'a FutexMutex<Shard>) -> Option<Held<'a>> + 'a {
        /// How the read holds the shards it has not reached yet.
        enum Hold<'a> {
            /// (held for its drop, which gives the pause back)
            Paused { _held_off: PauseGuard<'a> },
            /// sole mode ended meanwhile
            Locked,
            /// a pause timed out: the owner may be inside, so the rest is
            /// skipped, neither read unlocked nor locked beside it
            GaveUp,
        }
        let mut hold = Hold::Paused { _held_off: held_off };
        let mut covered = 0usize;
        move |m| {
            if matches!(hold, Hold::Paused { .. }) && covered >= PAUSE_BLOCKS {
                hold = Hold::GaveUp; // the owner may go on between two shards
                covered = 0;
                sole.let_waiters_pass(Duration::from_millis(1));
                hold = match sole.pause(me, timeout) {
                    Pause::Paused(again) => Hold::Paused { _held_off: again },
                    Pause::Shared if sole.end(me, timeout) => Hold::Locked,
                    _ => Hold::GaveUp,
                };
            }
            match hold {
                Hold::Paused { .. } => {
                    // SAFETY: every other thread waits until the pause
                    // ends, and none holds a shard (sole.rs, case 8); the
                    // read is done with this shard before the pause can
                    // end.
                    let shard = unsafe { m.get_unchecked() };
                    covered += shard.map.len();
                    Some(Held::Sole(shard))
                }
                Hold::Locked => match timeout {
                    Some(t) => m.lock_for(t).map(Held::Locked),
                    None => Some(Held::Locked(m.lock())),
                },
                Hold::GaveUp => None, // counted as skipped
            }
        }
    }

    #[inline]
    fn shard(&self, key: u64) -> &FutexMutex<Shard> {
        // Top bits pick the shard; hashbrown uses the low bits and top 7
        // bits of its own hash, which is a different function of the key.
        &self.shards[(mix64(key.rotate_left(17)) >> 58) as usize].0
    }

    /// Records an allocation. If the key was already live (a release we did
    /// not see), the old block counts as released so that the counters stay
    /// exact; it is returned.
    #[inline]
    pub fn insert(&self, me: ThreadKey, key: u64, block: Block) -> Option<Block> {
        self.with_shard(me, key, |s| {
            s.inserted += 1;
            let old = s.map.insert(key, block);
            if old.is_some() {
                s.removed += 1;
            }
            old
        })
    }

    /// Records a release; `None` when the key was not live.
    pub fn remove(&self, me: ThreadKey, key: u64) -> Option<Block> {
        self.with_shard(me, key, |s| {
            let old = s.map.remove(&key);
            if old.is_some() {
                s.removed += 1;
            }
            old
        })
    }

    /// Records a release if `accept` approves the live block (a release
    /// call of the wrong kind, e.g. `cuMemFreeHost` on device memory, fails
    /// in the driver and must not drop the block).
    ///
    /// One probe of the table (issue 24: a `get` then a `remove` probed
    /// twice, out of line, on every release: +65 instructions a pair).
    #[inline]
    pub fn remove_if(&self, me: ThreadKey, key: u64, accept: impl FnOnce(&Block) -> bool) -> Option<Block> {
        self.with_shard(me, key, |s| {
            let Shard { map, removed, .. } = s;
            match map.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) if accept(e.get()) => {
                    *removed += 1;
                    Some(e.remove())
                }
                _ => None,
            }
        })
    }

    /// Undoes a [`LiveMap::remove`] whose release call then failed.
    pub fn restore(&self, me: ThreadKey, key: u64, block: Block) {
        self.with_shard(me, key, |s| {
            if s.map.insert(key, block).is_none() {
                s.removed = s.removed.saturating_sub(1);
            } else {
                // Someone inserted the key meanwhile (cannot happen with a
                // correct driver); keep the counters consistent.
                s.inserted += 1;
            }
        })
    }

    pub fn get(&self, me: ThreadKey, key: u64) -> Option<Block> {
        self.with_shard(me, key, |s| s.map.get(&key).copied())
    }

    /// Replaces the block stored under `key`, keeping the counters.
    pub fn update(&self, me: ThreadKey, key: u64, f: impl FnOnce(&mut Block)) -> bool {
        self.with_shard(me, key, |s| match s.map.get_mut(&key) {
            Some(b) => {
                f(b);
                true
            }
            None => false,
        })
    }

    /// Visits every shard under its lock, or, while one thread owns the
    /// map, with that thread held off (sole.rs, case 8). `visit` sees
    /// the shard's blocks and counters together, and must not change the
    /// map. With `timeout`, a shard whose lock cannot be
    /// taken in time is skipped and counted in the return value (used at
    /// exit, where a thread may have died holding a lock; every shard is
    /// skipped when the map's sole owner stays inside its call that long,
    /// or when `me` interrupted its own call).
    pub fn for_each_shard(
        &self,
        me: ThreadKey,
        timeout: Option<Duration>,
        mut visit: impl FnMut(&mut dyn Iterator<Item = (u64, Block)>, MapCounts),
    ) -> usize {
        self.with_every_shard(me, timeout, false, |hold| {
            let mut skipped = 0;
            for shard in &self.shards {
                let Some(held) = hold(&shard.0) else {
                    skipped += 1;
                    continue;
                };
                let counts = MapCounts {
                    inserted: held.inserted,
                    removed: held.removed,
                    moved: held.moved,
                    live: held.map.len() as u64,
                };
                let mut it = held.map.iter().map(|(k, v)| (*k, *v));
                visit(&mut it, counts);
            }
            skipped
        })
        .unwrap_or(SHARDS)
    }

    /// Moves out every block for which `pred` holds (context teardown).
    pub fn drain_where(&self, me: ThreadKey, mut pred: impl FnMut(&Block) -> bool) -> Vec<(u64, Block)> {
        self.with_every_shard(me, None, true, |hold| {
            let mut out = Vec::new();
            for shard in &self.shards {
                let Some(mut s) = hold(&shard.0) else { continue };
                let before = out.len();
                s.map.retain(|k, v| {
                    if pred(v) {
                        out.push((*k, *v));
                        false
                    } else {
                        true
                    }
                });
                s.moved += (out.len() - before) as u64;
            }
            out
        })
        .unwrap_or_default()
    }

    pub fn counts(&self, me: ThreadKey) -> MapCounts {
        let mut total = MapCounts::default();
        self.for_each_shard(me, None, |_, c| total.add(c));
        total
    }

    /// Takes every shard lock (fork prepare handler). The sole owner may
    /// keep sole mode: while it forks, it is in no call of this map, and
    /// other threads, which end sole mode first, wait on the locks.
    pub fn lock_all(&self, me: ThreadKey) {
        if let Some(sole) = self.sole {
            if !sole.is_owner(me) {
                sole.end(me, None);
            }
        }
        for s in &self.shards {
            s.0.raw_lock();
        }
    }

    /// # Safety
    /// Must follow [`LiveMap::lock_all`] on this thread.
    pub unsafe fn unlock_all(&self) {
        for s in &self.shards {
            // SAFETY: the caller took every shard lock with `lock_all` on
            // this thread, so each is ours to release, once.
            unsafe { s.0.raw_unlock() };
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
            shard.map = HashMap::with_hasher(AddrHash);
            shard.inserted = 0;
            shard.removed = 0;
            shard.moved = 0;
            // SAFETY: held since `lock_all` on this thread; `shard` is not
            // used after the release.
            unsafe { s.0.raw_unlock() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{MemoryKind, TraceId};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// The calling thread's key for maps without a sole owner.
    const ME: ThreadKey = 1;

    fn blk(size: u64) -> Block {
        Block::new(size, TraceId(1), MemoryKind::Device, 0, None, 0)
    }

    #[test]
    fn insert_remove_restore_keep_counts() {
        let m = LiveMap::new();
        assert!(m.insert(ME, 0x1000, blk(10)).is_none());
        assert!(m.insert(ME, 0x2000, blk(20)).is_none());
        let b = m.remove(ME, 0x1000).unwrap();
        assert_eq!(b.size(), 10);
        assert!(m.remove(ME, 0x1000).is_none());
        m.restore(ME, 0x1000, b);
        let c = m.counts(ME);
        assert_eq!((c.inserted, c.removed, c.live), (2, 0, 2));
        // A second insert at a live key retires the old block.
        assert_eq!(m.insert(ME, 0x2000, blk(30)).unwrap().size(), 20);
        let c = m.counts(ME);
        assert_eq!(c.inserted - c.removed - c.moved, c.live);
    }

    #[test]
    fn drain_moves_blocks_out() {
        let m = LiveMap::new();
        for i in 0..100u64 {
            m.insert(
                ME,
                0x10000 + i * 512,
                Block::new(i, TraceId(1), MemoryKind::Device, (i % 2) as u8, None, 0),
            );
        }
        let drained = m.drain_where(ME, |b| b.context_slot() == 1);
        assert_eq!(drained.len(), 50);
        let c = m.counts(ME);
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
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let a = (t << 40) | (i << 8);
                        m.insert(t as usize + 1, a, blk(i));
                        // free the previous thread's block of the same index
                        let other = (((t + 7) % 8) << 40) | (i.saturating_sub(1) << 8);
                        m.remove(t as usize + 1, other);
                        i += 1;
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            let mut counts = MapCounts::default();
            let mut seen = 0u64;
            m.for_each_shard(ME, None, |it, c| {
                seen += it.count() as u64;
                counts.add(c);
            });
            assert_eq!(seen, counts.live);
            assert_eq!(counts.inserted - counts.removed - counts.moved, seen);
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
    }

    fn sole_map() -> Arc<LiveMap> {
        let sole: &'static SoleOwner = Box::leak(Box::new(SoleOwner::new()));
        sole.allow();
        Arc::new(LiveMap::with_sole_owner(sole))
    }

    /// `n` keys, spaced as device addresses, that all fall in shard 0.
    fn keys_of_one_shard(m: &LiveMap, base: u64, n: usize) -> Vec<u64> {
        (0..)
            .map(|i| base + i * 256)
            .filter(|&k| std::ptr::eq(m.shard(k), &m.shards[0].0))
            .take(n)
            .collect()
    }

    /// The owner allocates and frees alone, without locks; a second thread
    /// joins (which ends sole mode) and both go on, in the same shard. Each
    /// thread keeps its last block. A call of the owner's running unlocked
    /// beside a locked one would lose counts or corrupt the shard's table
    /// (this test fails when the second thread does not end sole mode).
    #[test]
    fn a_map_owned_alone_switches_to_locks_when_another_thread_comes() {
        let m = sole_map();
        let run = |me: ThreadKey, keys: Vec<u64>, rounds: usize, started: std::sync::mpsc::Sender<()>| {
            let m = m.clone();
            std::thread::spawn(move || {
                for r in 0..rounds {
                    let k = keys[r % keys.len()];
                    assert!(m.insert(me, k, blk(r as u64)).is_none());
                    assert!(m.remove(me, k).is_some());
                    if r == 1000 {
                        let _ = started.send(());
                    }
                }
                m.insert(me, keys[0], blk(1));
            })
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = run(1, keys_of_one_shard(&m, 1 << 40, 64), 400_000, tx.clone());
        rx.recv().unwrap();
        assert!(
            m.sole.unwrap().is_owner(1),
            "the first thread does not own the map"
        );
        let second = run(2, keys_of_one_shard(&m, 2 << 40, 64), 200_000, tx);
        owner.join().unwrap();
        second.join().unwrap();
        let c = m.counts(3);
        assert_eq!((c.inserted, c.removed, c.live), (600_002, 600_000, 2));
        let mut keys = Vec::new();
        m.for_each_shard(3, None, |it, _| keys.extend(it.map(|(k, _)| k)));
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn the_owner_of_a_map_dumps_and_drains_it_without_ending_sole_mode() {
        let m = sole_map();
        m.insert(1, 0x1000, blk(10));
        m.insert(
            1,
            0x2000,
            Block::new(20, TraceId(1), MemoryKind::Device, 1, None, 0),
        );
        assert_eq!(m.counts(1).live, 2);
        assert_eq!(m.drain_where(1, |b| b.context_slot() == 1).len(), 1);
        let c = m.counts(1);
        assert_eq!((c.inserted, c.moved, c.live), (2, 1, 1));
        assert!(m.sole.unwrap().is_owner(1));
    }

    /// A live dump on another thread reads the owner's map exactly while
    /// the owner goes on, and leaves the map owned (sole.rs, case 8). The
    /// reads fail when the owner is not held off; the last check fails
    /// when a read ends sole mode, as every dump did before.
    #[test]
    fn another_thread_reads_a_map_owned_alone_exactly_and_leaves_it_owned() {
        let m = sole_map();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                let keys = keys_of_one_shard(&m, 1 << 40, 64);
                let mut r = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let k = keys[r % keys.len()];
                    assert!(m.insert(1, k, blk(r as u64)).is_none());
                    if r.is_multiple_of(2) {
                        assert!(m.remove(1, k).is_some());
                    }
                    if r % keys.len() == keys.len() - 1 {
                        for &k in &keys {
                            m.remove(1, k);
                        }
                    }
                    if r == 1000 {
                        let _ = tx.send(());
                    }
                    r += 1;
                }
            })
        };
        rx.recv().unwrap();
        for _ in 0..300 {
            let mut counts = MapCounts::default();
            let mut seen = 0u64;
            m.for_each_shard(2, None, |it, c| {
                if c.inserted > 0 {
                    // A slow reader: an owner not held off would change
                    // the shard under it.
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(300) {
                        std::hint::spin_loop();
                    }
                }
                seen += it.count() as u64;
                counts.add(c);
            });
            assert_eq!(seen, counts.live);
            assert_eq!(counts.inserted - counts.removed, seen);
        }
        stop.store(true, Ordering::Relaxed);
        owner.join().unwrap();
        assert!(m.sole.unwrap().is_owner(1), "a read ended sole mode");
    }

    /// Only reads pause the owner: another thread that changes the map
    /// ends sole mode (sole.rs, case 8: a fork's prepare handler run by
    /// the owner takes the shard locks without ending it).
    #[test]
    fn another_thread_that_drains_the_map_ends_sole_mode() {
        let m = sole_map();
        m.insert(1, 0x1000, blk(10));
        assert_eq!(m.drain_where(2, |_| true).len(), 1);
        assert!(!m.sole.unwrap().is_owner(1));
        assert_eq!(m.counts(1).moved, 1);
    }

    /// A reader's pause holds the owner off for the whole read, whatever
    /// the scheduler does: the owner's own sections count its progress,
    /// and a visit that waits for that count to move must not see it move
    /// (sole.rs, case 8). Unlike a check of the counts, this does not rest
    /// on the owner running while the reader reads (on a loaded two-core
    /// machine it mostly did not, and the read came out exact anyway).
    #[test]
    fn the_owner_makes_no_progress_while_another_thread_reads() {
        let m = sole_map();
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let owner = {
            let (m, stop, progress) = (m.clone(), stop.clone(), progress.clone());
            std::thread::spawn(move || {
                let mut r = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = 0x1000 + (r % 64) * 0x1000;
                    m.insert(1, k, blk(r));
                    // Counted inside the owner's section.
                    assert!(m.update(1, k, |_| {
                        progress.fetch_add(1, Ordering::Relaxed);
                    }));
                    m.remove(1, k);
                    r += 1;
                }
            })
        };
        while progress.load(Ordering::Relaxed) < 1000 {
            std::thread::yield_now();
        }
        for _ in 0..20 {
            let mut moved = false;
            let mut first = true;
            m.for_each_shard(2, None, |it, _| {
                let _ = it.count();
                if std::mem::take(&mut first) {
                    let before = progress.load(Ordering::Relaxed);
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_millis(5) {
                        if progress.load(Ordering::Relaxed) != before {
                            moved = true;
                            break;
                        }
                        std::hint::spin_loop();
                    }
                }
            });
            assert!(!moved, "the owner changed the map while another thread read it");
        }
        stop.store(true, Ordering::Relaxed);
        owner.join().unwrap();
        assert!(m.sole.unwrap().is_owner(1), "a read ended sole mode");
    }

    /// A read of a large map gives the pause back every [`PAUSE_BLOCKS`]
    /// blocks, so that the owner waits for about one shard's copy at a
    /// time, not the whole copy (16 ms at 1M blocks); each shard is still
    /// read exactly, and the owner keeps the map.
    #[test]
    fn a_long_read_pauses_the_owner_again_every_pause_blocks() {
        let m = sole_map();
        let sole = m.sole.unwrap();
        let blocks = 6 * PAUSE_BLOCKS as u64;
        for i in 0..blocks {
            m.insert(1, (1 << 40) + i * 256, blk(i));
        }
        let before = sole.pauses();
        let mut total = MapCounts::default();
        let reader = {
            let m = m.clone();
            std::thread::spawn(move || {
                m.for_each_shard(2, None, |it, c| {
                    assert_eq!(it.count() as u64, c.live);
                    total.add(c);
                });
                total
            })
        };
        let total = reader.join().unwrap();
        assert_eq!((total.inserted, total.live), (blocks, blocks));
        let pauses = sole.pauses() - before;
        assert!((6..=7).contains(&pauses), "{pauses} pauses for {blocks} blocks");
        assert!(sole.is_owner(1));
    }

    /// A long read whose next pause times out (the owner stays inside its
    /// section) skips every shard it has not reached: reading them
    /// unlocked, or locked, would run beside the owner's unlocked changes.
    #[test]
    fn a_long_read_whose_next_pause_times_out_skips_the_rest() {
        let m = sole_map();
        let keys = keys_of_one_shard(&m, 1 << 40, PAUSE_BLOCKS);
        for &k in &keys {
            m.insert(1, k, blk(k));
        }
        let mut skipped = 0;
        for _ in 0..10 {
            // The owner starts sections of 5 ms, back to back, once the
            // read is under way: it waits for the first pause, and enters
            // its section as soon as the read gives that pause back (after
            // shard 0, whose blocks fill it).
            let go = Arc::new(AtomicBool::new(false));
            let stop = Arc::new(AtomicBool::new(false));
            let owner = {
                let (m, go, stop, key) = (m.clone(), go.clone(), stop.clone(), keys[0]);
                std::thread::spawn(move || {
                    while !go.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    while !stop.load(Ordering::Relaxed) {
                        assert!(m.update(1, key, |_| std::thread::sleep(Duration::from_millis(5))));
                    }
                })
            };
            skipped = m.for_each_shard(2, Some(Duration::from_millis(1)), |_, _| {
                if !go.swap(true, Ordering::Release) {
                    std::thread::sleep(Duration::from_millis(5)); // the owner now waits
                }
            });
            stop.store(true, Ordering::Relaxed);
            owner.join().unwrap();
            if skipped > 0 {
                break; // else the read paused again before the owner went on
            }
        }
        assert_eq!(skipped, SHARDS - 1, "shards after the timed-out pause were read");
        assert!(m.sole.unwrap().is_owner(1));
    }
}
