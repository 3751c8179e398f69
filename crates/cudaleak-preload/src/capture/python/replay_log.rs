//! The logs of the last frame walks on a thread, for replay.

use super::frame::{owner_of, Visit};
use super::model::FrameModelType;
use crate::capture::looks::LogChoice;
use crate::capture::python_layouts::PyLayout;
use cudaleak_core::record::python::PyRawFrame;

/// What one full frame walk on a thread saw, for replay (a log of
/// [`PyReplayLogs`]).
///
/// A walk's result is a function of its first frame, the frame words it
/// reads (`previous`, code, instruction, owner and entry bytes) and facts
/// of the code objects it meets, which do not change while the object
/// lives: its type, its `_co_firsttraceable`, and the guard words
/// (`guard`). So when a capture starts at the same frame and every logged
/// frame word and guard still holds, the walk would produce the same
/// frames: they are copied from the log. The checks are independent
/// loads, where the walk is a chain of dependent ones and a dozen tests a
/// frame: a loop that allocates from the same Python line (a training
/// step) pays a fraction of a walk. Only walks of up to `PY_REPLAY_FRAMES`
/// frames that ended at the end of the chain are logged.
///
/// Replay checks in two passes. First the frames' words, in chain order:
/// each frame's address is the `previous` word of the one before, just
/// checked. Then the code objects: the guard of each one the walk used
/// (`guards`; a run of frames running one code object, a recursion, logs
/// it once), and on 3.13+ that each executable the walk found not to be a
/// code object still is not one (`not_code`). Every object the second pass
/// reads is the code word of a frame the first pass found unchanged, so the
/// object that live frame executes, live, as when the walk read it; and an
/// object at one address at one time is one object, so one check serves
/// all the frames that run it. On 3.11 and 3.12 the first pass compares a
/// frame's instruction word and not its code word: the instruction points
/// into the code object the frame runs, so an unchanged one means the
/// logged object, or a new one over its freed memory, which its guard
/// tells (`FrameModelType::INSTR_NAMES_CODE`). One pass that asked each frame what else to
/// check (a fate byte per visit) cost 24 instructions a frame where these
/// cost 15 (3.11, callgrind over bench/py_pairs.py).
///
/// When frames changed in place (another line, or another function
/// called from the same frame), the others are checked so and those
/// frames alone walked ([`patch`](super::replay::patch)).
pub struct PyReplayLog {
    /// frames visited; 0 when the log is not usable
    pub(super) visited: usize,
    /// the chain's innermost frame, where the logged walk started
    pub(super) head: usize,
    /// Bumped by every full walk (logged or not) and every patched
    /// replay, kept by a replay: a capture's frames are those of the walk
    /// or patch that made its generation, so a trace is reused by
    /// comparing generations, one number, not frames (`capture/mod.rs`).
    pub(super) generation: u64,
    /// eval-loop groups of the frames the last capture returned
    /// ([`PyReplayLog::eval_groups`])
    pub(super) groups: usize,
    /// entries of `guards` and `not_code` in use
    pub(super) guarded: usize,
    pub(super) not_codes: usize,
    pub(super) recorded: usize,
    pub(super) visits: [Visit; PY_REPLAY_FRAMES],
    /// the visit that recorded each frame of `out` (`patch`)
    pub(super) visit_of: [u8; PY_REPLAY_FRAMES],
    pub(super) guards: [Guarded; PY_REPLAY_FRAMES],
    /// 3.13+: frames' executables that were not code objects (skip case 2
    /// of `walk::walk_full`)
    pub(super) not_code: [usize; PY_REPLAY_FRAMES],
    pub(super) out: [PyRawFrame; PY_REPLAY_FRAMES],
}

pub(super) const PY_REPLAY_FRAMES: usize = 64;

