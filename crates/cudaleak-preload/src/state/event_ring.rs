//! The last N allocation events (`CUDALEAK_TRACE=N`): alloc,
//! free and out-of-memory, each with its address, size, call site, device
//! and time, kept in a ring that every report copies into its
//! `allocation_trace` (PyTorch's memory viewer replays them as the
//! snapshot's `device_traces`).
//!
//! Off by default, and then a hook pays one load of [`CAPACITY`] and one
//! branch that is never taken. On, an event is one `fetch_add` on the head
//! and six relaxed stores into its slot, plus a coarse clock read (vDSO).
//! No lock and no allocation on the path: the ring is allocated once, at
//! load (`configure`). Each slot is a seqlock: its sequence is zeroed
//! before the fields are written and set to the event's number after, and
//! the dump thread keeps a slot only when it read the same non-zero
//! sequence before and after its fields, so a slot being overwritten is
//! left out rather than read torn.

use cudaleak_core::record::TraceId;
use std::sync::atomic::{fence, AtomicI64, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Action {
    Alloc = 1,
    Free = 2,
    Oom = 3,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::Free => "free",
            Action::Oom => "oom",
        }
    }

    fn from_u8(v: u8) -> Option<Action> {
        match v {
            1 => Some(Action::Alloc),
            2 => Some(Action::Free),
            3 => Some(Action::Oom),
            _ => None,
        }
    }
}

/// One event's slot: 40 bytes.
struct Slot {
    /// event number + 1; 0 while being written (or never written)
    seq: AtomicU64,
    address: AtomicU64,
    size: AtomicU64,
    /// trace id, device + 1 (0: unknown) << 32, action << 40
    site: AtomicU64,
    time_us: AtomicI64,
}

/// Slots in the ring; 0: off.
static CAPACITY: AtomicUsize = AtomicUsize::new(0);
static RING: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
/// Events recorded since load (or fork).
static HEAD: AtomicU64 = AtomicU64::new(0);

/// Allocates the ring of `events` slots (at load; once: a second call
/// keeps the first ring).
pub fn configure(events: usize) {
    if events == 0 || !RING.load(Ordering::Acquire).is_null() {
        return;
    }
    let slots: Box<[Slot]> = (0..events)
        .map(|_| Slot {
            seq: AtomicU64::new(0),
            address: AtomicU64::new(0),
            size: AtomicU64::new(0),
            site: AtomicU64::new(0),
            time_us: AtomicI64::new(0),
        })
        .collect();
    // Leaked: hooks on other threads may hold a pointer into it until exit.
    let p = Box::leak(slots).as_mut_ptr();
    RING.store(p, Ordering::Release);
    CAPACITY.store(events, Ordering::Release);
}

pub fn is_on() -> bool {
    CAPACITY.load(Ordering::Relaxed) != 0
}

/// Records an event: with the ring off, one load and a branch.
#[inline(always)]
pub fn record(action: Action, address: u64, size: u64, trace: TraceId, device: Option<u32>) {
    let capacity = CAPACITY.load(Ordering::Relaxed);
    if capacity == 0 {
        return;
    }
    record_on(capacity, action, address, size, trace, device);
}

#[inline(never)]
fn record_on(capacity: usize, action: Action, address: u64, size: u64, trace: TraceId, device: Option<u32>) {
    let ring = RING.load(Ordering::Acquire);
    if ring.is_null() {
        return;
    }
    let n = HEAD.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the ring holds `capacity` slots and is never freed.
    let slot = unsafe { &*ring.add((n % capacity as u64) as usize) };
    slot.seq.store(0, Ordering::Relaxed);
    fence(Ordering::Release);
    slot.address.store(address, Ordering::Relaxed);
    slot.size.store(size, Ordering::Relaxed);
    let dev = device.map_or(0, |d| u64::from(d.min(254)) + 1);
    slot.site.store(
        u64::from(trace.0) | dev << 32 | (action as u64) << 40,
        Ordering::Relaxed,
    );
    slot.time_us.store(now_us(), Ordering::Relaxed);
    slot.seq.store(n + 1, Ordering::Release);
}

