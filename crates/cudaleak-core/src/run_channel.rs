//! The run channel: how every process under `cudaleak run` tells it that
//! it made its first CUDA allocation call, and then the file name of its
//! final report or that the report could not be written. A witness that
//! needs no disk (a process whose report directory filled up could make
//! no marker either) and no inherited descriptor: Python's `subprocess`
//! closes every descriptor but 0, 1 and 2 in the children it starts
//! (`close_fds=True`, the default), and the descriptor `run` once passed
//! down was lost below the first such child.
//!
//! `run` listens on a Unix socket in the abstract namespace, passed to the
//! command with a secret as `CUDALEAK_RUN_CHANNEL=@NAME:SECRET`. A process
//! connects for each message (`SOCK_SEQPACKET`, one datagram a
//! connection) and `run` reads the sender's user from the connection
//! (`SO_PEERCRED`), not from the message. The name is no secret (every
//! user of the machine sees abstract socket names in /proc/net/unix); the
//! 128-bit secret is, and every message starts with it: it is in the
//! environment of the run's processes only, which other users cannot
//! read, and in no file. A message without it is dropped.
//!
//! Messages, fields separated by one space, after the secret:
//! - `start PID INSTANCE GENERATION`
//! - `final PID INSTANCE GENERATION FILE_NAME`
//! - `failed PID INSTANCE GENERATION`
//!
//! GENERATION counts the process image's final reports so far: 0 until
//! the first. An `exec` that fails after the image's exec report was
//! written makes the image live again (generation 1, a new `start`), and
//! its reporting must end again with a final report of that generation.

use std::collections::{BTreeMap, BTreeSet};

/// The environment variable that names the channel (`@NAME`).
pub const RUN_CHANNEL_ENV: &str = "CUDALEAK_RUN_CHANNEL";

/// The longest name: `sun_path` holds 108 bytes, the first a NUL for the
/// abstract namespace.
const MAX_NAME: usize = 100;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Start {
        pid: i32,
        instance: String,
        generation: u32,
    },
    Final {
        pid: i32,
        instance: String,
        generation: u32,
        file_name: String,
    },
    Failed {
        pid: i32,
        instance: String,
        generation: u32,
    },
}

impl Message {
    pub fn encode(&self) -> String {
        match self {
            Message::Start {
                pid,
                instance,
                generation,
            } => format!("start {pid} {instance} {generation}"),
            Message::Final {
                pid,
                instance,
                generation,
                file_name,
            } => format!("final {pid} {instance} {generation} {file_name}"),
            Message::Failed {
                pid,
                instance,
                generation,
            } => format!("failed {pid} {instance} {generation}"),
        }
    }

    /// A message as [`Message::encode`] writes it; None for anything else
    /// (a file name with a slash or a space is no report of the
    /// directory).
    pub fn parse(text: &str) -> Option<Message> {
        let mut f = text.split(' ');
        let kind = f.next()?;
        let pid = f.next()?.parse::<i32>().ok()?;
        let instance = f.next().filter(|i| plain_word(i))?.to_string();
        let generation = f.next()?.parse::<u32>().ok()?;
        let message = match kind {
            "start" => Message::Start {
                pid,
                instance,
                generation,
            },
            "final" => Message::Final {
                pid,
                instance,
                generation,
                file_name: f
                    .next()
                    .filter(|n| plain_word(n) && *n != "." && *n != "..")?
                    .to_string(),
            },
            "failed" => Message::Failed {
                pid,
                instance,
                generation,
            },
            _ => return None,
        };
        f.next().is_none().then_some(message)
    }
}

/// Non-empty, printable, no slash: an instance token or a file name.
fn plain_word(w: &str) -> bool {
    !w.is_empty() && w.len() <= 255 && w.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

/// 16 random bytes as 32 hex digits.
pub fn hex(random: [u8; 16]) -> String {
    random.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh channel name: `cudaleak-run.<pid>.<32 hex digits>`.
pub fn new_name(random: [u8; 16]) -> String {
    format!("cudaleak-run.{}.{}", std::process::id(), hex(random))
}

/// The name and the secret in a `CUDALEAK_RUN_CHANNEL` value
/// (`@NAME:SECRET`), if it is one.
pub fn parse_value(value: &str) -> Option<(&str, &str)> {
    let (name, secret) = value.strip_prefix('@')?.split_once(':')?;
    let plain = |w: &str, max: usize| {
        !w.is_empty()
            && w.len() <= max
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    (plain(name, MAX_NAME) && plain(secret, 64)).then_some((name, secret))
}

/// A message as sent: the secret, then the message.
pub fn seal(secret: &str, message: &Message) -> String {
    format!("{secret} {}", message.encode())
}

/// The message in `text` if it starts with `secret`.
pub fn open<'a>(secret: &str, text: &'a str) -> Option<&'a str> {
    text.strip_prefix(secret)?.strip_prefix(' ')
}

/// The socket address of abstract name `name` and its length.
pub fn address(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = &name.as_bytes()[..name.len().min(MAX_NAME)];
    // sun_path[0] stays NUL: the abstract namespace.
    for (d, s) in addr.sun_path[1..].iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
    (addr, len as libc::socklen_t)
}

/// A process image: pid and instance token.
pub type ImageId = (i32, String);

/// What one process image told, by generation (`run_channel`: an image
/// that a failed exec made live again starts a new generation).
#[derive(Debug, Default, Clone)]
pub struct Image {
    /// The user whose process connected (`SO_PEERCRED`), as the kernel
    /// says, not the message.
    pub uid: u32,
    pub started: BTreeSet<u32>,
    pub finals: BTreeMap<u32, String>,
    pub failed: BTreeSet<u32>,
}

impl Image {
    fn newest(&self) -> Option<u32> {
        [self.started.last(), self.finals.keys().last(), self.failed.last()]
            .into_iter()
            .flatten()
            .max()
            .copied()
    }

    /// The file name of the final report that ends the image's reporting:
    /// the newest generation's. None while that generation has only
    /// started (the process runs, or died without a report) or failed.
    pub fn ending_report(&self) -> Option<&str> {
        let g = self.newest()?;
        if self.failed.contains(&g) {
            return None;
        }
        self.finals.get(&g).map(String::as_str)
    }

    /// The newest generation's report could not be written.
    pub fn failed_last(&self) -> bool {
        self.newest()
            .is_some_and(|g| self.failed.contains(&g) && !self.finals.contains_key(&g))
    }

    /// Every report file the image named.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.finals.values().map(String::as_str)
    }
}

