//! Python stacks, read from the calling thread's own frames.
//!
//! Rules (each from a way this has gone wrong elsewhere):
//! 1. No GIL and no Python C API in a hook. PyTorch calls cudaMalloc with
//!    the GIL released while holding its allocator mutex, and ctypes.CDLL
//!    releases it too: taking it can deadlock (and on 3.11 run the garbage
//!    collector). The hook reads this thread's frame chain from memory: a
//!    thread that released the GIL is stopped in C, so its chain is frozen
//!    under it; a thread holding it is running us, not Python.
//! 2. The only calls are two thread-state getters
//!    (`PyGILState_GetThisThreadState`, the unchecked current-thread-state
//!    getter, 3.12+ only) and the finalization check (or a load of the
//!    word it tests, where its code shows it: `finalizing`), all plain
//!    reads of runtime state that take no lock.
//!    Symbols are found with `dlsym` at the first capture; libpython is
//!    never linked, and a process without Python pays one atomic load.
//! 3. Per-version layouts (`python_layouts.rs`), each checked against the
//!    running interpreter before use (3.13: against `_Py_DebugOffsets`);
//!    an unknown version, a debug or a free-threaded build turns capture
//!    off with one notice.
//! 4. A hook records (code object, guard, instruction offset, flags); the
//!    first time a trace is stored, its code objects' names, first line and
//!    line table are copied (`remember_code_objects`), so the exit report
//!    can name them after the interpreter is gone.
//!
//! Bottom up:
//!
//! 1. reads of the interpreter's memory, frame models as types, the word the finalizing getter's code reads: `memory`, `model`, `finalizing`
//! 2. the interpreter once probed (its layout, getters, status): `interpreter`
//! 3. a frame's words, and code objects and what reports keep of them: `frame`, `code`
//! 4. the logs of the last frame walks, for replay: `replay_log`
//! 5. replay of a logged walk, and patches of it: `replay`
//! 6. the frame walk, through the thread's logs: `walk`
//! 7. probing the interpreter and choosing its layout: `probe`
//! 8. the tests of replay and of a thread's logs, on frame chains in memory: `replay_tests`, `logs_tests`
//!
//! This file: a capture's entry point.

mod code;
mod finalizing;
mod frame;
mod interpreter;
#[cfg(test)]
mod logs_tests;
mod memory;
mod model;
mod probe;
mod replay;
mod replay_log;
#[cfg(test)]
mod replay_tests;
mod walk;

pub use code::{remember_code_objects, CODES};
pub use interpreter::{init, status};
pub use replay_log::{PyReplayLog, PyReplayLogs};

use cudaleak_core::record::python::PyRawFrame;
use interpreter::{ACTIVE, CAPTURE, STATE, UNPROBED};
use probe::probe;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use walk::CaptureFn;

/// What a capture of the calling thread's Python frames returned.
pub struct PyFrames {
    /// how many frames, innermost first
    pub n: usize,
    /// two captures on a thread with the same generation have the same
    /// frames (0: none; otherwise the logs', see [`PyReplayLogs::walks`])
    pub generation: u64,
    /// Where they are: null, in `out`; otherwise the log a replay took
    /// them from, which keeps them ([`take_frames`]).
    pub log: *const PyReplayLog,
}

/// The calling thread's Python frames: written into `out` by a walk or a
/// patch, or left in the log a replay repeats (see [`PyFrames`]). `held`
/// is the generation whose frames `out` holds (0: none), kept up to date.
#[inline]
pub fn capture(out: &mut [MaybeUninit<PyRawFrame>], logs: &mut PyReplayLogs, held: &mut u64) -> PyFrames {
    const NONE: PyFrames = PyFrames {
        n: 0,
        generation: 0,
        log: std::ptr::null(),
    };
    match STATE.load(Ordering::Acquire) {
        ACTIVE => {}
        // Not ACTIVE: STATE never leaves ACTIVE, so no capture has walked
        // yet: `logs` are still empty, their group count 0.
        UNPROBED => {
            if !probe() {
                return NONE;
            }
        }
        _ => return NONE,
    }
    // SAFETY: ACTIVE, so `probe` stored (Release, read Acquire above) the
    // address of a `capture_active::<M>`, a `CaptureFn`, in `CAPTURE`.
    let capture_active: CaptureFn = unsafe { std::mem::transmute(CAPTURE.load(Ordering::Relaxed)) };
    let walks = logs.walks;
    // SAFETY: see the module comment; every pointer is checked for
    // plausibility and every code object for its type before use. ACTIVE,
    // on this thread, with its own buffers: `capture_active`'s contract.
    let n = unsafe { capture_active(out, logs) };
    // A walk or patch wrote into `out` and gave its log a new generation
    // (one more walk); a replay writes nothing, gives the generation of
    // the walk it repeats, and its frames are that log's.
    let walked = logs.walks != walks;
    if walked {
        *held = if n == 0 { 0 } else { logs.generation() };
    }
    if n == 0 {
        return NONE;
    }
    PyFrames {
        n,
        generation: logs.generation(),
        log: if walked { std::ptr::null() } else { logs.last() },
    }
}

/// Copies the `n` frames of a capture that replayed `log`, of generation
/// `generation` ([`PyFrames`]), into `into`; false when they are gone:
/// the log was walked or patched since, by a hook that a signal handler
/// ran on this thread between the capture and now (then `into` holds
/// nothing to use). The frames are copied first and the generation read
/// after, so a handler that ran during the copy is seen too.
///
/// # Safety
/// `log` is a log of the calling thread's live `PyReplayLogs`, as
/// [`capture`] returned it, and `n` that capture's count.
pub unsafe fn take_frames(
    log: *const PyReplayLog,
    generation: u64,
    n: usize,
    into: &mut [MaybeUninit<PyRawFrame>],
) -> bool {
    if n > into.len() || n > replay_log::PY_REPLAY_FRAMES {
        return false;
    }
    // SAFETY: `log` is a live log of this thread (the contract), so its
    // `out` array of PY_REPLAY_FRAMES frames is readable; `into` has room
    // for `n` (checked), and the two do not overlap (a stack buffer and a
    // log are distinct fields of the thread's buffers). Raw reads only:
    // only a signal handler on this very thread writes the log meanwhile.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::addr_of!((*log).out).cast::<PyRawFrame>(),
            into.as_mut_ptr().cast::<PyRawFrame>(),
            n,
        );
    }
    // The generation after the frames, as the program order says: a
    // handler that walked into this log during the copy renewed it.
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    // SAFETY: as above, a plain field of the live log.
    unsafe { std::ptr::addr_of!((*log).generation).read_volatile() == generation }
}
