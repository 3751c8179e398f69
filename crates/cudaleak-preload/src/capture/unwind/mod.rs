//! Native stack capture: return addresses of the calling thread, innermost
//! first, without this library's own frames.
//!
//! The fast unwinder (default) keeps one compact unwind rule per return
//! address in a lock-free cache, as libunwind's fast path and PyTorch's own
//! unwinder do: after warm-up a frame costs one cache probe and two stack
//! reads. A cache miss reads the rule from the module's `.eh_frame` (gimli),
//! so code built without frame pointers unwinds correctly; code without
//! unwind tables falls back to the frame-pointer chain. Every stack read is
//! checked against the thread's stack bounds, so a wrong rule ends the walk
//! instead of faulting. `CUDALEAK_UNWINDER=dwarf` uses the backtrace crate
//! (libgcc's unwinder) instead.
//!
//! The fast unwinder is x86-64's; elsewhere (aarch64) every capture takes
//! the reference path, and the fast unwinder's parts are unused there.
//!
//! Bottom up:
//!
//! 1. unwind rules from .eh_frame, the thread's stack, libgcc's unwinder: `rules`, `stack`, `reference`
//! 2. the lock-free cache of rules by return address: `cache`
//! 3. the log a walk records, for replay: `replay_log`
//! 4. the walk from frame to frame: `walk`
//! 5. replay of the last walk, and splices of it: `replay`
//! 6. the tests, on this binary's own stack and on made-up ones: `own_stack_tests`, `made_up_stack_tests`
//!
//! This file: a capture's entry points, through the thread's log.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

mod cache;
#[cfg(test)]
mod made_up_stack_tests;
#[cfg(test)]
mod own_stack_tests;
mod reference;
mod replay;
mod replay_log;
mod rules;
mod stack;
mod walk;

pub use cache::forget_unloaded_rules;
pub use reference::capture_dwarf;
pub use replay_log::{ReplayLog, LOGS};
pub(crate) use stack::stack_bounds;

use crate::base::loader::own_range;
use crate::capture::looks::pair_mut;
use cudaleak_core::config::Unwinder;
use reference::dwarf_skipping;
use replay::{replay, replay_other, splice};
use std::mem::MaybeUninit;

/// Where a capture that took Python frames stops: after the `after`-th
/// return address into the interpreter's eval loop (`lo..hi`), the
/// outermost one that runs Python frames. What lies below it is the
/// interpreter's start-up (or an embedding program's frames): about 18 of
/// a Python pair's 25 frames, checked on every replay. 0: no
/// stop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvalStop {
    pub lo: usize,
    pub hi: usize,
    pub after: u32,
}

impl EvalStop {
    /// Whether return address `ra` is into the eval loop (its call
    /// instruction is: a call can be a function's last instruction).
    #[inline(always)]
    fn is_eval(&self, ra: usize) -> bool {
        ra.wrapping_sub(1).wrapping_sub(self.lo) < self.hi.wrapping_sub(self.lo)
    }
}

/// Fills `out` with return addresses; returns how many, and the
/// generation of the thread's replay log that they are (see
/// [`ReplayLog::generation`]): two captures on a thread with the same
/// generation have the same frames. None when the capture did not go
/// through the log (the reference unwinder, a foreign stack).
/// `stack_top`: the top of the thread's stack that the caller runs on
/// ([`stack_bounds`] of an address in its frame, which the caller had
/// already: asking again cost a capture 5 instructions); None when it is
/// not the thread's own stack (a coroutine's, a signal stack).
#[inline]
pub fn capture(
    out: &mut [MaybeUninit<u64>],
    stack_top: Option<usize>,
    log: &mut ReplayLog,
    stop: EvalStop,
) -> (usize, Option<u64>) {
    match crate::base::settings::config().unwinder {
        Unwinder::Dwarf => (capture_dwarf(out, stop), None),
        Unwinder::Fast => {
            let n = fast_skipping(out, own_range(), stack_top, log, stop);
            (n, Some(log.generation))
        }
    }
}

#[inline]
fn is_own(ip: usize, range: (usize, usize)) -> bool {
    range.0 <= ip && ip < range.1
}

