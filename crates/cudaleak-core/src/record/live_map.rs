//! The concurrent map of live blocks: address (or VMM handle) → [`Block`].
//!
//! 64 shards, each a [`FutexMutex`] over a hashbrown map plus counters that
//! change only under that shard's lock. That is what makes a dump exact
//! while other threads keep allocating: the dump visits one shard at a time,
//! and within a shard `inserted - removed - moved == len` always holds, so
//! the sums over shards satisfy `allocations - frees == live blocks` no
//! matter how traffic interleaves with the dump. A dump never holds more
//! than one shard lock, so allocating threads wait at most one shard's copy.

use crate::base::hash::{mix64, AddrHash};
use crate::base::lock::FutexMutex;
use crate::record::Block;
use std::collections::HashMap;
use std::time::Duration;

pub const SHARDS: usize = 64;

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
        LiveMap {
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

    #[inline]
    fn shard(&self, key: u64) -> &FutexMutex<Shard> {
        // Top bits pick the shard; hashbrown uses the low bits and top 7
        // bits of its own hash, which is a different function of the key.
        &self.shards[(mix64(key.rotate_left(17)) >> 58) as usize].0
    }

    /// Records an allocation. If the key was already live (a release we did
    /// not see), the old block counts as released so that the counters stay
    /// exact; it is returned.
    pub fn insert(&self, key: u64, block: Block) -> Option<Block> {
        let mut s = self.shard(key).lock();
        s.inserted += 1;
        let old = s.map.insert(key, block);
        if old.is_some() {
            s.removed += 1;
        }
        old
    }

    /// Records a release; `None` when the key was not live.
    pub fn remove(&self, key: u64) -> Option<Block> {
        let mut s = self.shard(key).lock();
        let old = s.map.remove(&key);
        if old.is_some() {
            s.removed += 1;
        }
        old
    }

    /// Records a release if `accept` approves the live block (a release
    /// call of the wrong kind, e.g. `cuMemFreeHost` on device memory, fails
    /// in the driver and must not drop the block).
    ///
    /// One probe of the table (issue 24: a `get` then a `remove` probed
    /// twice, out of line, on every release: +65 instructions a pair).
    #[inline]
    pub fn remove_if(&self, key: u64, accept: impl FnOnce(&Block) -> bool) -> Option<Block> {
        let mut guard = self.shard(key).lock();
        let Shard { map, removed, .. } = &mut *guard;
        match map.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) if accept(e.get()) => {
                *removed += 1;
                Some(e.remove())
            }
            _ => None,
        }
    }

    /// Undoes a [`LiveMap::remove`] whose release call then failed.
    pub fn restore(&self, key: u64, block: Block) {
        let mut s = self.shard(key).lock();
        if s.map.insert(key, block).is_none() {
            s.removed = s.removed.saturating_sub(1);
        } else {
            // Someone inserted the key meanwhile (cannot happen with a
            // correct driver); keep the counters consistent.
            s.inserted += 1;
        }
    }

    pub fn get(&self, key: u64) -> Option<Block> {
        self.shard(key).lock().map.get(&key).copied()
    }

    /// Replaces the block stored under `key`, keeping the counters.
    pub fn update(&self, key: u64, f: impl FnOnce(&mut Block)) -> bool {
        let mut s = self.shard(key).lock();
        match s.map.get_mut(&key) {
            Some(b) => {
                f(b);
                true
            }
            None => false,
        }
    }

    /// Visits every shard under its lock. `visit` sees the shard's blocks
    /// and counters together. With `timeout`, a shard whose lock cannot be
    /// taken in time is skipped and counted in the return value (used at
    /// exit, where a thread may have died holding a lock).
    pub fn for_each_shard(
        &self,
        timeout: Option<Duration>,
        mut visit: impl FnMut(&mut dyn Iterator<Item = (u64, Block)>, MapCounts),
    ) -> usize {
        let mut skipped = 0;
        for shard in &self.shards {
            let guard = match timeout {
                Some(t) => match shard.0.lock_for(t) {
                    Some(g) => g,
                    None => {
                        skipped += 1;
                        continue;
                    }
                },
                None => shard.0.lock(),
            };
            let counts = MapCounts {
                inserted: guard.inserted,
                removed: guard.removed,
                moved: guard.moved,
                live: guard.map.len() as u64,
            };
            let mut it = guard.map.iter().map(|(k, v)| (*k, *v));
            visit(&mut it, counts);
        }
        skipped
    }

    /// Moves out every block for which `pred` holds (context teardown).
    pub fn drain_where(&self, mut pred: impl FnMut(&Block) -> bool) -> Vec<(u64, Block)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut s = shard.0.lock();
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
    }

    pub fn counts(&self) -> MapCounts {
        let mut total = MapCounts::default();
        self.for_each_shard(None, |_, c| total.add(c));
        total
    }

    /// Takes every shard lock (fork prepare handler).
    pub fn lock_all(&self) {
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

    fn blk(size: u64) -> Block {
        Block::new(size, TraceId(1), MemoryKind::Device, 0, None, 0)
    }

    #[test]
    fn insert_remove_restore_keep_counts() {
        let m = LiveMap::new();
        assert!(m.insert(0x1000, blk(10)).is_none());
        assert!(m.insert(0x2000, blk(20)).is_none());
        let b = m.remove(0x1000).unwrap();
        assert_eq!(b.size(), 10);
        assert!(m.remove(0x1000).is_none());
        m.restore(0x1000, b);
        let c = m.counts();
        assert_eq!((c.inserted, c.removed, c.live), (2, 0, 2));
        // A second insert at a live key retires the old block.
        assert_eq!(m.insert(0x2000, blk(30)).unwrap().size(), 20);
        let c = m.counts();
        assert_eq!(c.inserted - c.removed - c.moved, c.live);
    }

    #[test]
    fn drain_moves_blocks_out() {
        let m = LiveMap::new();
        for i in 0..100u64 {
            m.insert(
                0x10000 + i * 512,
                Block::new(i, TraceId(1), MemoryKind::Device, (i % 2) as u8, None, 0),
            );
        }
        let drained = m.drain_where(|b| b.context_slot() == 1);
        assert_eq!(drained.len(), 50);
        let c = m.counts();
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
                        m.insert(a, blk(i));
                        // free the previous thread's block of the same index
                        let other = (((t + 7) % 8) << 40) | (i.saturating_sub(1) << 8);
                        m.remove(other);
                        i += 1;
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            let mut counts = MapCounts::default();
            let mut seen = 0u64;
            m.for_each_shard(None, |it, c| {
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
}
