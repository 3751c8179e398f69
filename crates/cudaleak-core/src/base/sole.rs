//! One thread alone, without locked instructions: a bias toward the first
//! thread that uses some shared state, in the manner of biased locking.
//!
//! Most programs allocate and free GPU memory from one thread, and a
//! locked instruction costs about 4 ns: the shard lock's `cmpxchg` twice a
//! pair and the live-byte count's add twice a pair were a fifth of the
//! library's cost per pair (issue 24). While one thread alone uses the
//! state, it enters a *section* with plain stores instead.
//!
//! Numbered cases worth knowing:
//! 1. The first thread to enter becomes the owner. Its identity
//!    ([`ThreadKey`]) is any number no other live thread has (the
//!    preload library uses the address of the thread's state).
//! 2. Any other thread ends sole mode, for good ([`SoleOwner::end`]): it
//!    marks the state shared, makes every thread of the process pass a
//!    full memory barrier (membarrier(2), private expedited), then waits
//!    until the owner is out of its section. A section the owner began
//!    before that barrier is then finished and visible, and one it begins
//!    after sees the state shared and locks as everyone does. Without the
//!    barrier, the owner's "inside" flag could still sit in its store
//!    buffer while the other thread reads it as clear (x86's one
//!    reordering: a store, then a load of another address).
//! 3. A section entered while the owner is already inside one is
//!    [`Entry::Nested`]: a signal handler that interrupted the owner and
//!    itself called a hook. What the outer section was changing is not
//!    consistent, so the caller must not read or change it (the live map
//!    skips the call; with locks, the same call would have deadlocked on
//!    the shard the outer one holds). The nested section restores the
//!    "inside" flag it found, so the outer one stays covered.
//! 4. Where membarrier cannot be registered (kernels before 4.14, seccomp
//!    filters, valgrind), sole mode never begins ([`SoleOwner::allow`]).
//! 5. A fork's child has one thread: it starts over
//!    ([`SoleOwner::reset_in_child`]), with no owner.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A thread's identity for [`SoleOwner`] (case 1). Never 0.
pub type ThreadKey = usize;

const NO_OWNER: usize = 0;
const SHARED: usize = usize::MAX;

#[repr(align(64))]
struct OwnLine<T>(T);

pub struct SoleOwner {
    /// [`NO_OWNER`], the owner's key, or [`SHARED`] once ended (case 2).
    owner: OwnLine<AtomicUsize>,
    /// The owner is inside a section. Written by the owner alone.
    inside: OwnLine<AtomicBool>,
    /// membarrier is registered: sole mode may begin (case 4).
    allowed: AtomicBool,
}

/// What [`SoleOwner::enter`] found.
pub enum Entry<'a> {
    /// The caller owns the state, alone, until the section drops.
    Sole(Section<'a>),
    /// The caller owns the state but interrupted its own section (case 3).
    Nested(Section<'a>),
    /// Sole mode is over (or never began): lock as everyone does.
    Shared,
}

/// The owner's section; dropping it leaves.
pub struct Section<'a> {
    sole: &'a SoleOwner,
    was_inside: bool,
}

impl Drop for Section<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.sole.inside.0.store(self.was_inside, Ordering::Release);
    }
}

impl Default for SoleOwner {
    fn default() -> Self {
        Self::new()
    }
}

impl SoleOwner {
    pub const fn new() -> SoleOwner {
        SoleOwner {
            owner: OwnLine(AtomicUsize::new(NO_OWNER)),
            inside: OwnLine(AtomicBool::new(false)),
            allowed: AtomicBool::new(false),
        }
    }

    /// Registers the process for private expedited membarriers and, if
    /// that worked, lets sole mode begin (case 4). At start-up, and in a
    /// fork's child.
    pub fn allow(&self) {
        let ok = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
        self.allowed.store(ok, Ordering::Relaxed);
    }

