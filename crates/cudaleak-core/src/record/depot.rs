//! Trace interning, after LLVM sanitizer_common's StackDepot: each distinct
//! (API, memory kind, native stack, Python stack) is stored once and named
//! by a 32-bit [`TraceId`]; live blocks carry only the id.
//!
//! Lookups are lock-free (the hook path): buckets are singly linked lists
//! of immutable links to immutable nodes, published with a release store
//! and never freed. Inserts take one mutex and re-check the bucket, so two
//! threads that see the same new stack get the same id.
//!
//! The table grows (a fixed 16,384 buckets made 1M distinct
//! stacks, which code generators such as Triton can produce, take 6.75 s):
//! past two traces per bucket, the insert that crosses the line builds a
//! table four times larger with fresh links and publishes it. Readers still
//! walking the old table find every trace that was in it, and a miss goes
//! to the locked path, which looks again in the current table. Old tables
//! are kept (a reader may still be in one); together they are smaller than
//! the current one.
//!
//! Past [`Depot::max_traces`] (`CUDALEAK_MAX_STACKS`) new stacks are not
//! stored: their blocks get the shared id 0 ("allocated by unknown") and
//! [`Depot::dropped`] counts them, for the report's `stacks_dropped`.

use crate::base::hash::mix64;
use crate::base::lock::FutexMutex;
use crate::record::python::PyRawFrame;
use crate::record::{Api, MemoryKind, TraceId};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Buckets of the first table; each growth multiplies them by 4.
const FIRST_BUCKETS: usize = 1 << 12;
/// Traces per bucket, on average, that make the table grow.
const LOAD: usize = 2;
const CHUNK: usize = 4096;
const CHUNKS: usize = 1 << 14;
/// The most ids there can be (about 67 million). Ids are 1-based; 0 is the
/// shared "depot full" trace.
pub const MAX_TRACES: u32 = (CHUNK * CHUNKS) as u32 - 1;
/// The default of `CUDALEAK_MAX_STACKS`.
pub const DEFAULT_MAX_TRACES: u32 = (1 << 22) - 1;

/// What a trace is made of, as captured in a hook.
#[derive(Clone, Copy, Debug)]
pub struct TraceKey<'a> {
    pub api: Api,
    pub kind: MemoryKind,
    /// return addresses, innermost first, the library's own frames removed
    pub native: &'a [u64],
    /// Python frames, innermost first (`capture/python/`)
    pub python: &'a [PyRawFrame],
}

impl TraceKey<'_> {
    /// FxHash-style rounds (rotate, xor, multiply: 3 instructions a word;
    /// this runs on every allocation whose trace is not reused), then one
    /// strong mix for the bucket.
    ///
    /// Four independent lanes, one word each in turn: a single chain makes
    /// every word wait for the previous multiply (about 2 ns a word, 114 ns
    /// for a 60-frame lookup in `benches/hot_paths.rs`); four chains overlap.
    pub fn hash(&self) -> u64 {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        #[inline(always)]
        fn round(lane: &mut u64, word: u64) {
            *lane = (lane.rotate_left(5) ^ word).wrapping_mul(K);
        }
        let seed = (self.api as u64) << 8 | self.kind as u64 | (self.native.len() as u64) << 16;
        let mut lanes = [
            seed,
            seed ^ 0x9e37_79b9_7f4a_7c15,
            seed ^ 0x6a09_e667_f3bc_c909,
            !seed,
        ];
        let mut native = self.native.chunks_exact(4);
        for words in &mut native {
            for (lane, &word) in lanes.iter_mut().zip(words) {
                round(lane, word);
            }
        }
        for (lane, &word) in lanes.iter_mut().zip(native.remainder()) {
            round(lane, word);
        }
        for (i, f) in self.python.iter().enumerate() {
            let word = f.code ^ f.guard.rotate_left(17) ^ ((f.offset as u64) << 40 | f.flags as u64);
            round(&mut lanes[i & 3], word);
        }
        let [a, b, c, d] = lanes;
        mix64(a ^ b.rotate_left(16) ^ c.rotate_left(32) ^ d.rotate_left(48))
    }
}

