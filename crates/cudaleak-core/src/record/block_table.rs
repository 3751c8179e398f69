//! The table of one live-map shard: address (or VMM handle) → [`Block`],
//! open addressing with linear probing and tombstones.
//!
//! Why not hashbrown: a program may end inside a hook, its thread stopped
//! for good in the middle of an insert (SIGTERM, then `exit(0)` from the
//! handler), and the report written then must still read this table
//! (`live_map.rs`, taking the shard over). So the table is consistent at
//! every instruction of the thread that changes it:
//! 1. An entry is published by one aligned 8-byte store of its key, after
//!    its block is written; a removal is one store of the tombstone. A
//!    reader sees an entry whole or not at all. (hashbrown writes the
//!    control byte before the value, and moves entries when it grows.)
//! 2. Growing, or sweeping tombstones, builds a new buffer to the side and
//!    publishes it with one store of the buffer pointer; the old buffer is
//!    freed after. A reader sees the old table or the new one, both whole.
//! 3. The counts (`live`, `used`) may lag one change behind the entries;
//!    readers that take a table over count its entries themselves.
//!
//! Keys are stored plus one, so that 0 (the empty slot) stays free for any
//! key but `u64::MAX`, and `u64::MAX` (the tombstone) for any but
//! `u64::MAX - 1`: neither is an address, and no driver hands them out as
//! handles. Those two keys are not stored (`insert` says so).
//!
//! Memory: slots are 24 bytes; the table grows at 3/4 full and is at
//! least 3/8 full after growing, so a live block costs at most 64 bytes
//! (the budget in `record/mod.rs`).

use crate::base::hash::mix64;
use crate::record::Block;
use std::alloc::Layout;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;
const MIN_SLOTS: usize = 16;

/// One slot: the stored key (key + 1; [`EMPTY`], [`TOMBSTONE`]) and the
/// block's two words, as atomics so that another thread may read a table
/// whose changing thread stopped for good (plain loads and stores on
/// x86-64 and aarch64).
struct Slot {
    key: AtomicU64,
    packed: AtomicU64,
    trace_epoch: AtomicU64,
}

/// Where a key is, or where it would go ([`BlockTable::probe`]).
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// the key's slot, or the free slot it would take (`usize::MAX`: none)
    index: usize,
    /// the key's block, if it is there
    pub found: Option<Block>,
    /// the free slot was never used (not a tombstone)
    fills_empty: bool,
}

/// Why an insert stored nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotStored {
    /// `u64::MAX - 1` or `u64::MAX`: no address, no handle a driver gives
    Key,
    /// no memory for a larger table
    Memory,
}

/// A buffer: its mask (slots - 1), then the slots.
#[repr(C)]
struct Buffer {
    mask: usize,
    slots: [Slot; 0],
}

pub struct BlockTable {
    buffer: AtomicPtr<Buffer>,
    /// entries
    live: AtomicUsize,
    /// entries and tombstones
    used: AtomicUsize,
}

// The atomics make every field Sync; the raw buffer is owned by the table.
// SAFETY: the buffer is reached only through the table's methods, which
// the live map calls under its shard lock (or, for reads of a stopped
// thread's shard, while that thread never runs again).
unsafe impl Send for BlockTable {}
// SAFETY: shared references reach the buffer only through the table's
// methods, which the live map calls under its shard lock (or on a stopped
// thread's shard, whose thread never runs again): no two threads touch it
// at once.
unsafe impl Sync for BlockTable {}

impl Default for BlockTable {
    fn default() -> Self {
        Self::new()
    }
}

fn layout(slots: usize) -> Layout {
    Layout::new::<Buffer>()
        .extend(Layout::array::<Slot>(slots).expect("slot array"))
        .expect("table layout")
        .0
        .pad_to_align()
}