    /// Enters a section as `me`.
    #[inline(always)]
    pub fn enter(&self, me: ThreadKey) -> Entry<'_> {
        let owner = self.owner.0.load(Ordering::Relaxed);
        if owner != me {
            if owner != SHARED {
                self.claim_or_end(me);
            }
            // A new owner takes sole mode from its next section on.
            return Entry::Shared;
        }
        let was_inside = self.inside.0.load(Ordering::Relaxed);
        self.inside.0.store(true, Ordering::Relaxed);
        // Only the compiler is fenced: the processor's order of this store
        // and the load below is what case 2's membarrier settles.
        compiler_fence(Ordering::SeqCst);
        let section = Section {
            sole: self,
            was_inside,
        };
        if self.owner.0.load(Ordering::Relaxed) != me {
            return Entry::Shared; // ended meanwhile; `section` leaves
        }
        if was_inside {
            Entry::Nested(section)
        } else {
            Entry::Sole(section)
        }
    }

    /// Whether `me` is the owner (a fork's prepare handler, run by the
    /// owner, may take every lock without ending sole mode).
    pub fn is_owner(&self, me: ThreadKey) -> bool {
        self.owner.0.load(Ordering::Relaxed) == me
    }

    #[cold]
    #[inline(never)]
    fn claim_or_end(&self, me: ThreadKey) {
        if me != NO_OWNER
            && me != SHARED
            && self.allowed.load(Ordering::Relaxed)
            && self
                .owner
                .0
                .compare_exchange(NO_OWNER, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return;
        }
        self.end(None);
    }

    /// Ends sole mode for good (case 2), waiting for the owner to leave
    /// its section; with `timeout`, at most that long. False: the owner
    /// was still inside (stopped there, or this is a signal handler that
    /// interrupted it), so the state cannot be trusted.
    #[cold]
    #[inline(never)]
    pub fn end(&self, timeout: Option<Duration>) -> bool {
        if self.owner.0.load(Ordering::Relaxed) == SHARED {
            return true;
        }
        let owner = self.owner.0.swap(SHARED, Ordering::SeqCst);
        if owner == NO_OWNER || owner == SHARED {
            return true;
        }
        if !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
            // Registered, so this should not fail; if it does, give the
            // owner's store buffer time to drain before trusting the flag.
            std::thread::sleep(Duration::from_millis(10));
        }
        let start = Instant::now();
        while self.inside.0.load(Ordering::Acquire) {
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// A fork's child (case 5): one thread, no owner yet. Registered
    /// again where the parent was, since the registration belongs to a
    /// memory map and the child has a new one.
    pub fn reset_in_child(&self) {
        self.inside.0.store(false, Ordering::Relaxed);
        self.owner.0.store(NO_OWNER, Ordering::Relaxed);
        if self.allowed.load(Ordering::Relaxed) {
            self.allow();
        }
    }
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: a plain system call with integer arguments.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_first_thread_owns_from_its_second_section() {
        let s = SoleOwner::new();
        s.allow();
        assert!(matches!(s.enter(1), Entry::Shared));
        assert!(matches!(s.enter(1), Entry::Sole(_)));
        assert!(s.is_owner(1));
    }

    #[test]
    fn without_membarrier_sole_mode_never_begins() {
        let s = SoleOwner::new();
        assert!(matches!(s.enter(1), Entry::Shared));
        assert!(matches!(s.enter(1), Entry::Shared));
        assert!(!s.is_owner(1));
    }

    #[test]
    fn a_section_inside_a_section_is_nested_and_keeps_the_outer_covered() {
        let s = SoleOwner::new();
        s.allow();
        let _ = s.enter(1);
        let outer = s.enter(1);
        assert!(matches!(outer, Entry::Sole(_)));
        {
            let inner = s.enter(1);
            assert!(matches!(inner, Entry::Nested(_)));
        }
        assert!(
            s.inside.0.load(Ordering::Relaxed),
            "the outer section lost its cover"
        );
        drop(outer);
        assert!(!s.inside.0.load(Ordering::Relaxed));
    }

    #[test]
    fn another_thread_ends_sole_mode_after_the_owner_leaves_its_section() {
        let s = Arc::new(SoleOwner::new());
        s.allow();
        let _ = s.enter(1);
        let section = s.enter(1);
        assert!(matches!(section, Entry::Sole(_)));
        let ender = {
            let s = s.clone();
            std::thread::spawn(move || {
                assert!(matches!(s.enter(2), Entry::Shared));
                Instant::now()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let left = Instant::now();
        drop(section);
        let ended = ender.join().unwrap();
        assert!(
            ended >= left,
            "the other thread went on while the owner was inside"
        );
        assert!(matches!(s.enter(1), Entry::Shared), "the owner kept sole mode");
        assert!(!s.is_owner(1));
    }

    #[test]
    fn ending_gives_up_at_the_timeout_while_the_owner_stays_inside() {
        let s = SoleOwner::new();
        s.allow();
        let _ = s.enter(1);
        let _section = s.enter(1);
        assert!(!s.end(Some(Duration::from_millis(20))));
    }
}