/// Unix time in µs from the coarse clock (a vDSO read, no system call).
fn now_us() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live local that clock_gettime only writes; an
    // unknown clock fails with EINVAL, handled below.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1000
}

/// One event as read back.
pub struct Event {
    pub action: Action,
    pub address: u64,
    pub size: u64,
    pub trace: TraceId,
    pub device: Option<u32>,
    pub time_us: i64,
}

/// What the ring holds: (capacity, events recorded in all, the events
/// oldest first); None when it is off. Called by the dump thread.
pub fn read() -> Option<(usize, u64, Vec<Event>)> {
    let capacity = CAPACITY.load(Ordering::Acquire);
    let ring = RING.load(Ordering::Acquire);
    if capacity == 0 || ring.is_null() {
        return None;
    }
    let recorded = HEAD.load(Ordering::Acquire);
    let mut events: Vec<(u64, Event)> = Vec::with_capacity(capacity.min(recorded as usize));
    for i in 0..capacity {
        // SAFETY: as in `record_on`.
        let slot = unsafe { &*ring.add(i) };
        let before = slot.seq.load(Ordering::Acquire);
        if before == 0 {
            continue;
        }
        let (address, size, site, time_us) = (
            slot.address.load(Ordering::Relaxed),
            slot.size.load(Ordering::Relaxed),
            slot.site.load(Ordering::Relaxed),
            slot.time_us.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != before {
            continue;
        }
        let Some(action) = Action::from_u8((site >> 40) as u8) else {
            continue;
        };
        let dev = (site >> 32) as u8;
        events.push((
            before,
            Event {
                action,
                address,
                size,
                trace: TraceId(site as u32),
                device: (dev != 0).then(|| u32::from(dev) - 1),
                time_us,
            },
        ));
    }
    events.sort_unstable_by_key(|(seq, _)| *seq);
    Some((capacity, recorded, events.into_iter().map(|(_, e)| e).collect()))
}

/// In a fork child: the child's trace starts empty (its own allocations
/// only). Single-threaded there: plain stores, no allocation.
pub fn reset_in_child() {
    let capacity = CAPACITY.load(Ordering::Relaxed);
    let ring = RING.load(Ordering::Relaxed);
    if capacity == 0 || ring.is_null() {
        return;
    }
    for i in 0..capacity {
        // SAFETY: as in `record_on`.
        unsafe { &*ring.add(i) }.seq.store(0, Ordering::Relaxed);
    }
    HEAD.store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_events_oldest_first() {
        assert!(read().is_none(), "off until configured");
        record(Action::Alloc, 1, 1, TraceId(1), None);
        configure(4);
        for i in 0..6u64 {
            record(Action::Alloc, 0x1000 * i, 100 + i, TraceId(7), Some(0));
        }
        record(Action::Free, 0x5000, 105, TraceId(7), Some(1));
        record(Action::Oom, 0, 1 << 40, TraceId(0), None);
        let (cap, recorded, events) = read().unwrap();
        assert_eq!((cap, recorded), (4, 8));
        let seen: Vec<(Action, u64, u64, Option<u32>)> = events
            .iter()
            .map(|e| (e.action, e.address, e.size, e.device))
            .collect();
        assert_eq!(
            seen,
            [
                (Action::Alloc, 0x4000, 104, Some(0)),
                (Action::Alloc, 0x5000, 105, Some(0)),
                (Action::Free, 0x5000, 105, Some(1)),
                (Action::Oom, 0, 1 << 40, None),
            ]
        );
        assert_eq!(events[0].trace, TraceId(7));
        assert!(events[0].time_us > 1_700_000_000_000_000);
        reset_in_child();
        assert_eq!(read().unwrap().2.len(), 0);
    }
}
