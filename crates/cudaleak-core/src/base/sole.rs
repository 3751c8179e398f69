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
//! 1. The first thread to enter becomes the owner, from that call on.
//!    Its identity ([`ThreadKey`]) is any number no other live thread has
//!    (the preload library uses the address of the thread's state).
//! 2. Any other thread ends sole mode, for good ([`SoleOwner::end`]): it
//!    marks the state *ending*, makes every thread of the process pass a
//!    full memory barrier (membarrier(2), private expedited), then waits
//!    until the owner is out of its section, and only then marks the state
//!    shared. A section the owner began before that barrier is then
//!    finished and visible, and one it begins after sees the state ending
//!    and locks as everyone does. Without the barrier, the owner's
//!    "inside" flag could still sit in its store buffer while the other
//!    thread reads it as clear (x86's one reordering: a store, then a load
//!    of another address). Every thread that finds the state ending does
//!    the barrier and the wait itself before it goes on: were "shared" set
//!    first, a third thread would lock a shard the owner is still changing
//!    (review of issue 24).
//! 3. A section entered while the owner is already inside one is
//!    [`Entry::Nested`]: a signal handler that interrupted the owner and
//!    itself called a hook. What the outer section was changing is not
//!    consistent, so the caller must not read or change it (the live map
//!    skips the call; with locks, the same call would have deadlocked on
//!    the shard the outer one holds). The nested section restores the
//!    "inside" flag it found, so the outer one stays covered. This holds
//!    after sole mode began to end too (the first owner's key is kept for
//!    that): a nested call must neither lock what the interrupted section
//!    changes nor wait for that section, which cannot finish before it.
//!    And the owner's first section, the one that claims, is a section
//!    like the others.
//! 7. The owner's "inside" flag has three values: out, *trying* (stored,
//!    the owner not yet re-checked) and *in* (re-checked: the section
//!    changes things from here on). Only "in" makes a call nested. A
//!    signal handler that lands while its owner is trying has nothing
//!    half-changed under it: it enters a section of its own, or, if sole
//!    mode is ending, locks without waiting for the frame it interrupted
//!    (which cannot go on before it returns). Were "trying" nested, the
//!    handler's unlocked add could run beside a thread that ended sole
//!    mode meanwhile and adds with a lock (second review of issue 24).
//! 4. Where membarrier cannot be registered (kernels before 4.14, seccomp
//!    filters), sole mode never begins ([`SoleOwner::allow`]).
//! 5. A fork's child has one thread: it starts over
//!    ([`SoleOwner::reset_in_child`]), with no owner. Not covered: a fork
//!    from a signal handler that interrupted the owner's section (the
//!    child's reset replaces what the interrupted frame still holds).
//! 6. The wait of case 2 yields, then sleeps 50 µs at a time, so that a
//!    waiter of higher priority on the owner's CPU lets the owner run.

use crate::base::own_line::OwnLine;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A thread's identity for [`SoleOwner`] (case 1). Never 0.
pub type ThreadKey = usize;

const NO_OWNER: usize = 0;
/// Case 2: sole mode is ending; the owner may still be inside.
const ENDING: usize = usize::MAX - 1;
const SHARED: usize = usize::MAX;

/// The owner's "inside" flag (case 7).
const OUT: u8 = 0;
const TRYING: u8 = 1;
const IN: u8 = 2;

