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
//!    getter) and the finalization check, all plain reads of runtime state
//!    that take no lock.
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
//! 1. reads of the interpreter's memory, frame models as types: `memory`, `model`
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
pub use replay_log::PyReplayLogs;

use cudaleak_core::record::python::PyRawFrame;
use interpreter::{ACTIVE, CAPTURE, STATE, UNPROBED};
use probe::probe;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use walk::CaptureFn;

/// Fills `out` with the calling thread's Python frames, innermost first;
/// returns how many, and their generation: two captures on a thread with
/// the same generation have the same frames (0: none; otherwise the
/// logs', see [`PyReplayLogs::walks`]). `held` is the generation
/// whose frames `out` already holds (0: none), and is set to the new one:
/// a replay of the frames `out` holds copies nothing (a stack
/// buffer, taken in turn, usually holds the same frames as the last time).
#[inline]
pub fn capture(out: &mut [MaybeUninit<PyRawFrame>], logs: &mut PyReplayLogs, held: &mut u64) -> (usize, u64) {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => {}
        // Not ACTIVE: STATE never leaves ACTIVE, so no capture has walked
        // yet: `logs` are still empty, their group count 0.
        UNPROBED => {
            if !probe() {
                *held = 0;
                return (0, 0);
            }
        }
        _ => {
            *held = 0;
            return (0, 0);
        }
    }
    // SAFETY: ACTIVE, so `probe` stored (Release, read Acquire above) the
    // address of a `capture_active::<M>`, a `CaptureFn`, in `CAPTURE`.
    let capture_active: CaptureFn = unsafe { std::mem::transmute(CAPTURE.load(Ordering::Relaxed)) };
    // SAFETY: see the module comment; every pointer is checked for
    // plausibility and every code object for its type before use. ACTIVE,
    // on this thread, with its own buffers: `capture_active`'s contract.
    let n = unsafe { capture_active(out, logs, *held) };
    // A walk or patch that returned frames gave its log a new generation;
    // a replay gives the one of the walk it repeats.
    let generation = if n == 0 { 0 } else { logs.generation() };
    *held = generation;
    (n, generation)
}
