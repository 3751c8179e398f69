//! Signals blocked on the calling thread for a while: the exit report
//! (SIGTERM and SIGINT wait until it is written) and a reader's pause of
//! the sole owner (every signal, so that no handler of the reader's waits
//! for the pause it holds; `sole.rs`, case 8).

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
