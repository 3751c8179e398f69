//! Reading a file that someone else named: a report given to the CLI, a
//! suppressions file named by `CUDALEAK_SUPPRESSIONS`. Only regular files,
//! and at most a stated number of bytes.
//!
//! Why: a FIFO named like a report hung the CLI (and, as a suppressions
//! file, the watched program before `main`); `report /dev/zero` read until
//! it was OOM-killed at 24 GB. The file is opened with `O_NONBLOCK`, so
//! opening a FIFO with no writer returns at once, then checked with
//! `fstat` on the open descriptor (no race between the check and the read),
//! then read up to the cap.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why a file was not read.
#[derive(Debug)]
pub enum SafeReadError {
    /// open or read failed
    Io(io::Error),
    /// a directory, FIFO, socket or device; the string names the type
    NotRegular(&'static str),
    /// larger than the cap (the file's size, the cap)
    TooLarge { size: u64, cap: u64 },
}

impl fmt::Display for SafeReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SafeReadError::Io(e) => write!(f, "{e}"),
            SafeReadError::NotRegular(kind) => write!(f, "not a regular file (a {kind})"),
            SafeReadError::TooLarge { size, cap } => {
                write!(f, "too large: {size} bytes, the limit is {cap} bytes")
            }
        }
    }
}

impl std::error::Error for SafeReadError {}

fn file_kind(ft: &std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// Reads `path` if it is a regular file of at most `cap` bytes.
/// Symbolic links are followed to their target, which must be regular.
pub fn read_regular_file(path: &Path, cap: u64) -> Result<Vec<u8>, SafeReadError> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(SafeReadError::Io)?;
    let meta = f.metadata().map_err(SafeReadError::Io)?;
    let ft = meta.file_type();
    if !ft.is_file() {
        return Err(SafeReadError::NotRegular(file_kind(&ft)));
    }
    if meta.len() > cap {
        return Err(SafeReadError::TooLarge {
            size: meta.len(),
            cap,
        });
    }
    // The file may grow between fstat and read: read one byte past the cap
    // to notice, never more.
    let mut buf = Vec::with_capacity(meta.len() as usize);
    (&mut f as &mut File)
        .take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(SafeReadError::Io)?;
    if buf.len() as u64 > cap {
        return Err(SafeReadError::TooLarge {
            size: buf.len() as u64,
            cap,
        });
    }
    Ok(buf)
}

/// [`read_regular_file`] as UTF-8 text.
pub fn read_regular_text(path: &Path, cap: u64) -> Result<String, SafeReadError> {
    let bytes = read_regular_file(path, cap)?;
    String::from_utf8(bytes)
        .map_err(|_| SafeReadError::Io(io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text")))
}

/// A regular file mapped read-only: only the pages parsed are ever read
/// into memory (a frame of an untrusted report naming a 3 GB
/// sparse file cost 3.1 GB when the file was read whole).
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    /// `path` if it is a non-empty regular file of at most `cap` bytes.
    pub fn open(path: &Path, cap: u64) -> Option<Mapped> {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
            .ok()?;
        let meta = f.metadata().ok()?;
        if !meta.file_type().is_file() || meta.len() == 0 || meta.len() > cap {
            return None;
        }
        let len = usize::try_from(meta.len()).ok()?;
        // SAFETY: a private read-only mapping of a regular file we opened;
        // the descriptor may be closed once mapped.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(Mapped { ptr, len })
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// Keeps the mapping to the end of the process (a command that reads
    /// what it loaded until it exits).
    pub fn leak(self) -> &'static [u8] {
        // SAFETY: never unmapped: `self` is forgotten, not dropped.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) };
        std::mem::forget(self);
        bytes
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping what `open` mapped; nothing borrows it past `self`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cudaleak-safe-read-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn reads_a_regular_file() {
        let d = scratch("regular");
        let p = d.join("f");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read_regular_file(&p, 5).unwrap(), b"hello");
        assert_eq!(read_regular_text(&p, 100).unwrap(), "hello");
    }

    #[test]
    fn refuses_a_file_over_the_cap_naming_the_cap() {
        let d = scratch("cap");
        let p = d.join("f");
        std::fs::write(&p, b"hello!").unwrap();
        let e = read_regular_file(&p, 5).unwrap_err();
        assert!(matches!(e, SafeReadError::TooLarge { size: 6, cap: 5 }), "{e:?}");
        assert!(e.to_string().contains("limit is 5 bytes"), "{e}");
    }

    #[test]
    fn a_fifo_without_writer_is_refused_at_once() {
        let d = scratch("fifo");
        let p = d.join("fifo");
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_regular_file(&p, 100).unwrap_err();
        assert!(matches!(e, SafeReadError::NotRegular("FIFO")), "{e:?}");
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let e = read_regular_file(Path::new("/dev/zero"), 100).unwrap_err();
        assert!(
            matches!(e, SafeReadError::NotRegular("character device")),
            "{e:?}"
        );
        let d = scratch("dir");
        let e = read_regular_file(&d, 100).unwrap_err();
        assert!(matches!(e, SafeReadError::NotRegular("directory")), "{e:?}");
    }
}
