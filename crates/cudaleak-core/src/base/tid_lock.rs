//! A futex mutex whose word holds its holder's kernel thread id.
//!
//! Why the holder: the live map's shards are taken inside hooks, and a
//! program may end inside one (SIGTERM while its only allocating thread
//! records a block, then `exit(0)` from the handler). The report written
//! at that moment must read the shard that the interrupted thread holds:
//! that thread will never run again to let it go. With the holder in the
//! word, the reader knows the shard is held by the very thread that asked
//! for the report (and waits for it), and takes its state over instead of
//! waiting for ever (`record/live_map.rs`). A signal handler on a thread
//! that already holds a shard learns it the same way, instead of waiting
//! for itself.
//!
//! The algorithm is [`crate::base::lock::FutexMutex`]'s (Drepper's "mutex
//! 2", with its plain-store unlock when no thread waits) with the thread
//! id in place of "locked": 0 is free; `tid` is held by `tid`; `tid |
//! WAITERS` is held with waiters. Linux thread ids fit in 22 bits.

use crate::base::lock::{futex_wait, futex_wake};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const FREE: u32 = 0;
const WAITERS: u32 = 1 << 31;

/// The longest a waiter sleeps before it looks at the lock again: an
/// unlock that finds no waiter stores 0 without waking anyone, and a
/// waiter that came in between would otherwise sleep on.
const WAIT_SLICE: Duration = Duration::from_millis(1);

pub struct TidMutex<T> {
    state: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialized by `state`, as for FutexMutex:
// a `&mut T` is only handed out by a guard, or by `get_unchecked`, whose
// contract excludes every other user.
unsafe impl<T: Send> Sync for TidMutex<T> {}
// SAFETY: the mutex owns its `T`.
unsafe impl<T: Send> Send for TidMutex<T> {}

/// A held lock; it hands out only `&T`: what it guards changes through
/// atomics, so that a reader taking a stopped holder's state over
/// (`get_shared_unchecked`) never aliases a `&mut`.
pub struct TidGuard<'a, T> {
    lock: &'a TidMutex<T>,
    tid: u32,
}

impl<T> TidMutex<T> {
    pub const fn new(value: T) -> Self {
        TidMutex {
            state: AtomicU32::new(FREE),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock for thread `tid` (the caller's own id, never 0).
    #[inline]
    pub fn lock(&self, tid: u32) -> TidGuard<'_, T> {
        self.raw_lock(tid);
        TidGuard { lock: self, tid }
    }

    /// Takes the lock, giving up after `timeout`.
    pub fn lock_for(&self, tid: u32, timeout: Duration) -> Option<TidGuard<'_, T>> {
        if self.try_acquire(tid) || self.lock_contended(tid, Some(Instant::now() + timeout)) {
            Some(TidGuard { lock: self, tid })
        } else {
            None
        }
    }

    #[inline]
    pub fn try_lock(&self, tid: u32) -> Option<TidGuard<'_, T>> {
        // `then`, not `then_some`: a guard made eagerly and dropped would
        // unlock the lock another thread holds.
        self.try_acquire(tid).then(|| TidGuard { lock: self, tid })
    }