struct Node {
    hash: u64,
    id: TraceId,
    api: Api,
    kind: MemoryKind,
    native: Box<[u64]>,
    python: Box<[PyRawFrame]>,
}

impl Node {
    fn matches(&self, hash: u64, key: &TraceKey) -> bool {
        self.hash == hash
            && self.api == key.api
            && self.kind == key.kind
            && *self.native == *key.native
            && crate::record::python::frames_bytes(&self.python)
                == crate::record::python::frames_bytes(key.python)
    }
}

/// A stored trace.
#[derive(Clone, Copy, Debug)]
pub struct TraceRef<'a> {
    pub id: TraceId,
    pub api: Api,
    pub kind: MemoryKind,
    pub native: &'a [u64],
    pub python: &'a [PyRawFrame],
}

type Chunk = [AtomicPtr<Node>; CHUNK];

/// One entry of a bucket's chain (a node is in one chain per table).
struct Link {
    node: *const Node,
    next: *const Link,
}

struct Table {
    buckets: Box<[AtomicPtr<Link>]>,
}

impl Table {
    fn new(buckets: usize) -> Table {
        Table {
            buckets: (0..buckets).map(|_| AtomicPtr::new(null_mut())).collect(),
        }
    }

    fn bucket(&self, hash: u64) -> &AtomicPtr<Link> {
        &self.buckets[(hash as usize) & (self.buckets.len() - 1)]
    }

    /// Links `node` at the head of its bucket (under the insert lock).
    fn push(&self, node: *const Node, hash: u64) {
        let bucket = self.bucket(hash);
        let link = Box::into_raw(Box::new(Link {
            node,
            next: bucket.load(Ordering::Relaxed),
        }));
        bucket.store(link, Ordering::Release);
    }
}

pub struct Depot {
    /// the current table; null until the first insert
    table: AtomicPtr<Table>,
    by_id: [AtomicPtr<Chunk>; CHUNKS],
    count: AtomicU32,
    max: AtomicU32,
    dropped: AtomicU64,
    bytes: AtomicU64,
    insert_lock: FutexMutex<()>,
}

impl Default for Depot {
    fn default() -> Self {
        Self::new()
    }
}

impl Depot {
    pub const fn new() -> Depot {
        Depot {
            table: AtomicPtr::new(null_mut()),
            by_id: [const { AtomicPtr::new(null_mut()) }; CHUNKS],
            count: AtomicU32::new(0),
            max: AtomicU32::new(DEFAULT_MAX_TRACES),
            dropped: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            insert_lock: FutexMutex::new(()),
        }
    }

    /// Sets the most traces stored (at most [`MAX_TRACES`]).
    pub fn set_max_traces(&self, max: u32) {
        self.max.store(max.min(MAX_TRACES), Ordering::Relaxed);
    }

    pub fn max_traces(&self) -> u32 {
        self.max.load(Ordering::Relaxed)
    }