/// The fast unwinder (x86-64; other architectures use the reference one),
/// leaving out return addresses inside `skip`, from the frame it is
/// inlined into; `stack_top` as for [`capture`]. A
/// capture that did not replay made a new generation of the log (see
/// [`capture`]). Inlined: a call of its own saved and restored the
/// caller's registers again, 26 instructions of a Python pair (the
/// walk starts one frame further out, a frame of ours, left out as all
/// of them are).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn fast_skipping(
    out: &mut [MaybeUninit<u64>],
    skip: (usize, usize),
    stack_top: Option<usize>,
    log: &mut ReplayLog,
    stop: EvalStop,
) -> usize {
    let (pc, sp, fp): (usize, usize, usize);
    // SAFETY: copies rip, rsp and rbp into three outputs; it reads no
    // memory, moves no stack and keeps the flags, as the options declare.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags)
        );
    }
    let Some(top) = stack_top else {
        // Frames no log holds: a generation of their own (the logs keep
        // theirs, each replay giving its log's).
        log.new_generation(0);
        return dwarf_skipping(out, skip, stop);
    };
    from_log(log, [pc, sp, fp], (sp, top), skip, stop, out)
}

/// A capture from `start` through the thread's logs: a replay of the
/// guess (the log that followed the last one the time before), of the
/// last one, or of another; or a walk, spliced from the last one (which
/// walks all of a stack it knows nothing of), into the least recently
/// used log.
#[inline(always)]
fn from_log(
    log: &mut ReplayLog,
    start: [usize; 3],
    bounds: (usize, usize),
    skip: (usize, usize),
    stop: EvalStop,
    out: &mut [MaybeUninit<u64>],
) -> usize {
    let current = log.choice.last();
    if log.choice.guessing() {
        // (the start as words: a reference to it made the hot path copy it)
        if let Some(n) = replay_guess(log, start[0], start[1], start[2], &stop, out) {
            return n;
        }
    }
    let changed = match replay(&log.logs[current], &start, stop, out) {
        Ok(n) => {
            // (the last log's use is noted when another takes its place:
            // nothing more to pay here)
            log.generation = log.generations[current];
            return n;
        }
        Err(changed) => changed,
    };
    other_logs(log, start, bounds, skip, stop, changed, out)
}

/// A replay of the guess, another log than the last ([`from_log`]), out
/// of line: a thread whose path repeats does not guess. A stack that
/// changed since the guess's walk gives None, and the next capture after
/// the last log guesses that log again.
#[inline(never)]
fn replay_guess(
    log: &mut ReplayLog,
    pc: usize,
    sp: usize,
    fp: usize,
    stop: &EvalStop,
    out: &mut [MaybeUninit<u64>],
) -> Option<usize> {
    let guess = log.choice.guess();
    let replayed = replay_other(&log.logs[guess], &[pc, sp, fp], *stop, None, out);
    crate::capture::looks::count_guess(replayed.is_some());
    match replayed {
        Some(n) => {
            log.choice.followed(guess);
            log.generation = log.generations[guess];
            Some(n)
        }
        None => {
            log.choice.guessed_wrong();
            None
        }
    }
}

/// The rest of [`from_log`], out of line: the last walk did not replay.
/// The other logs are tried from the one after it (call paths taken in
/// turn were logged in turn); each try stops at its first output that
/// changed, most often within the first few frames.
#[inline(never)]
fn other_logs(
    log: &mut ReplayLog,
    start: [usize; 3],
    bounds: (usize, usize),
    skip: (usize, usize),
    stop: EvalStop,
    changed: Option<usize>,
    out: &mut [MaybeUninit<u64>],
) -> usize {
    let current = log.choice.missed();
    let slot = if !log.choice.look_now() {
        // Looking has not paid lately: the last log is spliced in place,
        // as a thread with one log would.
        current
    } else {
        // The other logs, from the one after the last: the first that
        // replays gives the frames.
        let mut all_kept = true;
        for k in 1..LOGS {
            let i = (current + k) % LOGS;
            all_kept &= log.logs[i].len != 0;
            if let Some(n) = replay_other(&log.logs[i], &start, stop, changed, out) {
                log.choice.found(i);
                log.generation = log.generations[i];
                return n;
            }
        }
        log.choice.found_none(all_kept);
        // None: the least recently used log becomes a copy of the last,
        // for the splice to start from.
        let v = log.choice.victim();
        let (from, into) = pair_mut(&mut log.logs, current, v);
        into.copy_from(from);
        v
    };
    log.choice.take(slot);
    log.generations[slot] = log.new_generation(slot);
    splice(
        &mut log.logs[slot],
        &mut log.scratch,
        start,
        bounds,
        skip,
        stop,
        changed,
        out,
    )
}

#[cfg(not(target_arch = "x86_64"))]
fn fast_skipping(
    out: &mut [MaybeUninit<u64>],
    skip: (usize, usize),
    _stack_top: Option<usize>,
    log: &mut ReplayLog,
    stop: EvalStop,
) -> usize {
    log.new_generation(0);
    dwarf_skipping(out, skip, stop)
}