/// The walks of a thread's last [`PY_LOGS`] Python call paths.
///
/// A training step's ops allocate from a dozen or more Python call paths
/// in turn (a model's layers, each calling the allocator through its own
/// functions), and the frames that differ from one to the next are often
/// a recursion's or a run of one function's (a log shares one guard entry
/// between them, so [`patch`](super::replay::patch) cannot take them): with
/// one log, every such capture walked all its frames again. A capture
/// tries first the log that followed the last one the time before (when
/// that is another; [`LogChoice::guess`]), then the last log, then the
/// others (the walk's module, `other_logs`), and walks into the least
/// recently used one only when none replays; where looking rarely pays,
/// the thread looks less often ([`Looks`](crate::capture::looks::Looks)).
///
/// Empty, all zero bits: a thread's buffers are allocated zeroed and the
/// logs are not written before use (`capture/mod.rs`; a test checks it).
pub struct PyReplayLogs {
    pub(super) logs: [PyReplayLog; PY_LOGS],
    /// which log the last capture used, when each was last used, and
    /// when the next captures look through the others
    pub(super) choice: LogChoice<PY_LOGS>,
    /// walks and patches so far on this thread: a log's generation is
    /// this count shifted left by [`PY_LOG_BITS`], with the log's slot in
    /// the low bits, so that generations are unique on the thread (two
    /// captures with one generation have the same frames) and a trace
    /// cache can be keyed by log (`capture/mod.rs`).
    pub(super) walks: u64,
}

/// Logs a thread keeps (a power of two): [`PyReplayLogs::logs`].
pub(super) const PY_LOG_BITS: u32 = 5;
pub(super) const PY_LOGS: usize = 1 << PY_LOG_BITS;

impl PyReplayLogs {
    #[cfg(test)]
    pub const EMPTY: PyReplayLogs = PyReplayLogs {
        logs: [PyReplayLog::EMPTY; PY_LOGS],
        choice: LogChoice::ZERO,
        walks: 0,
    };

    /// The log the last capture replayed or wrote.
    #[inline(always)]
    pub(super) fn last(&mut self) -> &mut PyReplayLog {
        &mut self.logs[self.choice.last()]
    }

    /// After [`capture`](super::capture): the eval-loop invocations of
    /// the frames it returned ([`PyReplayLog::eval_groups`]).
    pub fn eval_groups(&self) -> usize {
        self.logs[self.choice.last()].eval_groups()
    }

    /// The generation of the frames the last capture returned (0: none).
    #[inline(always)]
    pub(super) fn generation(&self) -> u64 {
        self.logs[self.choice.last()].generation
    }

    /// Gives log `slot`, just walked or patched, a new generation.
    #[inline(always)]
    pub(super) fn renew(&mut self, slot: usize) {
        self.walks += 1;
        self.logs[slot % PY_LOGS].generation = (self.walks << PY_LOG_BITS) | slot as u64;
    }

    /// Forgets every walk but the last (tests: a capture that must
    /// replay, patch or walk the last one).
    #[cfg(test)]
    pub(super) fn forget_others(&mut self) {
        let current = self.choice.last();
        for (i, log) in self.logs.iter_mut().enumerate() {
            if i != current {
                log.visited = 0;
            }
        }
    }
}

/// Where a walk keeps the visit that recorded a frame in its flags
/// until it ends (`walk_full`); the flags proper are below.
pub(super) const VISIT_SHIFT: u32 = 8;

/// A code object the walk used, and its guard then.
#[derive(Clone, Copy)]
pub(super) struct Guarded {
    pub(super) code: usize,
    pub(super) guard: u64,
}

impl PyReplayLog {
    #[cfg(test)]
    pub const EMPTY: PyReplayLog = PyReplayLog {
        visited: 0,
        generation: 0,
        head: 0,
        groups: 0,
        guarded: 0,
        not_codes: 0,
        recorded: 0,
        visit_of: [0; PY_REPLAY_FRAMES],
        visits: [Visit {
            next: 0,
            code: 0,
            instr: 0,
            bytes: 0,
        }; PY_REPLAY_FRAMES],
        guards: [Guarded { code: 0, guard: 0 }; PY_REPLAY_FRAMES],
        not_code: [0; PY_REPLAY_FRAMES],
        out: [PyRawFrame {
            code: 0,
            guard: 0,
            offset: 0,
            flags: 0,
        }; PY_REPLAY_FRAMES],
    };

