//! The listening side of the run channel (`cudaleak_core::run_channel`):
//! a socket in the abstract namespace that every process of the run finds
//! by the name in its environment, whatever descriptors its parents
//! closed, and a thread that collects what they tell.

use cudaleak_core::run_channel::{self, Told, RUN_CHANNEL_ENV};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The socket and the thread that reads it.
pub struct RunChannel {
    listener: libc::c_int,
    name: String,
    secret: String,
    told: Arc<Mutex<Told>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// At most this many connections are kept open waiting for their message;
/// past it the oldest is closed. A sender writes its one message as soon
/// as it is connected: only a stranger's connection stays silent.
const MAX_OPEN: usize = 256;
/// A connection silent this long is closed.
const SILENT_FOR: Duration = Duration::from_secs(2);

fn random16() -> Option<[u8; 16]> {
    let mut random = [0u8; 16];
    // SAFETY: getrandom fills the local buffer it is given.
    (unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) } == random.len() as isize)
        .then_some(random)
}

impl RunChannel {
    /// A listening socket under a fresh random name, and a fresh secret;
    /// None when the system gives no socket or no randomness (the marker
    /// is then the only witness, as before the channel).
    pub fn open() -> Option<RunChannel> {
        let name = run_channel::new_name(random16()?);
        let secret = run_channel::hex(random16()?);
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
                secret,
                told: Arc::default(),
                stop: Arc::default(),
                thread: None,
            })
        }
    }

    /// `CUDALEAK_RUN_CHANNEL`'s value for the command.
    pub fn env(&self) -> (&'static str, String) {
        (RUN_CHANNEL_ENV, format!("@{}:{}", self.name, self.secret))
    }

    /// Reads every connection until [`RunChannel::finish`]: all of them
    /// polled together, none waited for alone, so that connections that
    /// stay silent (a stranger's: the name is public) delay no one.
    pub fn listen(&mut self) {
        let (listener, told, stop) = (self.listener, self.told.clone(), self.stop.clone());
        let secret = self.secret.clone();
        self.thread = std::thread::Builder::new()
            .name("cudaleak-run-channel".into())
            .spawn(move || {
                let mut open: Vec<(libc::c_int, u32, Instant)> = Vec::new();
                loop {
                    let stopping = stop.load(Ordering::Acquire);
                    let mut fds: Vec<libc::pollfd> = std::iter::once(listener)
                        .chain(open.iter().map(|c| c.0))
                        .map(|fd| libc::pollfd {
                            fd,
                            events: libc::POLLIN,
                            revents: 0,
                        })
                        .collect();
                    // SAFETY: polling descriptors of ours, `fds.len()` of them.
                    unsafe {
                        libc::poll(
                            fds.as_mut_ptr(),
                            fds.len() as libc::nfds_t,
                            if stopping { 20 } else { 100 },
                        )
                    };
                    let mut heard = false;
                    // New connections, with their senders' users.
                    while let Some(conn) = accept(listener) {
                        heard = true;
                        open.push(conn);
                        if open.len() > MAX_OPEN {
                            // SAFETY: closing our own descriptor.
                            unsafe { libc::close(open.remove(0).0) };
                        }
                    }
                    open.retain(|&(fd, uid, since)| {
                        match read_message(fd) {
                            Read::Message(text) => {
                                heard = true;
                                if let (Some(m), Ok(mut t)) = (run_channel::open(&secret, &text), told.lock())
                                {
                                    t.take(m, uid);
                                }
                            }
                            Read::Nothing if since.elapsed() < SILENT_FOR && !stopping => return true,
                            Read::Nothing | Read::Closed => {}
                        }
                        // SAFETY: closing our own descriptor, once.
                        unsafe { libc::close(fd) };
                        false
                    });
                    if stopping && !heard {
                        for (fd, _, _) in open.drain(..) {
                            // SAFETY: closing a descriptor of our own that
                            // `drain` takes out of `open`, so once.
                            unsafe { libc::close(fd) };
                        }
                        return;
                    }
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

/// One waiting connection, its sender's user (`SO_PEERCRED`) and when it
/// came; None when no connection waits.
fn accept(listener: libc::c_int) -> Option<(libc::c_int, u32, Instant)> {
    // SAFETY: accept on our listening socket; the new descriptor is ours;
    // getsockopt writes into a local of the size it is told.
    unsafe {
        let fd = libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        );
        if fd < 0 {
            return None;
        }
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut cred_len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let uid = if libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut cred_len,
        ) == 0
        {
            cred.uid
        } else {
            u32::MAX
        };
        Some((fd, uid, Instant::now()))
    }
}

enum Read {
    Message(String),
    Nothing,
    Closed,
}

fn read_message(fd: libc::c_int) -> Read {
    let mut buf = [0u8; 4096];
    // SAFETY: receiving into a local buffer from our own descriptor.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    match n {
        n if n > 0 => Read::Message(String::from_utf8_lossy(&buf[..n as usize]).into_owned()),
        0 => Read::Closed,
        _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock => Read::Nothing,
        _ => Read::Closed,
    }
}