impl BlockTable {
    pub const fn new() -> BlockTable {
        BlockTable {
            buffer: AtomicPtr::new(std::ptr::null_mut()),
            live: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slots of the current buffer (empty before the first insert).
    #[inline]
    fn slots(&self) -> &[Slot] {
        let b = self.buffer.load(Ordering::Acquire);
        if b.is_null() {
            return &[];
        }
        // SAFETY: a published buffer: `mask + 1` initialized slots follow
        // its header, and it lives until the table replaces or drops it,
        // which needs `&mut self` or the shard lock the caller holds.
        unsafe {
            let n = (*b).mask + 1;
            std::slice::from_raw_parts(std::ptr::addr_of!((*b).slots).cast::<Slot>(), n)
        }
    }

    fn home(key: u64, mask: usize) -> usize {
        mix64(key) as usize & mask
    }

    #[inline]
    fn read(slot: &Slot) -> Block {
        Block::from_words(
            slot.packed.load(Ordering::Relaxed),
            slot.trace_epoch.load(Ordering::Relaxed),
        )
    }

    /// Where `key` is, or where it would go: one probe, for a caller that
    /// decides between finding and changing (the live map, under its
    /// shard lock: the table may not change in between).
    #[inline]
    pub fn probe(&self, key: u64) -> Probe {
        self.probe_hashed(key, mix64(key))
    }

    /// [`BlockTable::probe`] of a key whose [`mix64`] the caller has
    /// already (the live map picks the shard with it).
    #[inline]
    pub fn probe_hashed(&self, key: u64, hash: u64) -> Probe {
        debug_assert_eq!(hash, mix64(key));
        let stored = key.wrapping_add(1);
        let slots = self.slots();
        let none = Probe {
            index: usize::MAX,
            found: None,
            fills_empty: false,
        };
        if slots.is_empty() || stored == EMPTY || stored == TOMBSTONE {
            return none;
        }
        let mask = slots.len() - 1;
        let mut i = hash as usize & mask;
        let mut reuse = None;
        for _ in 0..slots.len() {
            match slots[i].key.load(Ordering::Relaxed) {
                EMPTY => {
                    return Probe {
                        index: reuse.unwrap_or(i),
                        found: None,
                        fills_empty: reuse.is_none(),
                    }
                }
                TOMBSTONE => {
                    reuse.get_or_insert(i);
                }
                k if k == stored => {
                    return Probe {
                        index: i,
                        found: Some(Self::read(&slots[i])),
                        fills_empty: false,
                    }
                }
                _ => {}
            }
            i = (i + 1) & mask;
        }
        Probe {
            index: reuse.unwrap_or(usize::MAX),
            ..none
        }
    }

    /// Stores `block` under `key` where [`BlockTable::probe`] of that key
    /// found its place (no change to the table in between); as
    /// [`BlockTable::insert`].
    #[inline]
    pub fn insert_at(&self, p: &Probe, key: u64, block: Block) -> Result<Option<Block>, NotStored> {
        let slots = self.slots();
        let used = self.used.load(Ordering::Relaxed);
        let stored = key.wrapping_add(1);
        if p.index >= slots.len() || (p.fills_empty && (used + 1) * 4 > slots.len() * 3) {
            // No room where the probe looked: grow, and probe again.
            return self.insert(key, block);
        }
        let slot = &slots[p.index];
        if p.found.is_some() {
            // A replacement is two stores a reader might see apart: the
            // key is taken out first, then put back.
            slot.key.store(TOMBSTONE, Ordering::Release);
            Self::write(slot, block);
            slot.key.store(stored, Ordering::Release);
            return Ok(p.found);
        }
        Self::write(slot, block);
        slot.key.store(stored, Ordering::Release);
        if p.fills_empty {
            self.used.store(used + 1, Ordering::Relaxed);
        }
        self.live.store(self.len() + 1, Ordering::Relaxed);
        Ok(None)
    }

    /// Removes the entry [`BlockTable::probe`] found; its block.
    #[inline]
    pub fn remove_at(&self, p: &Probe) -> Option<Block> {
        let b = p.found?;
        self.slots()[p.index].key.store(TOMBSTONE, Ordering::Release);
        self.live.store(self.len() - 1, Ordering::Relaxed);
        Some(b)
    }

    /// The slot holding `key`, if any.
    fn find(&self, key: u64) -> Option<&Slot> {
        let stored = key.wrapping_add(1);
        let slots = self.slots();
        if slots.is_empty() || stored == EMPTY || stored == TOMBSTONE {
            return None;
        }
        let mask = slots.len() - 1;
        let mut i = Self::home(key, mask);
        for _ in 0..slots.len() {
            match slots[i].key.load(Ordering::Relaxed) {
                EMPTY => return None,
                k if k == stored => return Some(&slots[i]),
                _ => i = (i + 1) & mask,
            }
        }
        None
    }

    pub fn get(&self, key: u64) -> Option<Block> {
        self.find(key).map(Self::read)
    }

    /// Stores `block` under `key`; the block it replaces, if any. `Err`
    /// for the two keys that cannot be stored (`u64::MAX - 1`, `u64::MAX`)
    /// and when no memory could be had for a larger table: nothing changed.
    pub fn insert(&self, key: u64, block: Block) -> Result<Option<Block>, NotStored> {
        let stored = key.wrapping_add(1);
        if stored == EMPTY || stored == TOMBSTONE {
            return Err(NotStored::Key);
        }
        loop {
            let slots = self.slots();
            if slots.is_empty() {
                if !self.rebuild(1) {
                    return Err(NotStored::Memory);
                }
                continue;
            }
            // One probe: the key's slot, or the first free one on its way.
            let mask = slots.len() - 1;
            let mut i = Self::home(key, mask);
            let mut reuse = None;
            let target = loop {
                match slots[i].key.load(Ordering::Relaxed) {
                    EMPTY => break reuse.unwrap_or(i),
                    TOMBSTONE => {
                        reuse.get_or_insert(i);
                    }
                    k if k == stored => {
                        let slot = &slots[i];
                        let old = Self::read(slot);
                        // A replacement is two stores a reader might see
                        // apart: the key is taken out first, then put back.
                        slot.key.store(TOMBSTONE, Ordering::Release);
                        Self::write(slot, block);
                        slot.key.store(stored, Ordering::Release);
                        return Ok(Some(old));
                    }
                    _ => {}
                }
                i = (i + 1) & mask;
            };
            let fills_empty = slots[target].key.load(Ordering::Relaxed) == EMPTY;
            let used = self.used.load(Ordering::Relaxed);
            if fills_empty && (used + 1) * 4 > slots.len() * 3 {
                if !self.rebuild(self.len() + 1) {
                    return Err(NotStored::Memory);
                }
                continue;
            }
            Self::write(&slots[target], block);
            slots[target].key.store(stored, Ordering::Release);
            if fills_empty {
                self.used.store(used + 1, Ordering::Relaxed);
            }
            self.live.store(self.len() + 1, Ordering::Relaxed);
            return Ok(None);
        }
    }

    #[inline]
    fn write(slot: &Slot, block: Block) {
        let (packed, trace_epoch) = block.to_words();
        slot.packed.store(packed, Ordering::Relaxed);
        slot.trace_epoch.store(trace_epoch, Ordering::Relaxed);
    }

    /// Removes `key` if `accept` approves its block; the block.
    pub fn remove_if(&self, key: u64, accept: impl FnOnce(&Block) -> bool) -> Option<Block> {
        let slot = self.find(key)?;
        let block = Self::read(slot);
        if !accept(&block) {
            return None;
        }
        slot.key.store(TOMBSTONE, Ordering::Release);
        self.live.store(self.len() - 1, Ordering::Relaxed);
        Some(block)
    }

    /// Every entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.slots()
            .iter()
            .filter_map(|s| match s.key.load(Ordering::Acquire) {
                EMPTY | TOMBSTONE => None,
                k => Some((k.wrapping_sub(1), Self::read(s))),
            })
    }

    /// Removes every entry `pred` picks; they are pushed to `out`.
    pub fn drain_where(&self, mut pred: impl FnMut(&Block) -> bool, out: &mut Vec<(u64, Block)>) {
        for s in self.slots() {
            match s.key.load(Ordering::Relaxed) {
                EMPTY | TOMBSTONE => {}
                k => {
                    let b = Self::read(s);
                    if pred(&b) {
                        s.key.store(TOMBSTONE, Ordering::Release);
                        self.live.store(self.len() - 1, Ordering::Relaxed);
                        out.push((k.wrapping_sub(1), b));
                    }
                }
            }
        }
    }

    /// Moves the entries into a new buffer with room for `need` of them,
    /// and publishes it (case 2); false when no memory could be had.
    #[cold]
    fn rebuild(&self, need: usize) -> bool {
        let mut slots = MIN_SLOTS;
        while need * 2 > slots {
            slots *= 2;
        }
        let layout = layout(slots);
        // SAFETY: a non-zero layout; zeroed memory is a valid buffer whose
        // slots are all EMPTY (every atomic 0).
        let fresh = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Buffer>();
        if fresh.is_null() {
            return false;
        }
        let mask = slots - 1;
        // SAFETY: the new buffer is ours alone until published; its header
        // and `slots` slots lie within the allocation.
        unsafe {
            (*fresh).mask = mask;
            let new_slots =
                std::slice::from_raw_parts(std::ptr::addr_of!((*fresh).slots).cast::<Slot>(), slots);
            let mut live = 0;
            for s in self.slots() {
                let k = s.key.load(Ordering::Relaxed);
                if k == EMPTY || k == TOMBSTONE {
                    continue;
                }
                let mut i = Self::home(k.wrapping_sub(1), mask);
                while new_slots[i].key.load(Ordering::Relaxed) != EMPTY {
                    i = (i + 1) & mask;
                }
                Self::write(&new_slots[i], Self::read(s));
                new_slots[i].key.store(k, Ordering::Relaxed);
                live += 1;
            }
            let old = self.buffer.swap(fresh, Ordering::Release);
            self.used.store(live, Ordering::Relaxed);
            self.live.store(live, Ordering::Relaxed);
            Self::free(old);
        }
        true
    }

    /// # Safety
    /// `b` is null or a buffer of this table no longer published.
    unsafe fn free(b: *mut Buffer) {
        if !b.is_null() {
            // SAFETY: allocated by `rebuild` with the layout of its size.
            unsafe { std::alloc::dealloc(b.cast(), layout((*b).mask + 1)) };
        }
    }

    /// Empties the table and gives its memory back.
    pub fn clear(&mut self) {
        let old = self.buffer.swap(std::ptr::null_mut(), Ordering::Release);
        self.live.store(0, Ordering::Relaxed);
        self.used.store(0, Ordering::Relaxed);
        // SAFETY: unpublished just above; `&mut self` excludes readers.
        unsafe { Self::free(old) };
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{MemoryKind, TraceId};
    use std::collections::HashMap;

    fn block(n: u64) -> Block {
        Block::new(n, TraceId(n as u32), MemoryKind::Device, 0, Some(0), 0)
    }

    #[test]
    fn keeps_what_a_hash_map_keeps_through_churn_and_growth() {
        let t = BlockTable::new();
        let mut reference = HashMap::new();
        let mut x = 1u64;
        for round in 0..200_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // A few hundred keys, reused (a driver hands addresses out again).
            let key = (x >> 40) % 700 * 256;
            if round % 3 == 0 {
                assert_eq!(
                    t.remove_if(key, |_| true),
                    reference.remove(&key),
                    "round {round}"
                );
            } else {
                assert_eq!(
                    t.insert(key, block(round)).unwrap(),
                    reference.insert(key, block(round))
                );
            }
            assert_eq!(t.len(), reference.len());
        }
        let mut all: Vec<_> = t.iter().collect();
        all.sort_by_key(|e| e.0);
        let mut want: Vec<_> = reference.into_iter().collect();
        want.sort_by_key(|e| e.0);
        assert_eq!(all, want);
    }

    #[test]
    fn key_zero_is_a_key_and_the_two_highest_are_refused() {
        let t = BlockTable::new();
        assert_eq!(t.insert(0, block(1)), Ok(None));
        assert_eq!(t.get(0), Some(block(1)));
        assert_eq!(t.insert(u64::MAX, block(2)), Err(NotStored::Key));
        assert_eq!(t.insert(u64::MAX - 1, block(3)), Err(NotStored::Key));
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove_if(0, |b| b.size() == 2), None);
        assert_eq!(t.remove_if(0, |b| b.size() == 1), Some(block(1)));
        assert!(t.is_empty());
    }

