//! The lock-free cache of unwind rules by return address: after warm-up a
//! frame's rule costs one probe; a miss reads it from `.eh_frame`.

use super::rules::{rule_from_eh_frame, Rule};
use std::sync::atomic::{AtomicU64, Ordering};

/// After a `dlclose` unloaded objects: the cached unwind rules of return
/// addresses that no longer lie in a loaded object are retired (their key
/// becomes [`RETIRED`], which no address equals and lookups probe past),
/// so code loaded later at the same address gets its own rules.
pub fn forget_unloaded_rules(is_gone: &dyn Fn(usize) -> bool) {
    for key in &CACHE_KEYS {
        let pc = key.load(Ordering::Acquire);
        if pc != 0 && pc != RETIRED && is_gone(pc as usize - 1) {
            key.store(RETIRED, Ordering::Release);
        }
    }
}

/// The key of a retired cache slot.
const RETIRED: u64 = u64::MAX;

/// Lock-free cache: return address → packed rule. Slots are claimed by a
/// CAS on the value, then published by a release store of the key, and
/// never change afterwards; a reader that sees the key sees the value.
/// (A packed rule is never 0: its kind is at least 1.)
const CACHE_SLOTS: usize = 1 << 16;
const CACHE_PROBES: usize = 16;
static CACHE_KEYS: [AtomicU64; CACHE_SLOTS] = [const { AtomicU64::new(0) }; CACHE_SLOTS];
static CACHE_RULES: [AtomicU64; CACHE_SLOTS] = [const { AtomicU64::new(0) }; CACHE_SLOTS];

/// Fibonacci hashing: one multiply, the top 16 bits.
#[inline(always)]
fn slot_of(pc: u64) -> usize {
    (pc.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - 16)) as usize
}

#[inline(always)]
fn cached_rule(pc: u64) -> Option<Rule> {
    let s = slot_of(pc);
    if CACHE_KEYS[s].load(Ordering::Acquire) == pc {
        return Some(Rule::unpack(CACHE_RULES[s].load(Ordering::Relaxed)));
    }
    cached_rule_probing(pc, s)
}

#[cold]
fn cached_rule_probing(pc: u64, start: usize) -> Option<Rule> {
    for i in 0..CACHE_PROBES {
        let s = (start + i) & (CACHE_SLOTS - 1);
        let k = CACHE_KEYS[s].load(Ordering::Acquire);
        if k == pc {
            return Some(Rule::unpack(CACHE_RULES[s].load(Ordering::Relaxed)));
        }
        if k == 0 {
            return None;
        }
    }
    None
}

pub(super) fn remember_rule(pc: u64, rule: Rule) {
    let start = slot_of(pc);
    let packed = rule.pack();
    for i in 0..CACHE_PROBES {
        let s = (start + i) & (CACHE_SLOTS - 1);
        if CACHE_RULES[s]
            .compare_exchange(0, packed, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            CACHE_KEYS[s].store(pc, Ordering::Release);
            return;
        }
        if CACHE_KEYS[s].load(Ordering::Acquire) == pc {
            return;
        }
    }
}

#[inline(always)]
pub(super) fn rule_for(pc: u64) -> Rule {
    match cached_rule(pc) {
        Some(r) => r,
        None => {
            let r = rule_from_eh_frame(pc);
            remember_rule(pc, r);
            r
        }
    }
}
