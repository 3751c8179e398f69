//! The listening side of the run channel (`cudaleak_core::run_channel`):
//! a socket in the abstract namespace that every process of the run finds
//! by the name in its environment, whatever descriptors its parents
//! closed, and a thread that collects what they tell.

use cudaleak_core::run_channel::{self, Told, RUN_CHANNEL_ENV};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The socket and the thread that reads it.
pub struct RunChannel {
    listener: libc::c_int,
    name: String,
    told: Arc<Mutex<Told>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunChannel {
    /// A listening socket under a fresh random name; None when the system
    /// gives no socket or no randomness (the marker is then the only
    /// witness, as before the channel).
    pub fn open() -> Option<RunChannel> {
        let mut random = [0u8; 16];
        // SAFETY: getrandom fills the local buffer it is given.
        if unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) } != random.len() as isize {
            return None;
        }
        let name = run_channel::new_name(random);
        let (addr, len) = run_channel::address(&name);
        // SAFETY: a socket of our own, bound to a local address; closed on
        // every failure.
        unsafe {
            let fd = libc::socket(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            );
            if fd < 0 {
                return None;
            }
            if libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0
                || libc::listen(fd, 4096) != 0
            {
                libc::close(fd);
                return None;
            }
            Some(RunChannel {
                listener: fd,
                name,
                told: Arc::default(),
                stop: Arc::default(),
                thread: None,
            })
        }
    }

    /// `CUDALEAK_RUN_CHANNEL`'s value for the command.
    pub fn env(&self) -> (&'static str, String) {
        (RUN_CHANNEL_ENV, format!("@{}", self.name))
    }

    /// Reads every connection until [`RunChannel::finish`].
    pub fn listen(&mut self) {
        let (fd, told, stop) = (self.listener, self.told.clone(), self.stop.clone());
        self.thread = std::thread::Builder::new()
            .name("cudaleak-run-channel".into())
            .spawn(move || loop {
                let stopping = stop.load(Ordering::Acquire);
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: polling one descriptor of ours.
                unsafe { libc::poll(&mut pfd, 1, if stopping { 0 } else { 100 }) };
                let mut drained = true;
                while let Some((message, uid)) = accept_one(fd) {
                    drained = false;
                    if let Ok(mut t) = told.lock() {
                        t.take(&message, uid);
                    }
                }
                if stopping && drained {
                    return;
                }
            })
            .ok();
    }

    /// What was told so far, without stopping.
    pub fn told_now(&self) -> Told {
        self.told.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Everything told before now (the run is over).
    pub fn finish(mut self) -> Told {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.told.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for RunChannel {
    fn drop(&mut self) {
        // SAFETY: closing our own descriptor once.
        unsafe { libc::close(self.listener) };
    }
}

/// One waiting connection's message and its sender's user; None when no
/// connection waits. A connection whose message has not arrived yet is
/// given a moment (the sender writes right after connecting).
fn accept_one(listener: libc::c_int) -> Option<(String, u32)> {
    // SAFETY: accept on our listening socket; the new descriptor is ours,
    // read into a local buffer and closed here.
    unsafe {
        let fd = libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut cred_len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let have_cred = libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut cred_len,
        ) == 0;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        libc::poll(&mut pfd, 1, 1000);
        let mut buf = [0u8; 4096];
        let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT);
        libc::close(fd);
        if !have_cred || n <= 0 {
            return Some((String::new(), u32::MAX));
        }
        Some((String::from_utf8_lossy(&buf[..n as usize]).into_owned(), cred.uid))
    }
}