pub struct SoleOwner {
    /// [`NO_OWNER`], the owner's key, [`ENDING`], then [`SHARED`] (case 2).
    owner: OwnLine<AtomicUsize>,
    /// The key that claimed ownership, kept once sole mode ends (case 3).
    first: AtomicUsize,
    /// [`OUT`], [`TRYING`] or [`IN`] a section (case 7). Written by the
    /// owner alone.
    inside: OwnLine<AtomicU8>,
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
    was_inside: u8,
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
            first: AtomicUsize::new(NO_OWNER),
            inside: OwnLine(AtomicU8::new(OUT)),
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
        match self.owner.0.load(Ordering::Relaxed) {
            owner if owner == me => self.enter_as_owner(me),
            SHARED => Entry::Shared,
            _ => self.enter_slow(me),
        }
    }

    #[inline(always)]
    fn enter_as_owner(&self, me: ThreadKey) -> Entry<'_> {
        let was_inside = self.inside.0.load(Ordering::Relaxed);
        if was_inside == IN {
            // Case 3, whether or not sole mode began to end meanwhile.
            return Entry::Nested(Section {
                sole: self,
                was_inside,
            });
        }
        self.inside.0.store(TRYING, Ordering::Relaxed);
        // Only the compiler is fenced: the processor's order of this store
        // and the load below is what case 2's membarrier settles.
        compiler_fence(Ordering::SeqCst);
        let section = Section {
            sole: self,
            was_inside,
        };
        if self.owner.0.load(Ordering::Relaxed) == me {
            // Seen by this thread's own signal handlers only (case 7).
            self.inside.0.store(IN, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
            return Entry::Sole(section);
        }
        drop(section);
        // Ending meanwhile: finish ending it, then lock.
        self.end(me, None);
        Entry::Shared
    }

    /// No owner yet (claim it), or sole mode is another thread's or ending.
    #[cold]
    #[inline(never)]
    fn enter_slow(&self, me: ThreadKey) -> Entry<'_> {
        if me != NO_OWNER
            && me < ENDING
            && self.allowed.load(Ordering::Relaxed)
            && self
                .owner
                .0
                .compare_exchange(NO_OWNER, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.first.store(me, Ordering::Relaxed);
            // Before any "inside" store: a handler that sees one must see
            // whose it is (case 3).
            compiler_fence(Ordering::SeqCst);
            // Case 3: the claiming call is a section too.
            return self.enter_as_owner(me);
        }
        if self.interrupted_own_section(me) {
            return Entry::Nested(Section {
                sole: self,
                was_inside: IN,
            });
        }
        self.end(me, None);
        Entry::Shared
    }

    /// `me` is the (first) owner, and in a section: a call from a signal
    /// handler that interrupted it (case 3).
    fn interrupted_own_section(&self, me: ThreadKey) -> bool {
        self.first.load(Ordering::Relaxed) == me && self.inside.0.load(Ordering::Relaxed) == IN
    }

    /// `me` is the (first) owner, trying to enter a section: a call from a
    /// signal handler that interrupted it before it changed anything
    /// (case 7).
    fn interrupted_own_try(&self, me: ThreadKey) -> bool {
        self.first.load(Ordering::Relaxed) == me && self.inside.0.load(Ordering::Relaxed) == TRYING
    }

    /// Whether `me` is the owner (a fork's prepare handler, run by the
    /// owner, may take every lock without ending sole mode).
    pub fn is_owner(&self, me: ThreadKey) -> bool {
        self.owner.0.load(Ordering::Relaxed) == me
    }

    /// Ends sole mode for good (case 2) as `me`, waiting for the owner to
    /// leave its section; with `timeout`, at most that long. False: the
    /// owner was still inside (stopped there, or `me` is the owner itself,
    /// in a signal handler that interrupted its section), so what the
    /// section changes cannot be read or changed yet.
    #[cold]
    #[inline(never)]
    pub fn end(&self, me: ThreadKey, timeout: Option<Duration>) -> bool {
        loop {
            match self.owner.0.load(Ordering::Acquire) {
                SHARED => return true,
                ENDING => break,
                NO_OWNER => {
                    if self
                        .owner
                        .0
                        .compare_exchange(NO_OWNER, SHARED, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        return true;
                    }
                }
                owner => {
                    if self
                        .owner
                        .0
                        .compare_exchange(owner, ENDING, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
            }
        }
        if self.interrupted_own_section(me) {
            return false;
        }
        if self.interrupted_own_try(me) {
            // Case 7: the interrupted frame holds nothing; the others wait
            // for it, and so would this handler, for ever.
            return true;
        }
        if !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
            // Registered, so this should not fail. If it does, no new sole
            // mode begins, and the owner's store buffer is given time to
            // drain before the flag is trusted: a guess, not a guarantee.
            self.allowed.store(false, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(10));
        }
        let start = Instant::now();
        let mut rounds = 0u32;
        while self.inside.0.load(Ordering::Acquire) != OUT {
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return false; // still ending: the next caller waits again
            }
            rounds += 1;
            if rounds < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50)); // case 6
            }
        }
        let _ = self
            .owner
            .0
            .compare_exchange(ENDING, SHARED, Ordering::AcqRel, Ordering::Relaxed);
        true
    }

    /// A fork's child (case 5): one thread, no owner yet. Registered
    /// again where the parent was, since the registration belongs to a
    /// memory map and the child has a new one.
    pub fn reset_in_child(&self) {
        self.inside.0.store(OUT, Ordering::Relaxed);
        self.first.store(NO_OWNER, Ordering::Relaxed);
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

    /// Case 3: the call that claims is a section, so a call nested in it
    /// does not take the shard it is changing.
    #[test]
    fn the_first_thread_owns_from_the_call_that_claims() {
        let s = SoleOwner::new();
        s.allow();
        let claiming = s.enter(1);
        assert!(matches!(claiming, Entry::Sole(_)));
        assert!(s.is_owner(1));
        assert!(matches!(s.enter(1), Entry::Nested(_)));
        drop(claiming);
        assert!(matches!(s.enter(1), Entry::Sole(_)));
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
        let outer = s.enter(1);
        assert!(matches!(outer, Entry::Sole(_)));
        {
            let inner = s.enter(1);
            assert!(matches!(inner, Entry::Nested(_)));
        }
        assert_eq!(
            s.inside.0.load(Ordering::Relaxed),
            IN,
            "the outer section lost its cover"
        );
        drop(outer);
        assert_eq!(s.inside.0.load(Ordering::Relaxed), OUT);
    }

    #[test]
    fn another_thread_ends_sole_mode_after_the_owner_leaves_its_section() {
        let s = Arc::new(SoleOwner::new());
        s.allow();
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
        let _section = s.enter(1);
        assert!(!s.end(2, Some(Duration::from_millis(20))));
        assert!(!s.is_owner(1), "ending, not ended, and not the owner's any more");
    }

    /// Case 2 (review of issue 24): while sole mode is ending, a third
    /// thread must wait for the owner's section as the first ender does,
    /// not go on because the state says it is over.
    #[test]
    fn a_third_thread_waits_for_the_owner_while_sole_mode_is_ending() {
        let s = Arc::new(SoleOwner::new());
        s.allow();
        drop(s.enter(1)); // claimed: this test does not rest on case 3
        let section = s.enter(1);
        assert!(!s.end(2, Some(Duration::from_millis(5))));
        let through = Arc::new(AtomicBool::new(false));
        let third = {
            let (s, through) = (s.clone(), through.clone());
            std::thread::spawn(move || {
                assert!(matches!(s.enter(3), Entry::Shared));
                through.store(true, Ordering::Release);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !through.load(Ordering::Acquire),
            "a third thread went on while the owner was inside"
        );
        drop(section);
        third.join().unwrap();
        assert!(through.load(Ordering::Acquire));
    }

    /// Case 3 (review of issue 24): a call nested in the owner's section
    /// after another thread began to end sole mode is still nested: it
    /// neither locks what the section changes nor waits for it.
    #[test]
    fn a_call_nested_in_the_owners_section_stays_nested_while_sole_mode_ends() {
        let s = SoleOwner::new();
        s.allow();
        drop(s.enter(1)); // claimed: this test does not rest on the claim
        let section = s.enter(1);
        assert!(!s.end(2, Some(Duration::from_millis(5))));
        assert!(matches!(s.enter(1), Entry::Nested(_)));
        assert!(!s.end(1, None), "the owner's handler waited for itself");
        drop(section);
        assert!(matches!(s.enter(1), Entry::Shared));
    }

    /// Case 7 (second review of issue 24): a signal handler that lands
    /// after the owner stored "trying" and before it re-checked has
    /// nothing half-changed under it. In sole mode it enters a section of
    /// its own; while sole mode ends, it locks at once (nested, its
    /// unlocked add could run beside a locked one), and does not wait for
    /// the frame it interrupted.
    #[test]
    fn a_call_that_interrupts_the_owners_try_is_not_nested() {
        let s = SoleOwner::new();
        s.allow();
        drop(s.enter(1));
        s.inside.0.store(TRYING, Ordering::Relaxed); // the owner, then a signal
        {
            let handler = s.enter(1);
            assert!(matches!(handler, Entry::Sole(_)));
        }
        assert_eq!(
            s.inside.0.load(Ordering::Relaxed),
            TRYING,
            "the try was not left as found"
        );
        assert!(!s.end(2, Some(Duration::from_millis(5))));
        assert!(matches!(s.enter(1), Entry::Shared));
        assert!(s.end(1, None), "the handler waited for the frame it interrupted");
        s.inside.0.store(OUT, Ordering::Relaxed); // the owner backs out
        assert!(s.end(2, None));
    }
}
