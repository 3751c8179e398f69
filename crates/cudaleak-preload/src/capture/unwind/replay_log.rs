//! The replay log: what the last walk on a thread read, step by step, so
//! that the next capture can replay it or splice from it.

use super::rules::{KIND_MASK, KIND_RBP, KIND_RBP_DEREF, RBP_SAVED};

/// Every stack word the last full walk on a thread read, with its value.
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
pub struct ReplayLog {
    /// The last walk's log.
    pub(super) last: WalkLog,
    /// Where a splice logs the frames it walks, before they take the
    /// place of those that changed in `last` (only that part is used).
    pub(super) scratch: WalkLog,
    /// Bumped by every walk (full, spliced or not logged), kept by a
    /// replay: the frames of a capture with generation g are those of the
    /// walk that made g. A trace's reuse (`capture.rs`) compares
    /// generations instead of frames, and a capture that was
    /// never interned (a failed call) cannot lend its replay to the
    /// previous trace's id.
    pub(super) generation: u64,
}

impl ReplayLog {
    pub const EMPTY: ReplayLog = ReplayLog {
        last: WalkLog::EMPTY,
        scratch: WalkLog::EMPTY,
        generation: 0,
    };
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