    /// Interns that found the depot full (their blocks have no stack).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn find(&self, hash: u64, key: &TraceKey) -> Option<TraceId> {
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() {
            return None;
        }
        // SAFETY: tables, links and nodes are published with Release and
        // never freed.
        let mut p = unsafe { (*table).bucket(hash).load(Ordering::Acquire) };
        while !p.is_null() {
            // SAFETY: `p` is non-null: a bucket's head (stored with Release,
            // loaded with Acquire) or the `next` of such a link, set before
            // it was published; links are never freed.
            let link = unsafe { &*p };
            // SAFETY: a link's node is made and set before the link is
            // published (the bucket's Release store, read with Acquire),
            // and nodes are never freed.
            let n = unsafe { &*link.node };
            if n.matches(hash, key) {
                return Some(n.id);
            }
            p = link.next.cast_mut();
        }
        None
    }

    /// The current table, grown first if `count` traces overfill it
    /// (under the insert lock).
    fn table_for(&self, count: usize) -> &Table {
        let mut table = self.table.load(Ordering::Acquire);
        let size = if table.is_null() {
            0
        } else {
            // SAFETY: non-null, and tables are never freed (a grown table
            // replaces the pointer; the old one is leaked on purpose).
            unsafe { &*table }.buckets.len()
        };
        if size == 0 || count > size * LOAD {
            let grown = Table::new(if size == 0 { FIRST_BUCKETS } else { size * 4 });
            for id in 1..=self.count.load(Ordering::Relaxed) {
                if let Some(node) = self.node(TraceId(id)) {
                    grown.push(node, node.hash);
                }
            }
            table = Box::into_raw(Box::new(grown));
            self.table.store(table, Ordering::Release);
        }
        // SAFETY: non-null here (loaded non-null, or just made from a Box),
        // and tables are never freed.
        unsafe { &*table }
    }

    /// Returns the id of `key`, storing it first if it is new. `on_new` runs
    /// once per new trace, before its id is published, under the insert lock
    /// (the preload crate copies Python code-object data there).
    pub fn intern(&self, key: &TraceKey, on_new: impl FnOnce(&TraceKey)) -> TraceId {
        let hash = key.hash();
        if let Some(id) = self.find(hash, key) {
            return id;
        }
        let _guard = self.insert_lock.lock();
        if let Some(id) = self.find(hash, key) {
            return id;
        }
        let n = self.count.load(Ordering::Relaxed);
        if n >= self.max_traces() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return TraceId(0);
        }
        let id = n + 1;
        let chunk_index = id as usize / CHUNK;
        let mut chunk = self.by_id[chunk_index].load(Ordering::Acquire);
        if chunk.is_null() {
            let fresh: Box<Chunk> = Box::new([const { AtomicPtr::new(null_mut()) }; CHUNK]);
            chunk = Box::into_raw(fresh);
            self.by_id[chunk_index].store(chunk, Ordering::Release);
        }
        on_new(key);
        let table = self.table_for(id as usize);
        let node = Box::into_raw(Box::new(Node {
            hash,
            id: TraceId(id),
            api: key.api,
            kind: key.kind,
            native: key.native.into(),
            python: key.python.into(),
        }));
        // SAFETY: chunk is live and never freed.
        unsafe { (*chunk)[id as usize % CHUNK].store(node, Ordering::Release) };
        table.push(node, hash);
        self.count.store(id, Ordering::Release);
        self.bytes.fetch_add(
            (std::mem::size_of::<Node>()
                + std::mem::size_of::<Link>()
                + key.native.len() * 8
                + std::mem::size_of_val(key.python)) as u64,
            Ordering::Relaxed,
        );
        TraceId(id)
    }

    fn node(&self, id: TraceId) -> Option<&Node> {
        if id.0 == 0 || id.0 > self.count.load(Ordering::Acquire) {
            return None;
        }
        let chunk = self.by_id[id.0 as usize / CHUNK].load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: chunk and node are published with Release, never freed.
        let p = unsafe { (*chunk)[id.0 as usize % CHUNK].load(Ordering::Acquire) };
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is non-null, was published with Release (read with
        // Acquire above), and nodes are never freed.
        Some(unsafe { &*p })
    }

    pub fn get(&self, id: TraceId) -> Option<TraceRef<'_>> {
        let n = self.node(id)?;
        Some(TraceRef {
            id: n.id,
            api: n.api,
            kind: n.kind,
            native: &n.native,
            python: &n.python,
        })
    }

    /// Number of distinct traces stored.
    pub fn len(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held by stored traces (for docs/performance.md).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Fork prepare: no insert may be half done when the child starts.
    pub fn lock_for_fork(&self) {
        self.insert_lock.raw_lock();
    }

    /// # Safety
    /// Must follow [`Depot::lock_for_fork`] on this thread.
    pub unsafe fn unlock_after_fork(&self) {
        // SAFETY: the caller took `insert_lock` with `lock_for_fork` on this
        // thread (the fork prepare handler), so it is ours to release.
        unsafe { self.insert_lock.raw_unlock() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key<'a>(native: &'a [u64], python: &'a [PyRawFrame]) -> TraceKey<'a> {
        TraceKey {
            api: Api::cuMemAlloc_v2,
            kind: MemoryKind::Device,
            native,
            python,
        }
    }

    #[test]
    fn same_stack_same_id_and_round_trip() {
        let d = Box::new(Depot::new());
        let a = d.intern(&key(&[1, 2, 3], &[]), |_| {});
        let b = d.intern(&key(&[1, 2, 3], &[]), |_| panic!("not new"));
        let c = d.intern(&key(&[1, 2, 4], &[]), |_| {});
        assert_eq!(a, b);
        assert_ne!(a, c);
        let t = d.get(c).unwrap();
        assert_eq!(t.native, &[1, 2, 4]);
        assert_eq!(d.len(), 2);
        assert!(d.get(TraceId(0)).is_none());
        assert!(d.get(TraceId(3)).is_none());
    }

    #[test]
    fn api_kind_and_python_are_part_of_the_key() {
        let d = Box::new(Depot::new());
        let py = [PyRawFrame {
            code: 0x10,
            guard: 1,
            offset: 4,
            flags: 0,
        }];
        let base = d.intern(&key(&[9], &[]), |_| {});
        let with_py = d.intern(&key(&[9], &py), |_| {});
        let other_api = d.intern(
            &TraceKey {
                api: Api::cuMemAllocManaged,
                ..key(&[9], &[])
            },
            |_| {},
        );
        assert_eq!(
            [base, with_py, other_api]
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            3
        );
        assert_eq!(d.get(with_py).unwrap().python, &py);
    }

    #[test]
    fn the_table_grows_and_every_trace_is_still_found() {
        let d = Box::new(Depot::new());
        let n = (FIRST_BUCKETS * LOAD * 4 * LOAD + 7) as u64; // two growths
        let ids: Vec<TraceId> = (0..n).map(|i| d.intern(&key(&[i, !i], &[]), |_| {})).collect();
        assert_eq!(d.len() as u64, n);
        for (i, id) in ids.iter().enumerate() {
            let i = i as u64;
            assert_eq!(d.intern(&key(&[i, !i], &[]), |_| panic!("not new")), *id);
            assert_eq!(d.get(*id).unwrap().native, &[i, !i]);
        }
        // SAFETY: the test's own depot.
        let buckets = unsafe { &*d.table.load(Ordering::Acquire) }.buckets.len();
        assert_eq!(buckets, FIRST_BUCKETS * 16);
        assert_eq!(d.dropped(), 0);
    }

    #[test]
    fn past_the_cap_new_stacks_are_counted_as_dropped() {
        let d = Box::new(Depot::new());
        d.set_max_traces(3);
        let kept: Vec<TraceId> = (0..3u64).map(|i| d.intern(&key(&[i], &[]), |_| {})).collect();
        assert!(kept.iter().all(|id| id.0 != 0));
        assert_eq!(d.intern(&key(&[100], &[]), |_| panic!("not stored")), TraceId(0));
        assert_eq!(d.intern(&key(&[101], &[]), |_| panic!("not stored")), TraceId(0));
        // Known stacks are still found.
        assert_eq!(d.intern(&key(&[1], &[]), |_| panic!("not new")), kept[1]);
        assert_eq!((d.len(), d.dropped()), (3, 2));
    }

    #[test]
    fn readers_find_everything_while_the_table_grows() {
        let d = Arc::new(Depot::new());
        let first: Vec<TraceId> = (0..1000u64).map(|i| d.intern(&key(&[i], &[]), |_| {})).collect();
        let reader = {
            let d = d.clone();
            let first = first.clone();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    for (i, id) in first.iter().enumerate() {
                        assert_eq!(d.intern(&key(&[i as u64], &[]), |_| panic!("lost {i}")), *id);
                    }
                }
            })
        };
        for i in 1000..(FIRST_BUCKETS * LOAD * 5) as u64 {
            d.intern(&key(&[i], &[]), |_| {});
        }
        reader.join().unwrap();
    }

    #[test]
    fn concurrent_interning_agrees() {
        let d = Arc::new(Depot::new());
        let ids: Vec<Vec<TraceId>> = (0..4)
            .map(|_| {
                let d = d.clone();
                std::thread::spawn(move || {
                    (0..2000u64)
                        .map(|i| d.intern(&key(&[i, i + 1], &[]), |_| {}))
                        .collect()
                })
            })
            .map(|t| t.join().unwrap())
            .collect();
        for v in &ids[1..] {
            assert_eq!(v, &ids[0]);
        }
        assert_eq!(d.len(), 2000);
    }
}
