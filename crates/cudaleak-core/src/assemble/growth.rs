//! Growth since the previous dump and trend flags, per group.

use crate::report::group_key::KeyDigest;
use crate::report::Trend;
use std::collections::HashMap;

/// Per-group history across the dumps of one process, by the digest of
/// the key that groups a dump ([`KeyDigest`] of a
/// [`GroupKey`](crate::report::group_key::GroupKey)): a group cannot "grow" by
/// moving between two interpreter call sites. 16 bytes of key per group,
/// not its symbolized stack.
pub struct GrowthTracker<K = KeyDigest> {
    dumps: u32,
    history: HashMap<K, History>,
}

impl<K> Default for GrowthTracker<K> {
    fn default() -> Self {
        GrowthTracker {
            dumps: 0,
            history: HashMap::new(),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct History {
    blocks: u64,
    bytes: u64,
    /// consecutive dumps, ending with the latest, at which bytes grew
    streak: u32,
    /// grew at a dump after the one that first saw it
    grew_later: bool,
    /// the dump that first saw the group (since it was last absent)
    first_seen: u32,
    /// the dump that last saw the group
    seen_at: u32,
}

/// Dumps needed before trend flags are given.
pub const TREND_MIN_DUMPS: u32 = 3;

/// How one trace changed at the latest dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub blocks_delta: i64,
    pub bytes_delta: i64,
    pub trend: Option<Trend>,
}

impl<K: Clone + Eq + std::hash::Hash> GrowthTracker<K> {
    /// Records one dump ((group, blocks, bytes) for each group present)
    /// and returns each group's change since the previous dump (since
    /// process start for the first), in the order given. A key is hashed
    /// once per dump and cloned only the first time it is seen.
    pub fn observe<'a>(&mut self, current: impl IntoIterator<Item = (&'a K, u64, u64)>) -> Vec<Change>
    where
        K: 'a,
    {
        self.dumps += 1;
        let dump = self.dumps;
        let mut out = Vec::new();
        for (id, blocks, bytes) in current {
            let h = match self.history.get_mut(id) {
                Some(h) => h,
                None => self.history.entry(id.clone()).or_insert(History {
                    first_seen: dump,
                    ..History::default()
                }),
            };
            h.seen_at = dump;
            let grew = bytes > h.bytes;
            h.streak = if grew { h.streak + 1 } else { 0 };
            h.grew_later |= grew && dump > h.first_seen;
            // A group allocated once and never freed grew only at the dump
            // that first saw it: "steady", not the cache-like "bounded",
            // which invited dismissing a real leak.
            let trend = if dump < TREND_MIN_DUMPS {
                None
            } else if h.streak >= TREND_MIN_DUMPS {
                Some(Trend::Growing)
            } else if h.streak > 0 || dump == h.first_seen {
                None
            } else if h.grew_later {
                Some(Trend::Bounded)
            } else {
                Some(Trend::Steady)
            };
            out.push(Change {
                blocks_delta: blocks as i64 - h.blocks as i64,
                bytes_delta: bytes as i64 - h.bytes as i64,
                trend,
            });
            h.blocks = blocks;
            h.bytes = bytes;
        }
        // A group with nothing live starts over if it comes back.
        self.history.retain(|_, h| h.seen_at == dump);
        out
    }

    pub fn dumps(&self) -> u32 {
        self.dumps
    }
}
