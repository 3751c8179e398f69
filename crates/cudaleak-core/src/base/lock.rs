//! A futex mutex that is safe to take inside CUDA hooks.
//!
//! Why not `std::sync::Mutex` or dashmap's lock: the hooks need a lock that
//! 1. is `const`-constructible, so the live map can be a plain `static`;
//! 2. keeps no thread-local state: parking_lot_core (used by dashmap) parks
//!    threads through a lazily created thread-local `ThreadData` that has a
//!    `Drop` impl and allocates, which breaks when a hook runs during thread
//!    teardown;
//! 3. can be taken by a `pthread_atfork` prepare handler and released by the
//!    parent and child handlers, which needs raw lock/unlock without guards;
//! 4. can be taken with a deadline, so that a dump at exit never hangs on a
//!    lock held by a thread that will never run again.
//!
//! The algorithm is "mutex 2" from Ulrich Drepper, "Futexes Are Tricky"
//! (2011): 0 = unlocked, 1 = locked, 2 = locked with waiters, with one
//! change to its unlock:
//!
//! 5. An unlock that finds no waiters (1) stores 0 with a plain store, not
//!    the `xchg` Drepper's unlock uses. A locked instruction costs about
//!    9 ns on the hot path of every allocation and release (two unlocks a
//!    pair: 91 -> 82 ns per runtime pair). The price is a race:
//!    a waiter that turns 1 into 2 between the unlock's load and its store
//!    goes to sleep and nobody wakes it, since the store put back 0, not 2.
//!    So a waiter never sleeps longer than `WAIT_SLICE` before it looks
//!    again: a lost wake-up costs that slice, never a hang. (The window is
//!    two instructions wide, and the waiter's `futex` call checks the word
//!    again in the kernel, so it sleeps only when the unlocking thread was
//!    interrupted between the two.)

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
const CONTENDED: u32 = 2;

/// The longest a waiter sleeps before it looks at the lock again (case 5).
const WAIT_SLICE: Duration = Duration::from_millis(1);

pub struct FutexMutex<T> {
    state: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialized by `state`: a `&T`/`&mut T` is
// only handed out by a guard (or `get_unchecked`, whose contract excludes
// other threads), so sharing the mutex across threads shares `T` one thread
// at a time, which `T: Send` allows.
unsafe impl<T: Send> Sync for FutexMutex<T> {}
// SAFETY: the mutex owns its `T` (an `UnsafeCell` and an atomic), so moving
// it to another thread moves the `T`, which `T: Send` allows.
unsafe impl<T: Send> Send for FutexMutex<T> {}

pub struct FutexGuard<'a, T> {
    lock: &'a FutexMutex<T>,
}

impl<T> FutexMutex<T> {
    pub const fn new(value: T) -> Self {
        FutexMutex {
            state: AtomicU32::new(UNLOCKED),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub fn lock(&self) -> FutexGuard<'_, T> {
        self.raw_lock();
        FutexGuard { lock: self }
    }

    /// Takes the lock, giving up after `timeout`.
    pub fn lock_for(&self, timeout: Duration) -> Option<FutexGuard<'_, T>> {
        if self.try_acquire_with_deadline(Instant::now() + timeout) {
            Some(FutexGuard { lock: self })
        } else {
            None
        }
    }