    /// After [`capture`](super::capture) with this log: how many eval-loop invocations
    /// the frames it returned came from, that is how many of them are
    /// flagged `PY_FRAME_ENTRY` (`eval_groups(frames).len()`); 0 when it
    /// returned none. A replayed capture costs nothing more: the count is
    /// the logged walk's. It tells the native unwinder how many
    /// `_PyEval_EvalFrameDefault` frames the Python frames account for.
    pub fn eval_groups(&self) -> usize {
        self.groups
    }

    /// Whether the walk used visit `i`'s code object (and so checked its
    /// guard): not a shim, and on 3.13+ a code object; in a logged walk
    /// every other visit did.
    #[inline(always)]
    fn used<M: FrameModelType>(&self, l: &PyLayout, i: usize) -> bool {
        let v = &self.visits[i];
        let shim = M::SINCE_312 && owner_of::<M>(v.bytes) >= l.owner_c_entry.unwrap_or(u8::MAX);
        let not_code = M::SINCE_313 && self.not_code[..self.not_codes].contains(&v.code);
        !shim && !not_code
    }

    /// What `patch` needs of the walk that is not in its frames, for visit
    /// `i`, which used its code object and is to run `new_code` instead:
    /// that object's `guards` entry if no other visit relies on it and no
    /// visit next to it runs `new_code`, and whether `i` is the first visit
    /// that used one (before 3.13 the walk checks only its code object by
    /// type). The walk logged an entry where a visit's code object
    /// differed from the last one logged, so a run of visits running one
    /// object (a recursion) shares one; a patch keeps that so (a visit
    /// patched to its neighbour's code object would join its run with an
    /// entry of its own, and the entries after it would be miscounted
    /// here). Worked out when a patch is tried, not by the walk: kept
    /// there, it cost the walk 25 instructions a frame, and worked out for
    /// every visit, a patch 500.
    pub(super) fn entry_of<M: FrameModelType>(
        &self,
        l: &PyLayout,
        i: usize,
        new_code: usize,
    ) -> (Option<usize>, bool) {
        let code = self.visits[i].code;
        let mut entry = usize::MAX;
        let mut last = 0;
        let mut first = true;
        let mut shared = false;
        for j in 0..=i {
            if !self.used::<M>(l, j) {
                continue;
            }
            let c = self.visits[j].code;
            if j == i {
                // the visit before it (that used one) runs it too, or would
                shared = c == last || new_code == last;
            }
            if c != last {
                entry = entry.wrapping_add(1);
                last = c;
            }
            first &= j == i;
        }
        if let Some(j) = (i + 1..self.visited).find(|&j| self.used::<M>(l, j)) {
            shared |= self.visits[j].code == code || self.visits[j].code == new_code;
        }
        ((!shared).then_some(entry), first)
    }

    /// Makes the log unusable and its group count 0: a capture that
    /// returns no frames without walking.
    #[cold]
    pub(super) fn forget(&mut self) {
        self.visited = 0;
        self.groups = 0;
    }

    /// Makes `self` the same log as `src`, copying only the parts in use
    /// (a log holds 5 KiB; a patch starts from a copy of the last log,
    /// which keeps its own path).
    pub(super) fn copy_from(&mut self, src: &PyReplayLog) {
        let visited = src.visited.min(PY_REPLAY_FRAMES);
        let recorded = src.recorded.min(PY_REPLAY_FRAMES);
        let guarded = src.guarded.min(PY_REPLAY_FRAMES);
        let not_codes = src.not_codes.min(PY_REPLAY_FRAMES);
        (self.visited, self.head, self.generation, self.groups) =
            (src.visited, src.head, src.generation, src.groups);
        (self.guarded, self.not_codes, self.recorded) = (src.guarded, src.not_codes, src.recorded);
        self.visits[..visited].copy_from_slice(&src.visits[..visited]);
        self.visit_of[..recorded].copy_from_slice(&src.visit_of[..recorded]);
        self.out[..recorded].copy_from_slice(&src.out[..recorded]);
        self.guards[..guarded].copy_from_slice(&src.guards[..guarded]);
        self.not_code[..not_codes].copy_from_slice(&src.not_code[..not_codes]);
    }
}