/// What the processes of the run told it.
#[derive(Debug, Default, Clone)]
pub struct Told {
    pub images: BTreeMap<ImageId, Image>,
}

impl Told {
    pub fn take(&mut self, message: &str, uid: u32) {
        let Some(m) = Message::parse(message) else {
            return;
        };
        let (pid, instance) = match &m {
            Message::Start { pid, instance, .. }
            | Message::Final { pid, instance, .. }
            | Message::Failed { pid, instance, .. } => (*pid, instance.clone()),
        };
        let image = self.images.entry((pid, instance)).or_default();
        if image.started.is_empty() && image.finals.is_empty() && image.failed.is_empty() {
            image.uid = uid;
        } else if image.uid != uid {
            // Another user cannot speak for this image.
            return;
        }
        match m {
            Message::Start { generation, .. } => {
                image.started.insert(generation);
            }
            Message::Final {
                generation,
                file_name,
                ..
            } => {
                image.started.insert(generation);
                image.finals.insert(generation, file_name);
            }
            Message::Failed { generation, .. } => {
                image.started.insert(generation);
                image.failed.insert(generation);
            }
        }
    }

    /// Whether the image told it made a CUDA allocation call and has not
    /// ended its reporting (no final report of its newest generation).
    pub fn pending(&self, pid: i32) -> bool {
        self.images
            .iter()
            .any(|((p, _), image)| *p == pid && image.ending_report().is_none() && !image.failed_last())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_back_as_written_and_nothing_else_reads() {
        for m in [
            Message::Start {
                pid: 12,
                instance: "1795-ab".into(),
                generation: 0,
            },
            Message::Final {
                pid: 12,
                instance: "1795-ab".into(),
                generation: 1,
                file_name: "cudaleak.h.12.1795-ab.2.exit.json".into(),
            },
            Message::Failed {
                pid: 7,
                instance: "x".into(),
                generation: 3,
            },
        ] {
            assert_eq!(Message::parse(&m.encode()), Some(m));
        }
        for bad in [
            "",
            "start 12 i",
            "start 12 i 0 extra",
            "final 12 i 0 ../elsewhere.json",
            "final 12 i 0 ..",
            "final 12 i 0",
            "stop 12 i 0",
            "start x i 0",
            "start 12 i -1",
        ] {
            assert_eq!(Message::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_plain_abstract_names_with_a_secret_are_channels() {
        assert_eq!(
            parse_value("@cudaleak-run.1.ab:cd"),
            Some(("cudaleak-run.1.ab", "cd"))
        );
        for bad in [
            "",
            "@",
            "@name",
            "@name:",
            "cudaleak-run:x",
            "3:4:5",
            "@a/b:c",
            "@a b:c",
            &format!("@{}:c", "a".repeat(101)),
        ] {
            assert_eq!(parse_value(bad), None, "{bad:?}");
        }
        let name = new_name([0xab; 16]);
        let secret = hex([7; 16]);
        assert_eq!(
            parse_value(&format!("@{name}:{secret}")),
            Some((name.as_str(), secret.as_str()))
        );
        let m = Message::Failed {
            pid: 1,
            instance: "i".into(),
            generation: 0,
        };
        assert_eq!(open(&secret, &seal(&secret, &m)), Some(m.encode().as_str()));
        assert_eq!(open(&secret, &seal("other", &m)), None);
        assert_eq!(open(&secret, &m.encode()), None);
        let (addr, len) = address("ab");
        assert_eq!(addr.sun_path[0], 0);
        assert_eq!(addr.sun_path[1], b'a' as libc::c_char);
        assert_eq!(len as usize, std::mem::size_of::<libc::sa_family_t>() + 3);
    }

    #[test]
    fn an_image_ends_with_its_newest_generation() {
        let mut t = Told::default();
        t.take("start 5 a 0", 1000);
        assert!(t.pending(5));
        t.take("final 5 a 0 r0.json", 1000);
        assert!(!t.pending(5));
        assert_eq!(t.images[&(5, "a".into())].ending_report(), Some("r0.json"));
        // a failed exec: the image is live again
        t.take("start 5 a 1", 1000);
        assert!(t.pending(5));
        assert_eq!(t.images[&(5, "a".into())].ending_report(), None);
        t.take("failed 5 a 1", 1000);
        assert!(!t.pending(5));
        assert!(t.images[&(5, "a".into())].failed_last());
        // another user cannot speak for it
        t.take("final 5 a 1 forged.json", 0);
        assert!(t.images[&(5, "a".into())].failed_last());
        assert_eq!(t.images[&(5, "a".into())].uid, 1000);
    }
}