    #[test]
    fn a_million_blocks_cost_at_most_64_bytes_each() {
        let t = BlockTable::new();
        for n in 1..=1_000_000u64 {
            t.insert(n << 12, block(n)).unwrap();
            if n.is_power_of_two() || n % 99_991 == 0 {
                let bytes = std::mem::size_of_val(t.slots());
                assert!(bytes as u64 <= 64 * n.max(8), "{n} blocks in {bytes} bytes");
            }
        }
        assert_eq!(t.iter().count(), 1_000_000);
    }

    #[test]
    fn tombstones_are_swept_and_the_table_stays_small_under_churn() {
        let t = BlockTable::new();
        for n in 0..1_000_000u64 {
            t.insert(n << 12, block(n)).unwrap();
            t.remove_if(n << 12, |_| true).unwrap();
        }
        assert!(t.is_empty());
        assert!(
            t.slots().len() <= MIN_SLOTS,
            "{} slots for nothing",
            t.slots().len()
        );
    }

    #[test]
    fn a_probe_then_a_change_is_an_insert_or_a_removal() {
        let t = BlockTable::new();
        let mut reference = HashMap::new();
        let mut x = 7u64;
        for round in 0..100_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = (x >> 40) % 300 * 512;
            let p = t.probe(key);
            assert_eq!(p.found, reference.get(&key).copied(), "round {round}");
            if round % 3 == 0 {
                assert_eq!(t.remove_at(&p), reference.remove(&key));
            } else {
                assert_eq!(
                    t.insert_at(&p, key, block(round)).unwrap(),
                    reference.insert(key, block(round))
                );
            }
            assert_eq!(t.len(), reference.len());
        }
    }
}
