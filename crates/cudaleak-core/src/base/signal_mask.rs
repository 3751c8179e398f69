//! What may interrupt the calling thread, held off for a while: signals
//! (the exit report: SIGTERM and SIGINT wait until it is written; a
//! reader's pause of the sole owner: every signal, so that no handler of
//! the reader's waits for the pause it holds; `sole.rs`, case 8), and the
//! program's thread cancellation (the library's own I/O on a program
//! thread: a `write` or `nanosleep` of ours is a cancellation point, and a
//! forced unwind caught at a hook's boundary aborted the process).

/// The calling thread's signals in `blocked`, until dropped; then the mask
/// it had.
pub struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    /// Every signal.
    pub fn all() -> SignalsBlocked {
        Self::block(|set| {
            // SAFETY: fills a local set.
            unsafe { libc::sigfillset(set) };
        })
    }

    /// The signals in `sigs`.
    pub fn of(sigs: &[libc::c_int]) -> SignalsBlocked {
        Self::block(|set| {
            // SAFETY: fills a local set.
            unsafe {
                libc::sigemptyset(set);
                for &sig in sigs {
                    libc::sigaddset(set, sig);
                }
            }
        })
    }

    fn block(fill: impl FnOnce(&mut libc::sigset_t)) -> SignalsBlocked {
        // SAFETY: sigset_t is plain data; pthread_sigmask only reads `set`
        // and writes `old`.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            fill(&mut set);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            SignalsBlocked(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: gives back the mask `block` saved.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Cancellation disabled on the calling thread until dropped; then the
/// state it had. glibc's `pthread_setcancelstate` changes a word of the
/// thread's own descriptor: no system call.
pub struct CancelDisabled(libc::c_int);

impl CancelDisabled {
    pub fn begin() -> CancelDisabled {
        let mut old = 0;
        // SAFETY: writes the old state into a local.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        CancelDisabled(old)
    }
}

impl Drop for CancelDisabled {
    fn drop(&mut self) {
        // SAFETY: gives back the state `begin` saved.
        unsafe { pthread_setcancelstate(self.0, std::ptr::null_mut()) };
    }
}

// Not in the libc crate for every target.
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;
extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}
