//! The replay logs: what the last walks on a thread read, step by step,
//! so that the next capture can replay one or splice from the last.

use super::rules::{KIND_MASK, KIND_RBP, KIND_RBP_DEREF, RBP_SAVED};
use crate::capture::looks::LogChoice;

/// Every stack word the last walks on a thread read, with its value.
///
/// A walk is a function of its start registers, the words it reads and the
/// unwind rules (fixed per return address). So when a new capture starts
/// from the same registers and every recorded word still holds its value,
/// the walk would read the same words and produce the same frames: the
/// result is replayed from the log. The checks are independent loads,
/// where a walk is a chain of dependent ones (read a return address, look
/// up its rule, compute the next frame, read again), so a repeated stack
/// (a training loop) costs about a nanosecond a frame instead of several.
///
/// A stack that changed in part is spliced from the last walk ([`splice`](super::replay::splice)):
/// its frames up to the first one whose words changed are kept, the walk
/// goes on from there, and as soon as it stands where the last walk stood
/// (same stack pointer, same return address, same rbp where it matters)
/// the rest of the last walk is checked word by word and taken. A program
/// that allocates from several call paths in turn (1,024 in
/// `bench/pairs.c mixed`) walks only the frames that differ.
///
/// The thread keeps the walks of its last [`LOGS`] call paths: a capture
/// tries first the log that followed the last one the time before (when
/// that is another; [`LogChoice::guess`]), then the last one, then the
/// others before it walks (into the least recently used), so that up to
/// 32 paths taken in turn, as a training step's ops take theirs, each
/// replay, most of them at the first try. Where looking pays
/// too seldom (more paths than logs), the thread looks less often
/// ([`Looks`](crate::capture::looks::Looks)).
pub struct ReplayLog {
    /// The walks kept: the last one, and those of the other call paths
    /// the thread allocated from lately. A training step's ops allocate
    /// from a dozen or more call paths in turn, each of which would
    /// otherwise be spliced (and its trace hashed again) on every call.
    pub(super) logs: [WalkLog; LOGS],
    /// the generation of each log's walk
    pub(super) generations: [u64; LOGS],
    /// which log the last capture used, when each was last used, and
    /// when the next captures look through the other logs: a thread
    /// whose call paths rarely repeat (more of them than logs, in turn)
    /// would pay for every look
    pub(super) choice: LogChoice<LOGS>,
    /// Where a splice logs the frames it walks, before they take the
    /// place of those that changed in the log it starts from (only that
    /// part is used).
    pub(super) scratch: WalkLog,
    /// Walks so far on this thread (full, spliced or not logged).
    pub(super) walks: u64,
    /// The generation of the last capture's frames: a new one for every
    /// walk, the walk's for a replay of its log, so that the frames of
    /// two captures with the same generation are the same. A walk's
    /// generation is `walks` shifted left by [`LOG_BITS`], with the log
    /// it was written into in the low bits (a trace cache keyed by log,
    /// `capture/mod.rs`). A trace's reuse compares generations instead of
    /// frames, and a capture that was never interned (a failed call)
    /// cannot lend its replay to another trace's id.
    pub(super) generation: u64,
}

/// Logs a thread keeps (a power of two): [`ReplayLog::logs`].
pub const LOG_BITS: u32 = 5;
pub const LOGS: usize = 1 << LOG_BITS;
impl ReplayLog {
    /// The empty logs: all zero bits, so that zeroed memory holds them
    /// (`capture/mod.rs` allocates a thread's buffers zeroed; a test
    /// checks this).
    #[cfg(test)]
    pub const EMPTY: ReplayLog = ReplayLog {
        logs: [WalkLog::EMPTY; LOGS],
        generations: [0; LOGS],
        choice: LogChoice::ZERO,
        scratch: WalkLog::EMPTY,
        walks: 0,
        generation: 0,
    };

    /// The log the last capture replayed or wrote.
    #[cfg(test)]
    pub(super) fn last(&self) -> &WalkLog {
        &self.logs[self.choice.last()]
    }

    /// Forgets every walk (tests: a capture that must walk).
    #[cfg(test)]
    pub(super) fn forget(&mut self) {
        for log in &mut self.logs {
            log.len = 0;
        }
        // (and which log followed which: no guess either)
        self.choice = LogChoice::ZERO;
    }

    /// Forgets every walk but the last (tests: a capture that must
    /// replay or splice the last one).
    #[cfg(test)]
    pub(super) fn forget_others(&mut self) {
        for (i, log) in self.logs.iter_mut().enumerate() {
            if i != self.choice.last() {
                log.len = 0;
            }
        }
    }