    #[inline]
    pub fn try_lock(&self) -> Option<FutexGuard<'_, T>> {
        self.state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| FutexGuard { lock: self })
    }

    /// Locks without a guard; pair with [`FutexMutex::raw_unlock`]. Used by
    /// the `pthread_atfork` handlers, which lock in one callback and unlock
    /// in another.
    #[inline]
    pub fn raw_lock(&self) {
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended(None);
        }
    }

    /// # Safety
    /// The caller must hold the lock through [`FutexMutex::raw_lock`] (or be
    /// the only thread left after `fork`).
    #[inline]
    pub unsafe fn raw_unlock(&self) {
        // Case 5: no waiter seen, no locked instruction.
        if self.state.load(Ordering::Relaxed) == LOCKED {
            self.state.store(UNLOCKED, Ordering::Release);
            return;
        }
        if self.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            futex_wake(&self.state);
        }
    }

    /// Mutable access without locking.
    ///
    /// # Safety
    /// No other thread may use the lock, and no other reference to the
    /// value may live: the child after `fork`, while the lock is held
    /// through `raw_lock` from the prepare handler, or the sole owner of
    /// `sole.rs` inside its section.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_unchecked(&self) -> &mut T {
        // SAFETY: `value.get()` points into `self`, live for the borrow; the
        // caller guarantees no other thread uses the lock, and holding it
        // through `raw_lock` keeps every guard of this thread out too.
        unsafe { &mut *self.value.get() }
    }

    fn try_acquire_with_deadline(&self, deadline: Instant) -> bool {
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return true;
        }
        self.lock_contended(Some(deadline))
    }

    #[cold]
    fn lock_contended(&self, deadline: Option<Instant>) -> bool {
        // A short spin first: critical sections are a few hash-map operations.
        for _ in 0..64 {
            std::hint::spin_loop();
            if self.state.load(Ordering::Relaxed) == UNLOCKED
                && self
                    .state
                    .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
        }
        loop {
            if self.state.swap(CONTENDED, Ordering::Acquire) == UNLOCKED {
                return true;
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
            futex_wait(&self.state, CONTENDED, Some(slice));
        }
    }
}

impl<T> Deref for FutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for FutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for FutexGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the guard holds the lock.
        unsafe { self.lock.raw_unlock() }
    }
}

pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts;
    let ts_ptr = match timeout {
        Some(t) => {
            ts = libc::timespec {
                tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: t.subsec_nanos() as libc::c_long,
            };
            &ts as *const libc::timespec
        }
        None => std::ptr::null(),
    };
    // SAFETY: plain futex syscall on a live atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
        );
    }
}

pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: plain futex syscall on a live atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

/// Futex wait/wake on any atomic word, for the dumper thread's wake-up word.
/// `futex(2)` is a raw system call and therefore async-signal-safe, so a
/// signal handler may call [`wake_all`].
pub fn wait_while_equal(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    futex_wait(word, expected, timeout)
}

/// Wakes every waiter on `word`; async-signal-safe.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: plain futex syscall on a live atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_exactly_under_contention() {
        let m = Arc::new(FutexMutex::new(0u64));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 160_000);
    }

    #[test]
    fn lock_for_gives_up_at_the_deadline() {
        let m = FutexMutex::new(());
        let _held = m.lock();
        let start = Instant::now();
        assert!(m.lock_for(Duration::from_millis(50)).is_none());
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    /// Case 5: the plain-store unlock can lose a waiter's wake-up. Here the
    /// race's outcome is made by hand: a waiter sleeps on 2, and the word
    /// goes back to 0 with no wake. Without the bounded sleep it would
    /// sleep for ever.
    #[test]
    fn a_waiter_whose_wake_up_was_lost_still_gets_the_lock() {
        let m = Arc::new(FutexMutex::new(0u32));
        m.raw_lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let m = m.clone();
            std::thread::spawn(move || {
                *m.lock() += 1;
                tx.send(()).unwrap();
            })
        };
        let start = Instant::now();
        while m.state.load(Ordering::Relaxed) != CONTENDED {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiter never waited"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20)); // into futex_wait
        m.state.store(UNLOCKED, Ordering::Release);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("a waiter whose wake-up was lost slept on");
        waiter.join().unwrap();
        assert_eq!(*m.lock(), 1);
    }

    #[test]
    fn an_uncontended_unlock_leaves_the_lock_free_for_the_next() {
        let m = FutexMutex::new(0u32);
        for _ in 0..3 {
            *m.lock() += 1;
            assert_eq!(m.state.load(Ordering::Relaxed), UNLOCKED);
        }
        assert_eq!(*m.lock(), 3);
    }

    #[test]
    fn raw_lock_pairs_with_raw_unlock() {
        let m = FutexMutex::new(1);
        m.raw_lock();
        assert!(m.try_lock().is_none());
        // SAFETY: this thread took the lock with `raw_lock` just above.
        unsafe { m.raw_unlock() };
        assert_eq!(*m.try_lock().unwrap(), 1);
    }
}