    #[inline]
    fn try_acquire(&self, tid: u32) -> bool {
        self.state
            .compare_exchange(FREE, tid, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The thread that holds the lock now, if any (a moment's view).
    #[inline]
    pub fn holder(&self) -> Option<u32> {
        match self.state.load(Ordering::Acquire) & !WAITERS {
            FREE => None,
            tid => Some(tid),
        }
    }

    /// Locks without a guard; pair with [`TidMutex::raw_unlock`] (the
    /// `pthread_atfork` handlers).
    #[inline]
    pub fn raw_lock(&self, tid: u32) {
        if !self.try_acquire(tid) {
            self.lock_contended(tid, None);
        }
    }

    /// # Safety
    /// Thread `tid` holds the lock through [`TidMutex::raw_lock`].
    #[inline]
    pub unsafe fn raw_unlock(&self, tid: u32) {
        // No waiter seen: a plain store, no locked instruction.
        if self.state.load(Ordering::Relaxed) == tid {
            self.state.store(FREE, Ordering::Release);
            return;
        }
        if self.state.swap(FREE, Ordering::Release) & WAITERS != 0 {
            futex_wake(&self.state);
        }
    }

    /// Frees the lock whoever holds it, waking no one: the child after
    /// `fork`, whose one thread took every lock in the prepare handler
    /// under its parent's thread id.
    ///
    /// # Safety
    /// No other thread uses the lock.
    pub unsafe fn reset_in_child(&self) {
        self.state.store(FREE, Ordering::Release);
    }

    /// Shared access without locking.
    ///
    /// # Safety
    /// No `&mut` to the value lives meanwhile (no other thread holds a
    /// guard and uses it); what is read may change under the reader
    /// unless it is atomics read by a thread that takes a stopped holder's
    /// state over (`record/live_map.rs`).
    pub unsafe fn get_shared_unchecked(&self) -> &T {
        // SAFETY: the caller's contract.
        unsafe { &*self.value.get() }
    }

    /// Access without locking.
    ///
    /// # Safety
    /// No other thread changes the value meanwhile and no other reference
    /// to it lives: the child after `fork` while the lock is held from the
    /// prepare handler; or a thread that reads the state of a holder that
    /// will never run again (suspended for good in the library's exit
    /// path), reading only what stays consistent at any instruction of the
    /// holder's (`record/live_map.rs`).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_unchecked(&self) -> &mut T {
        // SAFETY: the caller's contract.
        unsafe { &mut *self.value.get() }
    }

    #[cold]
    fn lock_contended(&self, tid: u32, deadline: Option<Instant>) -> bool {
        // A short spin first: critical sections are one table operation.
        for _ in 0..64 {
            std::hint::spin_loop();
            if self.state.load(Ordering::Relaxed) == FREE && self.try_acquire(tid) {
                return true;
            }
        }
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if s == FREE {
                // Taken with the waiters bit: there may be other waiters
                // asleep that this thread's unlock must wake.
                if self
                    .state
                    .compare_exchange(FREE, tid | WAITERS, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            if s & WAITERS == 0
                && self
                    .state
                    .compare_exchange(s, s | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let slice = match deadline {
                None => WAIT_SLICE,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    (d - now).min(WAIT_SLICE)
                }
            };
            futex_wait(&self.state, s | WAITERS, Some(slice));
        }
    }
}

impl<T> std::ops::Deref for TidGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> Drop for TidGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the guard holds the lock for `tid`.
        unsafe { self.lock.raw_unlock(self.tid) }
    }
}

/// The calling thread's kernel id. The system call, not glibc's
/// `gettid`, which came with glibc 2.30: the wheel is built for 2.28.
pub fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments, touches no memory of ours and
    // cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_exactly_under_contention_and_names_its_holder() {
        let m = Arc::new(TidMutex::new(std::sync::atomic::AtomicU64::new(0)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let me = gettid();
                    for _ in 0..20_000 {
                        let g = m.lock(me);
                        assert_eq!(m.holder(), Some(me));
                        g.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(m.lock(gettid()).load(Ordering::Relaxed), 160_000);
        assert_eq!(m.holder(), None);
    }

    #[test]
    fn lock_for_gives_up_at_the_deadline_and_the_holder_is_known() {
        let m = Arc::new(TidMutex::new(()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let m = m.clone();
            std::thread::spawn(move || {
                let _g = m.lock(gettid());
                tx.send(gettid()).unwrap();
                done_rx.recv().unwrap();
            })
        };
        let tid = rx.recv().unwrap();
        assert_eq!(m.holder(), Some(tid));
        let start = Instant::now();
        assert!(m.lock_for(gettid(), Duration::from_millis(50)).is_none());
        assert!(start.elapsed() >= Duration::from_millis(50));
        // The failed wait left the waiters bit; the holder is still known.
        assert_eq!(m.holder(), Some(tid));
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(m.lock_for(gettid(), Duration::from_secs(5)).is_some());
    }

    #[test]
    fn a_failed_try_lock_leaves_the_holder_alone() {
        let m = TidMutex::new(());
        m.raw_lock(0x3f_fffe);
        assert!(m.try_lock(gettid()).is_none());
        assert_eq!(m.holder(), Some(0x3f_fffe));
        assert!(m.lock_for(gettid(), Duration::from_millis(30)).is_none());
        assert_eq!(m.holder(), Some(0x3f_fffe));
    }

    /// A waiter whose wake-up was lost (the plain-store unlock) still gets
    /// the lock: made by hand, the word freed with a waiter asleep.
    #[test]
    fn a_waiter_whose_wake_up_was_lost_still_gets_the_lock() {
        let m = Arc::new(TidMutex::new(std::sync::atomic::AtomicU32::new(0)));
        m.raw_lock(gettid());
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let m = m.clone();
            std::thread::spawn(move || {
                m.lock(gettid()).fetch_add(1, Ordering::Relaxed);
                tx.send(()).unwrap();
            })
        };
        let start = Instant::now();
        while m.state.load(Ordering::Relaxed) & WAITERS == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiter never waited"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20)); // into futex_wait
        m.state.store(FREE, Ordering::Release);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("a waiter whose wake-up was lost slept on");
        waiter.join().unwrap();
        assert_eq!(m.lock(gettid()).load(Ordering::Relaxed), 1);
    }
}