    /// A new generation, for frames the walk writes into log `slot` (or
    /// that no log holds: slot 0, which only keys a cache).
    #[inline(always)]
    pub(super) fn new_generation(&mut self, slot: usize) -> u64 {
        self.walks += 1;
        self.generation = (self.walks << LOG_BITS) | slot as u64;
        self.generation
    }
}

/// One walk's log.
pub(super) struct WalkLog {
    pub(super) start: [usize; 3],
    /// whether the walk used the start's rbp (a frame-pointer rule before
    /// any saved rbp was restored); when not, rbp may hold anything (a
    /// caller's loop counter, without frame pointers) and replay still holds
    pub(super) fp_used: bool,
    /// the walk stopped because the output was full (the stack goes on)
    pub(super) capped: bool,
    /// the output's length: a walk into another may end elsewhere
    pub(super) room: usize,
    /// the walk's [`EvalStop::after`](super::EvalStop::after): another stops elsewhere
    pub(super) stop_after: u32,
    /// recorded reads; 0 when the log is not usable
    pub(super) len: usize,
    /// of which reads of output return addresses, in walk order, at the
    /// front of `reads`; the others are at its back
    pub(super) outputs: usize,
    /// (address, value): the output return addresses from the front, the
    /// other words (saved rbp, our own frames' return addresses) from the
    /// back. Kept apart, replay checks the others in one tight loop and
    /// writes each output without testing a flag (about 110
    /// instructions less for a 25-frame stack).
    pub(super) reads: [(usize, usize); REPLAY_READS],
    /// steps recorded: where each frame's unwinding started (a splice
    /// resumes and meets walks there)
    pub(super) steps: usize,
    pub(super) step: [LoggedStep; REPLAY_STEPS],
}

impl WalkLog {
    #[cfg(test)]
    const EMPTY: WalkLog = WalkLog {
        start: [0; 3],
        fp_used: false,
        capped: false,
        room: 0,
        stop_after: 0,
        len: 0,
        outputs: 0,
        reads: [(0, 0); REPLAY_READS],
        steps: 0,
        step: [LoggedStep::EMPTY; REPLAY_STEPS],
    };

    /// Makes `self` the same log as `src`, copying only the parts in
    /// use (a log holds 11 KiB, a 25-frame walk fills 2).
    pub(super) fn copy_from(&mut self, src: &WalkLog) {
        const R: usize = REPLAY_READS;
        let others = src.len.saturating_sub(src.outputs);
        (self.start, self.fp_used, self.capped, self.room, self.stop_after) =
            (src.start, src.fp_used, src.capped, src.room, src.stop_after);
        (self.len, self.outputs, self.steps) = (src.len, src.outputs, src.steps);
        self.reads[..src.outputs].copy_from_slice(&src.reads[..src.outputs]);
        self.reads[R - others..].copy_from_slice(&src.reads[R - others..]);
        let steps = src.steps.min(REPLAY_STEPS);
        self.step[..steps].copy_from_slice(&src.step[..steps]);
    }

    /// Whether the start's rbp was used before step `k` (`k == steps`: by
    /// the whole walk).
    #[inline(always)]
    pub(super) fn fp_used_before(&self, k: usize) -> bool {
        if k < self.steps {
            self.step[k].flags & STEP_FP_USED != 0
        } else {
            self.fp_used
        }
    }

    /// Whether the walk from step `k` on uses the rbp it had there, before
    /// a rule restores a saved one.
    pub(super) fn needs_fp_at(&self, k: usize) -> bool {
        for s in &self.step[k..self.steps] {
            let kind = s.kind & KIND_MASK;
            if kind == KIND_RBP || kind == KIND_RBP_DEREF {
                return true;
            }
            if s.kind & RBP_SAVED != 0 {
                return false;
            }
        }
        false
    }
}

pub(super) const REPLAY_READS: usize = 192;
/// A step notes at least one read, except the last (where a walk stops).
pub(super) const REPLAY_STEPS: usize = REPLAY_READS + 1;

/// Where the unwinding of one frame starts: the state a walk carries from
/// frame to frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FrameStart {
    /// the address whose rule is looked up (the start's pc, then each
    /// return address less one)
    pub(super) lookup: usize,
    pub(super) sp: usize,
    pub(super) fp: usize,
    /// where `fp` was read from; 0: it is the start's rbp
    pub(super) fp_at: usize,
    /// `fp` was restored from `fp_at` and that read is not logged yet: it
    /// is logged only once a rule uses rbp (without frame pointers,
    /// callers park anything in rbp)
    pub(super) pending: bool,
    /// return addresses into the eval loop output so far ([`EvalStop`](super::EvalStop))
    pub(super) evals: u32,
}

/// A logged step: where it started, its rule, and how many reads the log
/// held before it.
#[derive(Clone, Copy)]
pub(super) struct LoggedStep {
    pub(super) lookup: usize,
    pub(super) sp: usize,
    pub(super) fp: usize,
    pub(super) fp_at: usize,
    pub(super) outputs: u16,
    pub(super) others: u16,
    /// the rule's kind byte (with `RBP_SAVED`)
    pub(super) kind: u8,
    /// `STEP_*`
    pub(super) flags: u8,
    /// `FrameStart::evals` (at most the output's 128 frames)
    pub(super) evals: u8,
}

/// The step's `FrameStart::pending`.
pub(super) const STEP_PENDING: u8 = 1;
/// An earlier step used the start's rbp.
pub(super) const STEP_FP_USED: u8 = 2;

impl LoggedStep {
    #[cfg(test)]
    const EMPTY: LoggedStep = LoggedStep {
        lookup: 0,
        sp: 0,
        fp: 0,
        fp_at: 0,
        outputs: 0,
        others: 0,
        kind: 0,
        flags: 0,
        evals: 0,
    };
}

/// Reads and steps that a walk records (or not, when the log is full).
pub(super) struct Recorder<'a> {
    pub(super) log: &'a mut WalkLog,
    pub(super) outputs: usize,
    pub(super) others: usize,
    pub(super) steps: usize,
    pub(super) overflow: bool,
    pub(super) fp_used: bool,
}

impl<'a> Recorder<'a> {
    /// Where the log's parts reach now (steps past the log's room are
    /// not there: `overflow` says so).
    pub(super) fn counts(&self) -> Counts {
        Counts {
            steps: self.steps.min(REPLAY_STEPS),
            outputs: self.outputs,
            others: self.others,
        }
    }

    pub(super) fn new(log: &'a mut WalkLog) -> Self {
        Recorder {
            log,
            outputs: 0,
            others: 0,
            steps: 0,
            overflow: false,
            fp_used: false,
        }
    }

    #[inline(always)]
    pub(super) fn note(&mut self, addr: usize, value: usize, output: bool) {
        if self.outputs + self.others >= REPLAY_READS {
            self.overflow = true;
        } else if output {
            self.log.reads[self.outputs] = (addr, value);
            self.outputs += 1;
        } else {
            self.others += 1;
            self.log.reads[REPLAY_READS - self.others] = (addr, value);
        }
    }

    #[inline(always)]
    pub(super) fn step(&mut self, at: &FrameStart, kind: u8) {
        if self.steps < REPLAY_STEPS {
            self.log.step[self.steps] = LoggedStep {
                lookup: at.lookup,
                sp: at.sp,
                fp: at.fp,
                fp_at: at.fp_at,
                // (at most REPLAY_READS: they fit)
                outputs: self.outputs as u16,
                others: self.others as u16,
                kind,
                flags: if at.pending { STEP_PENDING } else { 0 }
                    | if self.fp_used { STEP_FP_USED } else { 0 },
                evals: at.evals as u8,
            };
        } else {
            self.overflow = true;
        }
        self.steps += 1;
    }
}

/// How far a log's parts reach: its steps, its outputs from the front and
/// its other reads from the back of `reads`.
#[derive(Clone, Copy)]
pub(super) struct Counts {
    pub(super) steps: usize,
    pub(super) outputs: usize,
    pub(super) others: usize,
}

impl Counts {
    /// Copies what a splice walked into `scratch`, from where the kept
    /// part ends (`kept`) to `self`, into `last`.
    pub(super) fn take_walked(self, kept: Counts, scratch: &WalkLog, last: &mut WalkLog) {
        const R: usize = REPLAY_READS;
        last.step[kept.steps..self.steps].copy_from_slice(&scratch.step[kept.steps..self.steps]);
        last.reads[kept.outputs..self.outputs].copy_from_slice(&scratch.reads[kept.outputs..self.outputs]);
        last.reads[R - self.others..R - kept.others]
            .copy_from_slice(&scratch.reads[R - self.others..R - kept.others]);
    }
}
