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
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use crate::base::loader::{find_module, own_range};
use crate::base::thread::ThreadState;
use cudaleak_core::config::Unwinder;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

/// After a `dlclose` unloaded objects: the cached unwind rules of return
/// addresses that no longer lie in a loaded object are retired (their key
/// becomes [`RETIRED`], which no address equals and lookups probe past),
/// so code loaded later at the same address gets its own rules.
pub fn forget_unloaded_rules(is_gone: &dyn Fn(usize) -> bool) {
    for key in &CACHE_KEYS {
        let pc = key.load(Ordering::Acquire);
        if pc != 0 && pc != RETIRED && is_gone(pc as usize - 1) {
            key.store(RETIRED, Ordering::Release);
        }
    }
}

/// The key of a retired cache slot.
const RETIRED: u64 = u64::MAX;

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
#[inline]
pub fn capture(
    out: &mut [MaybeUninit<u64>],
    thread: &ThreadState,
    log: &mut ReplayLog,
    stop: EvalStop,
) -> (usize, Option<u64>) {
    match crate::base::settings::config().unwinder {
        Unwinder::Dwarf => (capture_dwarf(out, stop), None),
        Unwinder::Fast => {
            let n = fast_skipping(out, own_range(), thread, log, stop);
            (n, Some(log.generation))
        }
    }
}

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
/// A stack that changed in part is spliced from the last walk ([`splice`]):
/// its frames up to the first one whose words changed are kept, the walk
/// goes on from there, and as soon as it stands where the last walk stood
/// (same stack pointer, same return address, same rbp where it matters)
/// the rest of the last walk is checked word by word and taken. A program
/// that allocates from several call paths in turn (1,024 in
/// `bench/pairs.c mixed`) walks only the frames that differ.
pub struct ReplayLog {
    /// The last walk's log.
    last: Walked,
    /// Where a splice logs the frames it walks, before they take the
    /// place of those that changed in `last` (only that part is used).
    scratch: Walked,
    /// Bumped by every walk (full, spliced or not logged), kept by a
    /// replay: the frames of a capture with generation g are those of the
    /// walk that made g. A trace's reuse (`capture.rs`) compares
    /// generations instead of frames, and a capture that was
    /// never interned (a failed call) cannot lend its replay to the
    /// previous trace's id.
    generation: u64,
}

impl ReplayLog {
    pub const EMPTY: ReplayLog = ReplayLog {
        last: Walked::EMPTY,
        scratch: Walked::EMPTY,
        generation: 0,
    };
}

/// One walk's log.
struct Walked {
    start: [usize; 3],
    /// whether the walk used the start's rbp (a frame-pointer rule before
    /// any saved rbp was restored); when not, rbp may hold anything (a
    /// caller's loop counter, without frame pointers) and replay still holds
    fp_used: bool,
    /// the walk stopped because the output was full (the stack goes on)
    capped: bool,
    /// the output's length: a walk into another may end elsewhere
    room: usize,
    /// the walk's [`EvalStop::after`]: another stops elsewhere
    stop_after: u32,
    /// recorded reads; 0 when the log is not usable
    len: usize,
    /// of which reads of output return addresses, in walk order, at the
    /// front of `reads`; the others are at its back
    outputs: usize,
    /// (address, value): the output return addresses from the front, the
    /// other words (saved rbp, our own frames' return addresses) from the
    /// back. Kept apart, replay checks the others in one tight loop and
    /// writes each output without testing a flag (about 110
    /// instructions less for a 25-frame stack).
    reads: [(usize, usize); REPLAY_READS],
    /// steps recorded: where each frame's unwinding started (a splice
    /// resumes and meets walks there)
    steps: usize,
    step: [Step; REPLAY_STEPS],
}

impl Walked {
    const EMPTY: Walked = Walked {
        start: [0; 3],
        fp_used: false,
        capped: false,
        room: 0,
        stop_after: 0,
        len: 0,
        outputs: 0,
        reads: [(0, 0); REPLAY_READS],
        steps: 0,
        step: [Step::EMPTY; REPLAY_STEPS],
    };

    /// Whether the start's rbp was used before step `k` (`k == steps`: by
    /// the whole walk).
    #[inline(always)]
    fn fp_used_before(&self, k: usize) -> bool {
        if k < self.steps {
            self.step[k].flags & STEP_FP_USED != 0
        } else {
            self.fp_used
        }
    }

    /// Whether the walk from step `k` on uses the rbp it had there, before
    /// a rule restores a saved one.
    fn needs_fp_at(&self, k: usize) -> bool {
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

const REPLAY_READS: usize = 192;
/// A step notes at least one read, except the last (where a walk stops).
const REPLAY_STEPS: usize = REPLAY_READS + 1;

/// Where the unwinding of one frame starts: the state a walk carries from
/// frame to frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct At {
    /// the address whose rule is looked up (the start's pc, then each
    /// return address less one)
    lookup: usize,
    sp: usize,
    fp: usize,
    /// where `fp` was read from; 0: it is the start's rbp
    fp_at: usize,
    /// `fp` was restored from `fp_at` and that read is not logged yet: it
    /// is logged only once a rule uses rbp (without frame pointers,
    /// callers park anything in rbp)
    pending: bool,
    /// return addresses into the eval loop output so far ([`EvalStop`])
    evals: u32,
}

/// A logged step: where it started, its rule, and how many reads the log
/// held before it.
#[derive(Clone, Copy)]
struct Step {
    lookup: usize,
    sp: usize,
    fp: usize,
    fp_at: usize,
    outputs: u16,
    others: u16,
    /// the rule's kind byte (with `RBP_SAVED`)
    kind: u8,
    /// `STEP_*`
    flags: u8,
    /// `At::evals` (at most the output's 128 frames)
    evals: u8,
}

/// The step's `At::pending`.
const STEP_PENDING: u8 = 1;
/// An earlier step used the start's rbp.
const STEP_FP_USED: u8 = 2;

impl Step {
    const EMPTY: Step = Step {
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
struct Recorder<'a> {
    log: &'a mut Walked,
    outputs: usize,
    others: usize,
    steps: usize,
    overflow: bool,
    fp_used: bool,
}

impl<'a> Recorder<'a> {
    /// Where the log's parts reach now (steps past the log's room are
    /// not there: `overflow` says so).
    fn counts(&self) -> Counts {
        Counts {
            steps: self.steps.min(REPLAY_STEPS),
            outputs: self.outputs,
            others: self.others,
        }
    }

    fn new(log: &'a mut Walked) -> Self {
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
    fn note(&mut self, addr: usize, value: usize, output: bool) {
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
    fn step(&mut self, at: &At, kind: u8) {
        if self.steps < REPLAY_STEPS {
            self.log.step[self.steps] = Step {
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
struct Counts {
    steps: usize,
    outputs: usize,
    others: usize,
}

impl Counts {
    /// Copies what a splice walked into `scratch`, from where the kept
    /// part ends (`kept`) to `self`, into `last`.
    fn take_walked(self, kept: Counts, scratch: &Walked, last: &mut Walked) {
        const R: usize = REPLAY_READS;
        last.step[kept.steps..self.steps].copy_from_slice(&scratch.step[kept.steps..self.steps]);
        last.reads[kept.outputs..self.outputs].copy_from_slice(&scratch.reads[kept.outputs..self.outputs]);
        last.reads[R - self.others..R - kept.others]
            .copy_from_slice(&scratch.reads[R - self.others..R - kept.others]);
    }
}

/// Why a replay did not happen: the first output read that changed,
/// when the log was made from the same start and all its other reads
/// hold (what a splice would look for again); None otherwise.
type Changed = Option<usize>;

/// Replays the log if the stack is unchanged.
#[inline(always)]
fn replay(
    log: &Walked,
    start: [usize; 3],
    stop: EvalStop,
    out: &mut [MaybeUninit<u64>],
) -> Result<usize, Changed> {
    if log.len == 0
        || log.start[..2] != start[..2]
        || (log.fp_used && log.start[2] != start[2])
        || log.stop_after != stop.after
        || log.room != out.len()
    {
        return Err(None);
    }
    let outputs = &log.reads[..log.outputs];
    for &(a, v) in &log.reads[REPLAY_READS - (log.len - log.outputs)..] {
        // SAFETY: the address was checked to lie between the capture's
        // stack pointer (the same now) and the stack's top when recorded.
        if unsafe { (a as *const usize).read() } != v {
            return Err(None);
        }
    }
    // (a mismatch leaves `out` partly written: the walk that follows
    // writes it again)
    // One index for both arrays (a zip of the two cost the replayed pair 25
    // instructions more once the loop also gave the index that changed).
    let out = &mut out[..outputs.len()];
    for i in 0..outputs.len() {
        let (a, v) = outputs[i];
        // SAFETY: as above.
        if unsafe { (a as *const usize).read() } != v {
            return Err(Some(i));
        }
        out[i].write(v as u64);
    }
    Ok(outputs.len())
}

/// Whether every logged read in `reads` still holds; when `checked`,
/// each address is checked against `bounds` (the capture's stack pointer
/// and the stack's top) first: a splice may read a log made from a lower
/// stack pointer.
#[inline(always)]
fn still_holds(reads: &[(usize, usize)], checked: bool, bounds: (usize, usize)) -> bool {
    if checked {
        return reads.iter().all(|&(a, v)| read_stack(a, bounds) == Some(v));
    }
    // SAFETY: not `checked`: logged by a walk that started at this
    // capture's stack pointer or above it (the caller compared them), so
    // between this stack pointer and the stack's top, on this thread's
    // mapped stack.
    reads
        .iter()
        .all(|&(a, v)| unsafe { (a as *const usize).read() } == v)
}

/// Called by a walk where each frame's unwinding starts: true stops the
/// walk there, to take the rest from the last walk (a splice).
trait Meet {
    fn meet(&mut self, at: &At, n: usize, room: usize) -> bool;
}

/// A plain walk meets nothing.
struct Alone;

impl Meet for Alone {
    #[inline(always)]
    fn meet(&mut self, _: &At, _: usize, _: usize) -> bool {
        false
    }
}

/// How many times a splice checks the rest of the last walk at a meeting
/// point and finds it changed before it walks on alone: each check reads
/// up to the whole rest.
const MEETING_TRIES: u32 = 3;

/// Looks for the place where this walk meets the last one: the same stack
/// pointer and rule, rbp the same wherever the rest of the last walk uses
/// it, and every word the last walk read from there on unchanged. From
/// such a place this walk would read the same words and give the same
/// frames as the last one did.
struct Rejoin<'a> {
    last: &'a Walked,
    /// the last walk's first step not yet passed; where the walks met,
    /// once `met`
    j: usize,
    met: bool,
    /// whether the rest uses the rbp it has at `j`
    needs_fp: bool,
    /// where this walk stood when it met the last one
    at: At,
    tries: u32,
    bounds: (usize, usize),
}

impl Meet for Rejoin<'_> {
    #[inline(always)]
    fn meet(&mut self, at: &At, n: usize, room: usize) -> bool {
        if self.tries == 0 {
            return false;
        }
        let last = self.last;
        // The last walk's steps stand at rising stack pointers.
        while self.j < last.steps && last.step[self.j].sp < at.sp {
            self.j += 1;
        }
        match last.step.get(self.j) {
            Some(s)
                if self.j < last.steps
                    && s.sp == at.sp
                    && s.lookup == at.lookup
                    && s.evals as u32 == at.evals =>
            {
                self.check_rest(at, n, room)
            }
            _ => false,
        }
    }
}

impl Rejoin<'_> {
    #[inline(never)]
    fn check_rest(&mut self, at: &At, n: usize, room: usize) -> bool {
        let last = self.last;
        let s = &last.step[self.j];
        let needs_fp = last.needs_fp_at(self.j);
        if needs_fp && at.fp != s.fp {
            return false;
        }
        let rest = last.outputs - s.outputs as usize;
        // The rest must fit, and a rest cut by a full output must fill it.
        if n + rest > room || (last.capped && n + rest < room) {
            self.tries = 0;
            return false;
        }
        // A log made from this stack pointer or a higher one read only
        // words between this capture's stack pointer and the top; one made
        // from lower down may have read below it: each address is checked.
        let checked = self.bounds.0 > last.start[1];
        let others = REPLAY_READS - (last.len - last.outputs)..REPLAY_READS - s.others as usize;
        if !still_holds(
            &last.reads[s.outputs as usize..last.outputs],
            checked,
            self.bounds,
        ) || !still_holds(&last.reads[others], checked, self.bounds)
        {
            self.tries -= 1;
            return false;
        }
        self.needs_fp = needs_fp;
        self.at = *at;
        self.met = true;
        true
    }
}

/// A walk that starts from the last walk's log, in place: the frames
/// before the first step whose words changed are kept, the walk goes on
/// from there (logged into `scratch`), and where it meets the last walk
/// again ([`Rejoin`]) the rest is taken. Only the part that changed is
/// written into `last` (the rest moves when the two parts differ in
/// size). Returns the frames.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn splice(
    last: &mut Walked,
    scratch: &mut Walked,
    start: [usize; 3],
    bounds: (usize, usize),
    own: (usize, usize),
    stop: EvalStop,
    changed: Changed,
    out: &mut [MaybeUninit<u64>],
) -> usize {
    let mut at = At {
        lookup: start[0],
        sp: start[1],
        fp: start[2],
        fp_at: 0,
        pending: false,
        evals: 0,
    };
    // A walk that stops after another eval-loop frame is no guide.
    if last.stop_after != stop.after {
        last.len = 0;
    }
    let mut k = 0;
    if last.len != 0 && last.start[..2] == start[..2] {
        k = valid_steps(last, start, out.len(), changed);
        if k > 0 {
            let s = last.step[k];
            let fp = if s.fp_at == 0 {
                Some(start[2])
            } else {
                read_stack(s.fp_at, bounds)
            };
            match fp {
                Some(fp) => {
                    at = At {
                        lookup: s.lookup,
                        sp: s.sp,
                        fp,
                        fp_at: s.fp_at,
                        pending: s.flags & STEP_PENDING != 0,
                        evals: s.evals as u32,
                    }
                }
                None => k = 0,
            }
        }
    }
    // The kept frames.
    let (outputs, others) = if k > 0 {
        (last.step[k].outputs as usize, last.step[k].others as usize)
    } else {
        (0, 0)
    };
    for (slot, &(_, v)) in out.iter_mut().zip(&last.reads[..outputs]) {
        slot.write(v as u64);
    }
    let mut rec = Recorder::new(scratch);
    (rec.outputs, rec.others, rec.steps) = (outputs, others, k);
    rec.fp_used = k > 0 && last.fp_used_before(k);
    let (n, rejoin) = if last.len == 0 {
        // (a log that overflowed, or none yet: nothing to meet)
        let n = if stop.after == 0 {
            walk::<_, false>(at, bounds, own, stop, out, outputs, &mut rec, &mut Alone)
        } else {
            walk::<_, true>(at, bounds, own, stop, out, outputs, &mut rec, &mut Alone)
        };
        (n, None)
    } else {
        let mut rejoin = Rejoin {
            last,
            j: k + 1,
            met: false,
            needs_fp: false,
            at,
            tries: MEETING_TRIES,
            bounds,
        };
        let n = if stop.after == 0 {
            walk::<_, false>(at, bounds, own, stop, out, outputs, &mut rec, &mut rejoin)
        } else {
            walk::<_, true>(at, bounds, own, stop, out, outputs, &mut rec, &mut rejoin)
        };
        (n, rejoin.met.then_some((rejoin.j, rejoin.needs_fp, rejoin.at)))
    };
    const R: usize = REPLAY_READS;
    #[cfg(test)]
    tests::count_splice(k > 0, rejoin.is_some());
    // Where the kept part ends, and where the walked part (in `scratch`)
    // ends: it takes the place of what changed in `last`.
    let kept = Counts {
        steps: k,
        outputs,
        others,
    };
    let Some((j, needs_fp, at)) = rejoin else {
        // Walked to the end: the kept part and the walked one.
        let new = rec.counts();
        new.take_walked(kept, rec.log, last);
        last.len = if rec.overflow { 0 } else { new.outputs + new.others };
        (last.outputs, last.steps, last.start, last.fp_used) = (new.outputs, new.steps, start, rec.fp_used);
        last.capped = n == out.len();
        (last.room, last.stop_after) = (out.len(), stop.after);
        return n;
    };
    // This walk's rbp at `j`, if restored here and not logged yet, is what
    // the rest uses: log it, so that a replay checks it (with the walked
    // part: a read counted early only makes a later splice resume
    // earlier).
    if needs_fp && at.pending {
        rec.note(at.fp_at, at.fp, false);
    }
    let new = rec.counts();
    let sj = last.step[j];
    let (rest_outputs, rest_others) = (
        sj.outputs as usize..last.outputs,
        sj.others as usize..last.len - last.outputs,
    );
    let rest_steps = last.steps - j;
    for (slot, &(_, v)) in out[n..].iter_mut().zip(&last.reads[rest_outputs.clone()]) {
        slot.write(v as u64);
    }
    let n = n + rest_outputs.len();
    let total = Counts {
        steps: new.steps + rest_steps,
        outputs: new.outputs + rest_outputs.len(),
        others: new.others + rest_others.len(),
    };
    if rec.overflow || total.steps > REPLAY_STEPS || total.outputs + total.others > REPLAY_READS {
        // The frames stand; the log has no room for them.
        last.len = 0;
        return n;
    }
    // The rest moves to follow the walked part, which takes the place of
    // the part that changed.
    #[cfg(test)]
    tests::count_move(new.steps != j);
    last.step.copy_within(j..last.steps, new.steps);
    // The outputs grow up from the front and the others down from the
    // back: when the outputs move up, the others move first, or the
    // outputs' new place can cover the lowest of them in a nearly full log
    // (a review found it: the lost read was the outermost return address,
    // and a later replay gave a stale stack).
    let outputs_move = |reads: &mut [(usize, usize); R]| reads.copy_within(rest_outputs.clone(), new.outputs);
    let others_move = |reads: &mut [(usize, usize); R]| {
        reads.copy_within(R - rest_others.end..R - rest_others.start, R - total.others)
    };
    if new.outputs > sj.outputs as usize {
        others_move(&mut last.reads);
        outputs_move(&mut last.reads);
    } else {
        outputs_move(&mut last.reads);
        others_move(&mut last.reads);
    }
    new.take_walked(kept, rec.log, last);
    // The rest's counts, where they now stand. The start's rbp is used by
    // the rest exactly when it is what this walk has at `j` and the rest
    // uses it.
    let used = rec.fp_used || (needs_fp && at.fp_at == 0);
    let (dout, dx) = (
        (new.outputs as u16).wrapping_sub(sj.outputs),
        (new.others as u16).wrapping_sub(sj.others),
    );
    let rest = &mut last.step[new.steps..total.steps];
    if dout != 0 || dx != 0 || used || last.fp_used {
        let used_flag = if used { STEP_FP_USED } else { 0 };
        for step in &mut rest[1..] {
            step.outputs = step.outputs.wrapping_add(dout);
            step.others = step.others.wrapping_add(dx);
            step.flags = (step.flags & STEP_PENDING) | used_flag;
        }
    }
    (rest[0].outputs, rest[0].others) = (new.outputs as u16, new.others as u16);
    rest[0].flags = if rec.fp_used { STEP_FP_USED } else { 0 } | (rest[0].flags & STEP_PENDING);
    // From `j` until a rule restores a saved rbp, the rest runs on this
    // walk's rbp (equal where used): its steps say where this walk got it.
    let pending = if at.pending && !needs_fp { STEP_PENDING } else { 0 };
    for step in rest.iter_mut() {
        (step.fp, step.fp_at) = (at.fp, at.fp_at);
        step.flags = (step.flags & !STEP_PENDING) | pending;
        if step.kind & RBP_SAVED != 0 {
            break;
        }
    }
    last.len = total.outputs + total.others;
    (last.outputs, last.steps, last.start, last.fp_used) = (total.outputs, total.steps, start, used);
    last.room = out.len();
    n
}

/// The steps of `last` (from the same start as now) that still hold: those
/// before the first one whose reads changed, or that used the start's rbp
/// when it differs. 0 when there is nothing to resume from.
fn valid_steps(last: &Walked, start: [usize; 3], room: usize, known: Changed) -> usize {
    // The first read that changed, among the outputs and the others
    // (known when the replay found it, all others holding).
    // SAFETY: logged from the same stack pointer as now, so between it
    // and the stack's top (as for `replay`).
    let changed = |&(a, v): &(usize, usize)| unsafe { (a as *const usize).read() } != v;
    let others = last.len - last.outputs;
    let (bad_output, bad_other) = match known {
        Some(i) => (i, usize::MAX),
        None => (
            last.reads[..last.outputs]
                .iter()
                .position(changed)
                .unwrap_or(usize::MAX),
            last.reads[REPLAY_READS - others..]
                .iter()
                .rposition(changed)
                .map_or(usize::MAX, |i| others - 1 - i),
        ),
    };
    // The step that noted a read: the last one that began with fewer
    // reads before it (steps are in order, their counts rise; a binary
    // search: a stack of 50 frames cost 400 instructions stepped through).
    let steps = &last.step[..last.steps];
    let noted = |before: &dyn Fn(&Step) -> bool| steps.partition_point(before).saturating_sub(1);
    let mut k = last.steps;
    if bad_output != usize::MAX {
        k = k.min(noted(&|s| s.outputs as usize <= bad_output));
    }
    if bad_other != usize::MAX {
        k = k.min(noted(&|s| s.others as usize <= bad_other));
    }
    if last.start[2] != start[2] && last.fp_used {
        // The first step that used the start's rbp.
        k = k.min(noted(&|s| s.flags & STEP_FP_USED == 0));
    }
    // (all of them: the output is smaller than the last walk's; walk)
    if k == last.steps || last.step[k].outputs as usize > room {
        return 0;
    }
    k
}

#[inline]
fn is_own(ip: usize, range: (usize, usize)) -> bool {
    range.0 <= ip && ip < range.1
}

/// The reference unwinder: libgcc's, through the backtrace crate.
pub fn capture_dwarf(out: &mut [MaybeUninit<u64>], stop: EvalStop) -> usize {
    dwarf_skipping(out, own_range(), stop)
}

#[inline(never)]
fn dwarf_skipping(out: &mut [MaybeUninit<u64>], range: (usize, usize), stop: EvalStop) -> usize {
    let mut n = 0;
    let mut evals = 0;
    // SAFETY: unsynchronized tracing is fine: we hold no lock the unwinder
    // could need, and a hook never runs inside the unwinder.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as usize;
            if ip == 0 {
                return false;
            }
            if !is_own(ip, range) {
                out[n].write(ip as u64);
                n += 1;
                if stop.after != 0 && stop.is_eval(ip) {
                    evals += 1;
                    if evals == stop.after {
                        return false;
                    }
                }
            }
            n < out.len()
        });
    }
    n
}

// ---- the fast unwinder ----

/// How to get from one frame to its caller, in 8 bytes so that the cache
/// holds it in one atomic word and reading it costs no decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(8))]
struct Rule {
    cfa_offset: i32,
    /// where the caller's rbp is saved, relative to the CFA (if `RBP_SAVED`)
    rbp_offset: i16,
    /// a `KIND_*` value, with `RBP_SAVED`
    kind: u8,
    /// where the return address is, relative to the CFA (-8 on x86-64)
    ra_offset: i8,
}

/// CFA = rsp + offset
const KIND_RSP: u8 = 1;
/// CFA = rbp + offset
const KIND_RBP: u8 = 2;
/// CFA = *(rbp + offset): functions that realign the stack (DRAP)
const KIND_RBP_DEREF: u8 = 3;
/// the outermost frame, or a frame we cannot unwind
const KIND_STOP: u8 = 4;
const KIND_MASK: u8 = 0x7f;
const RBP_SAVED: u8 = 0x80;

impl Rule {
    const STOP: Rule = Rule {
        cfa_offset: 0,
        rbp_offset: 0,
        kind: KIND_STOP,
        ra_offset: -8,
    };
    /// No unwind info: assume the classic frame-pointer prologue.
    const FRAME_POINTER: Rule = Rule {
        cfa_offset: 16,
        rbp_offset: -16,
        kind: KIND_RBP | RBP_SAVED,
        ra_offset: -8,
    };

    #[inline(always)]
    fn pack(self) -> u64 {
        // SAFETY: 8 bytes of plain integers.
        unsafe { std::mem::transmute::<Rule, u64>(self) }
    }

    #[inline(always)]
    fn unpack(v: u64) -> Rule {
        // SAFETY: every bit pattern is a valid Rule.
        unsafe { std::mem::transmute::<u64, Rule>(v) }
    }
}

/// Lock-free cache: return address → packed rule. Slots are claimed by a
/// CAS on the value, then published by a release store of the key, and
/// never change afterwards; a reader that sees the key sees the value.
/// (A packed rule is never 0: its kind is at least 1.)
const CACHE_SLOTS: usize = 1 << 16;
const CACHE_PROBES: usize = 16;
static CACHE_KEYS: [AtomicU64; CACHE_SLOTS] = [const { AtomicU64::new(0) }; CACHE_SLOTS];
static CACHE_RULES: [AtomicU64; CACHE_SLOTS] = [const { AtomicU64::new(0) }; CACHE_SLOTS];

/// Fibonacci hashing: one multiply, the top 16 bits.
#[inline(always)]
fn slot_of(pc: u64) -> usize {
    (pc.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - 16)) as usize
}

#[inline(always)]
fn cached_rule(pc: u64) -> Option<Rule> {
    let s = slot_of(pc);
    if CACHE_KEYS[s].load(Ordering::Acquire) == pc {
        return Some(Rule::unpack(CACHE_RULES[s].load(Ordering::Relaxed)));
    }
    cached_rule_probing(pc, s)
}

#[cold]
fn cached_rule_probing(pc: u64, start: usize) -> Option<Rule> {
    for i in 0..CACHE_PROBES {
        let s = (start + i) & (CACHE_SLOTS - 1);
        let k = CACHE_KEYS[s].load(Ordering::Acquire);
        if k == pc {
            return Some(Rule::unpack(CACHE_RULES[s].load(Ordering::Relaxed)));
        }
        if k == 0 {
            return None;
        }
    }
    None
}

fn remember_rule(pc: u64, rule: Rule) {
    let start = slot_of(pc);
    let packed = rule.pack();
    for i in 0..CACHE_PROBES {
        let s = (start + i) & (CACHE_SLOTS - 1);
        if CACHE_RULES[s]
            .compare_exchange(0, packed, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            CACHE_KEYS[s].store(pc, Ordering::Release);
            return;
        }
        if CACHE_KEYS[s].load(Ordering::Acquire) == pc {
            return;
        }
    }
}

#[inline]
pub(crate) fn stack_bounds(sp: usize, thread: &ThreadState) -> Option<(usize, usize)> {
    let (lo, hi) = thread.stack_bounds.get();
    if lo <= sp && sp < hi {
        return Some((lo, hi));
    }
    new_stack_bounds(sp, thread)
}

#[cold]
fn new_stack_bounds(sp: usize, thread: &ThreadState) -> Option<(usize, usize)> {
    // SAFETY: querying this thread's attributes.
    let bounds = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if ok != 0 {
            return None;
        }
        (addr as usize, addr as usize + size)
    };
    // A stack the thread switched to (coroutines, sigaltstack) is not
    // ours to walk with these bounds.
    if !(bounds.0 <= sp && sp < bounds.1) {
        return None;
    }
    thread.stack_bounds.set(bounds);
    Some(bounds)
}

/// Reads a word of the stack between the capture's own stack pointer
/// (everything above it is mapped and in use) and the stack's top.
#[inline(always)]
fn read_stack(addr: usize, bounds: (usize, usize)) -> Option<usize> {
    if addr < bounds.0 || addr >= bounds.1 || addr & 7 != 0 {
        return None;
    }
    // SAFETY: inside this thread's live stack, aligned.
    Some(unsafe { (addr as *const usize).read() })
}

type Reader = gimli::EndianSlice<'static, gimli::LittleEndian>;

/// Reads the unwind rule for `pc` from its module's .eh_frame.
#[cold]
fn rule_from_eh_frame(pc: u64) -> Rule {
    use gimli::{
        BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindSection, X86_64,
    };
    let Some(m) = find_module(pc as usize) else {
        return Rule::STOP;
    };
    let Some((hdr_addr, hdr_len)) = m.eh_frame_hdr else {
        return Rule::FRAME_POINTER;
    };
    // SAFETY: PT_GNU_EH_FRAME is mapped read-only for the module's life.
    let hdr_bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(hdr_addr as *const u8, hdr_len) };
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_addr as u64);
    let Ok(parsed) = EhFrameHdr::new(hdr_bytes, LittleEndian).parse(&bases, 8) else {
        return Rule::FRAME_POINTER;
    };
    let eh_frame_addr = match parsed.eh_frame_ptr() {
        gimli::Pointer::Direct(a) => a as usize,
        gimli::Pointer::Indirect(_) => return Rule::FRAME_POINTER,
    };
    if eh_frame_addr >= m.eh_segment_end {
        return Rule::FRAME_POINTER;
    }
    // SAFETY: .eh_frame lies in the same mapped segment, up to its end.
    let eh_bytes: &'static [u8] =
        unsafe { std::slice::from_raw_parts(eh_frame_addr as *const u8, m.eh_segment_end - eh_frame_addr) };
    let eh_frame: EhFrame<Reader> = EhFrame::new(eh_bytes, LittleEndian);
    let bases = bases.set_eh_frame(eh_frame_addr as u64).set_text(m.start as u64);
    let Some(table) = parsed.table() else {
        return Rule::FRAME_POINTER;
    };
    let Ok(fde) = table.fde_for_address(&eh_frame, &bases, pc, EhFrame::cie_from_offset) else {
        return Rule::FRAME_POINTER;
    };
    let mut ctx = Box::new(gimli::UnwindContext::new());
    let Ok(row) = fde.unwind_info_for_address(&eh_frame, &bases, &mut ctx, pc) else {
        return Rule::FRAME_POINTER;
    };
    // No rule for a register reads as Undefined, as gimli 0.31's lookup
    // answered before it returned an Option (one gimli with backtrace's).
    let rule = |r| row.register(r).unwrap_or(RegisterRule::Undefined);
    let ra_offset = match rule(X86_64::RA) {
        RegisterRule::Offset(o) if (-128..0).contains(&o) => o as i8,
        _ => return Rule::STOP, // Undefined: the outermost frame
    };
    let rbp_offset = match rule(X86_64::RBP) {
        RegisterRule::Offset(o) if (i16::MIN as i64..0).contains(&o) => Some(o as i16),
        RegisterRule::Undefined | RegisterRule::SameValue => None,
        _ => return Rule::STOP,
    };
    let (kind, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset }
            if (i32::MIN as i64..=i32::MAX as i64).contains(offset) =>
        {
            match *register {
                X86_64::RSP => (KIND_RSP, *offset as i32),
                X86_64::RBP => (KIND_RBP, *offset as i32),
                _ => return Rule::FRAME_POINTER,
            }
        }
        CfaRule::Expression(e) => {
            // The DRAP form GCC emits for stack-realigning functions:
            // DW_OP_breg6 (rbp) <sleb offset>; DW_OP_deref.
            let Ok(expr) = e.get(&eh_frame) else {
                return Rule::FRAME_POINTER;
            };
            match drap_offset(expr.0.slice()) {
                Some(off) => (KIND_RBP_DEREF, off),
                None => return Rule::FRAME_POINTER,
            }
        }
        _ => return Rule::FRAME_POINTER,
    };
    Rule {
        cfa_offset,
        rbp_offset: rbp_offset.unwrap_or(0),
        kind: kind | if rbp_offset.is_some() { RBP_SAVED } else { 0 },
        ra_offset,
    }
}

/// `DW_OP_breg6 <sleb128>; DW_OP_deref` → the offset.
fn drap_offset(bytes: &[u8]) -> Option<i32> {
    let (&op, rest) = bytes.split_first()?;
    if op != 0x76 {
        return None;
    }
    let mut value: i64 = 0;
    let mut shift = 0;
    let mut i = 0;
    loop {
        let b = *rest.get(i)?;
        value |= ((b & 0x7f) as i64) << shift;
        shift += 7;
        i += 1;
        if b & 0x80 == 0 {
            if shift < 64 && b & 0x40 != 0 {
                value |= -1i64 << shift;
            }
            break;
        }
        if shift > 28 {
            return None;
        }
    }
    (rest.get(i..)? == [0x06]).then_some(value as i32)
}

#[inline(always)]
fn rule_for(pc: u64) -> Rule {
    match cached_rule(pc) {
        Some(r) => r,
        None => {
            let r = rule_from_eh_frame(pc);
            remember_rule(pc, r);
            r
        }
    }
}

/// The fast unwinder (x86-64; other architectures use the reference one),
/// leaving out return addresses inside `skip`. A
/// capture that did not replay made a new generation of the log (see
/// [`capture`]).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn fast_skipping(
    out: &mut [MaybeUninit<u64>],
    skip: (usize, usize),
    thread: &ThreadState,
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
    let Some((_, top)) = stack_bounds(sp, thread) else {
        // Frames the log does not hold: a generation of their own, and
        // no replay of the log's frames under it.
        log.last.len = 0;
        log.generation += 1;
        return dwarf_skipping(out, skip, stop);
    };
    from_log(log, [pc, sp, fp], (sp, top), skip, stop, out)
}

/// A capture from `start` through the thread's log: a replay, or a splice
/// (which walks all of a stack the log knows nothing of).
#[inline(always)]
fn from_log(
    log: &mut ReplayLog,
    start: [usize; 3],
    bounds: (usize, usize),
    skip: (usize, usize),
    stop: EvalStop,
    out: &mut [MaybeUninit<u64>],
) -> usize {
    let changed = match replay(&log.last, start, stop, out) {
        Ok(n) => return n,
        Err(changed) => changed,
    };
    log.generation += 1;
    splice(
        &mut log.last,
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
    _thread: &ThreadState,
    log: &mut ReplayLog,
    stop: EvalStop,
) -> usize {
    log.generation += 1;
    dwarf_skipping(out, skip, stop)
}

/// Walks on from `at` (first: the frame executing the start's pc, exactly,
/// not a return address), with `n` frames in `out` already. `bounds` is
/// (the capture's stack pointer, the stack's top). At each frame, `meet`
/// may stop the walk, to take the rest from the last one (a splice); with
/// `EVAL_STOP`, `stop` ends it too.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn walk<M: Meet, const EVAL_STOP: bool>(
    mut at: At,
    bounds: (usize, usize),
    own: (usize, usize),
    stop: EvalStop,
    out: &mut [MaybeUninit<u64>],
    mut n: usize,
    rec: &mut Recorder,
    meet: &mut M,
) -> usize {
    while n < out.len() {
        if meet.meet(&at, n, out.len()) {
            break;
        }
        let rule = rule_for(at.lookup as u64);
        rec.step(&at, rule.kind);
        let kind = rule.kind & KIND_MASK;
        if kind == KIND_RBP || kind == KIND_RBP_DEREF {
            // rbp is the start's until a rule restores a saved one; a
            // restored rbp's stack word matters (is logged for replay)
            // only once a rule uses rbp.
            rec.fp_used |= at.fp_at == 0;
            if at.pending {
                rec.note(at.fp_at, at.fp, false);
                at.pending = false;
            }
        }
        let cfa = match kind {
            KIND_RSP => at.sp.wrapping_add_signed(rule.cfa_offset as isize),
            KIND_RBP => at.fp.wrapping_add_signed(rule.cfa_offset as isize),
            KIND_RBP_DEREF => {
                let addr = at.fp.wrapping_add_signed(rule.cfa_offset as isize);
                match read_stack(addr, bounds) {
                    Some(c) => {
                        rec.note(addr, c, false);
                        c
                    }
                    None => break,
                }
            }
            _ => break,
        };
        if cfa <= at.sp || cfa > bounds.1 {
            break;
        }
        let ra_at = cfa.wrapping_add_signed(rule.ra_offset as isize);
        let Some(ra) = read_stack(ra_at, bounds) else {
            break;
        };
        if rule.kind & RBP_SAVED != 0 {
            let addr = cfa.wrapping_add_signed(rule.rbp_offset as isize);
            match read_stack(addr, bounds) {
                Some(v) => {
                    at.fp = v;
                    at.fp_at = addr;
                    at.pending = true;
                }
                None => break,
            }
        }
        let output = ra != 0 && !is_own(ra, own);
        rec.note(ra_at, ra, output);
        if ra == 0 {
            break;
        }
        if output {
            out[n].write(ra as u64);
            n += 1;
            // (compiled in only for captures that stop: a C stack's walk
            // pays nothing for it)
            if EVAL_STOP && stop.is_eval(ra) {
                at.evals += 1;
                if at.evals == stop.after {
                    break;
                }
            }
        }
        at.sp = cfa;
        // The call instruction is just before the return address; its rule
        // is the caller's state (and a call that never returns can be the
        // last instruction of a function).
        at.lookup = ra - 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_pack_and_unpack() {
        for r in [
            Rule::STOP,
            Rule::FRAME_POINTER,
            Rule {
                cfa_offset: 1 << 20,
                rbp_offset: -24,
                kind: KIND_RSP | RBP_SAVED,
                ra_offset: -8,
            },
            Rule {
                cfa_offset: -8,
                rbp_offset: 0,
                kind: KIND_RBP_DEREF,
                ra_offset: -8,
            },
        ] {
            assert_eq!(Rule::unpack(r.pack()), r);
            assert_ne!(r.pack(), 0);
        }
        assert_eq!(std::mem::size_of::<Rule>(), 8);
    }

    #[test]
    fn drap_expression_is_recognized() {
        // DW_OP_breg6 -8; DW_OP_deref
        assert_eq!(drap_offset(&[0x76, 0x78, 0x06]), Some(-8));
        assert_eq!(drap_offset(&[0x77, 0x78, 0x06]), None);
        assert_eq!(drap_offset(&[0x76, 0x78]), None);
    }

    #[inline(never)]
    fn path_a(f: &mut dyn FnMut()) {
        f();
        std::hint::black_box(1);
    }

    #[inline(never)]
    fn path_b(f: &mut dyn FnMut()) {
        f();
        std::hint::black_box(2);
    }

    /// Replay returns what a walk would, and only when nothing changed:
    /// captures alternate between two call paths that put the capture at
    /// the same stack pointer but with other return addresses.
    #[test]
    #[cfg(target_arch = "x86_64")] // elsewhere the reference unwinder runs, without replay
    fn replay_only_when_the_stack_is_unchanged() {
        let thread = crate::base::thread::current();
        let mut log = Box::new(ReplayLog::EMPTY);
        let mut results = Vec::new();
        for i in 0..6 {
            let mut fast = [MaybeUninit::uninit(); 64];
            let mut reference = [MaybeUninit::uninit(); 64];
            let (mut nf, mut replayed, mut nr) = (0, false, 0);
            let mut f = || {
                let generation = log.generation;
                nf = fast_skipping(&mut fast, (0, 0), thread, &mut log, EvalStop::default());
                replayed = log.generation == generation;
                nr = dwarf_skipping(&mut reference, (0, 0), EvalStop::default());
            };
            // a a b b a a: the second of each pair replays
            if (i / 2) % 2 == 0 {
                with_rbp_zero(&mut || recurse(10, &mut || path_a(&mut f)));
            } else {
                with_rbp_zero(&mut || recurse(10, &mut || path_b(&mut f)));
            }
            // SAFETY: each capture wrote the first `nf`/`nr` entries it
            // returned.
            let f: Vec<u64> = fast[..nf].iter().map(|v| unsafe { v.assume_init() }).collect();
            let r: Vec<u64> = reference[..nr]
                .iter()
                // SAFETY: as above.
                .map(|v| unsafe { v.assume_init() })
                .collect();
            let start = f.iter().position(|a| r.contains(a)).unwrap();
            let rs = r.iter().position(|a| *a == f[start]).unwrap();
            assert_eq!(&f[start..], &r[rs..rs + (nf - start)], "capture {i}");
            results.push((replayed, log.generation, f));
        }
        assert_eq!(
            results.iter().map(|r| r.0).collect::<Vec<_>>(),
            [false, true, false, true, false, true]
        );
        // Each walk makes a new generation; a replay keeps the walk's.
        let generations: Vec<u64> = results.iter().map(|r| r.1).collect();
        let g = generations[0];
        assert_eq!(generations, [g, g, g + 1, g + 1, g + 2, g + 2]);
        assert_eq!(results[0].2, results[1].2);
        assert_ne!(results[1].2, results[2].2);
        assert_eq!(results[0].2, results[4].2);
    }

    /// Calls `f` with rbp cleared. Without frame pointers rbp is a general
    /// register, and it is part of a capture's start: whatever the test
    /// function keeps there (its loop counter, in some builds) would make
    /// replay depend on codegen. rsp is left alone, so unwinding through
    /// this frame stays exact.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn with_rbp_zero(f: &mut dyn FnMut()) {
        extern "C" fn trampoline(f: *mut &mut dyn FnMut()) {
            // SAFETY: the pointer to `f` below, live for the call.
            unsafe { (*f)() }
        }
        let mut f = f;
        // SAFETY: rbp is saved in r12 (callee-saved, declared clobbered)
        // and restored before the block ends; the stack pointer is
        // untouched and aligned for a call (no `nostack`).
        unsafe {
            std::arch::asm!(
                "mov r12, rbp",
                "xor ebp, ebp",
                "call {t}",
                "mov rbp, r12",
                t = sym trampoline,
                in("rdi") &mut f as *mut &mut dyn FnMut(),
                out("r12") _,
                clobber_abi("C"),
            );
        }
    }

    std::thread_local! {
        /// Splices on this thread: (kept a part of the last walk, met it
        /// again, moved its rest).
        static SPLICES: std::cell::Cell<(u32, u32, u32)> = const { std::cell::Cell::new((0, 0, 0)) };
    }

    pub(super) fn count_splice(kept: bool, met: bool) {
        SPLICES.with(|c| {
            let (k, m, v) = c.get();
            c.set((k + kept as u32, m + met as u32, v));
        });
    }

    pub(super) fn count_move(moved: bool) {
        SPLICES.with(|c| {
            let (k, m, v) = c.get();
            c.set((k, m, v + moved as u32));
        });
    }

    /// One of 2^5 call paths to `f`: levels 0 (outermost) to 3 through
    /// `route_a` or `route_b` by one bit each, and bit 4 adds a frame at
    /// level 2 (paths of two depths: captures from two stack pointers).
    #[inline(never)]
    fn route(bits: u32, level: u32, f: &mut dyn FnMut()) {
        if level == 4 {
            f();
        } else if level == 2 && bits & 16 != 0 {
            route_deeper(bits, level, f);
        } else if bits >> level & 1 != 0 {
            route_a(bits, level, f);
        } else {
            route_b(bits, level, f);
        }
        std::hint::black_box(level);
    }

    #[inline(never)]
    fn route_a(bits: u32, level: u32, f: &mut dyn FnMut()) {
        route(bits, level + 1, f);
        std::hint::black_box(1);
    }

    #[inline(never)]
    fn route_b(bits: u32, level: u32, f: &mut dyn FnMut()) {
        route(bits, level + 1, f);
        std::hint::black_box(2);
    }

    #[inline(never)]
    fn route_deeper(bits: u32, level: u32, f: &mut dyn FnMut()) {
        let mut pad = [0u8; 96];
        std::hint::black_box(&mut pad);
        route_b(bits, level, f);
        std::hint::black_box(&pad);
    }

    /// A splice gives exactly the frames a full walk gives from the same
    /// place: captures go from path to path in an order that changes the
    /// innermost level, the outermost, both (with the middle alike, where
    /// the walks meet and the rest still differs), the depth, and nothing;
    /// each is compared with a full walk (an empty log) made by the same
    /// line, and the splices must have kept frames, met the last walk, and
    /// moved its rest.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_splice_gives_what_a_full_walk_gives() {
        let thread = crate::base::thread::current();
        let mut shared = Box::new(ReplayLog::EMPTY);
        let mut fresh = Box::new(ReplayLog::EMPTY);
        let mut order: Vec<u32> = vec![
            0,
            1,
            8,
            9,
            0b1001,
            0b0110,
            0b0110,
            16,
            17,
            0,
            16 | 8,
            8,
            15,
            31,
            0,
        ];
        let mut x = 12345u32;
        for _ in 0..200 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            order.push(x >> 16 & 31);
        }
        // Skip (as the library skips its own frames) the return address
        // that recurs most in path 0 (into `route`, from a level's call):
        // logged as "other" reads, which a splice moves too.
        let mut first = Vec::new();
        with_rbp_zero(&mut || {
            route(0, 0, &mut || {
                let mut buf = [MaybeUninit::uninit(); 64];
                let n = fast_skipping(&mut buf, (0, 0), thread, &mut fresh, EvalStop::default());
                // SAFETY: the capture wrote the first `n` entries.
                first = buf[..n].iter().map(|v| unsafe { v.assume_init() }).collect();
            })
        });
        let recurring = *first
            .iter()
            .max_by_key(|a| first.iter().filter(|b| b == a).count())
            .unwrap() as usize;
        let skip = (recurring, recurring + 1);
        SPLICES.with(|c| c.set((0, 0, 0)));
        for (i, &bits) in order.iter().enumerate() {
            let mut got: Vec<Vec<u64>> = Vec::new();
            // Nothing to replay or splice for `fresh`: a full walk.
            fresh.last.len = 0;
            let logs: [*mut ReplayLog; 2] = [&mut *shared, &mut *fresh];
            let mut f = || {
                // One call site for both captures (a branch to choose the
                // log would let the compiler make two).
                for which in 0..std::hint::black_box(2) {
                    // SAFETY: the two boxes above, alive and not otherwise
                    // borrowed while the closure runs.
                    let log = unsafe { &mut *logs[std::hint::black_box(which)] };
                    let mut buf = [MaybeUninit::uninit(); 64];
                    let n = fast_skipping(&mut buf, skip, thread, log, EvalStop::default());
                    // SAFETY: the capture wrote the first `n` entries.
                    got.push(buf[..n].iter().map(|v| unsafe { v.assume_init() }).collect());
                }
            };
            with_rbp_zero(&mut || route(bits, 0, &mut f));
            assert!(
                got[1].len() > 8,
                "capture {i}: a short walk ({} frames)",
                got[1].len()
            );
            assert!(
                !got[1].contains(&(recurring as u64)),
                "capture {i}: a skipped frame"
            );
            assert_eq!(
                got[0], got[1],
                "capture {i} (path {bits:#b}): the splice differs from a full walk"
            );
            // The log a splice leaves is the one a full walk leaves: each
            // step where it was, with the reads it noted.
            let (a, b) = (&shared.last, &fresh.last);
            let steps = |w: &Walked| -> Vec<_> {
                w.step[..w.steps]
                    .iter()
                    // (rbp where no rule used it may differ: a pending
                    // one, or the start's in a walk that never used it)
                    .map(|s| {
                        let used = s.flags & STEP_PENDING == 0 && (s.fp_at != 0 || w.fp_used);
                        (
                            s.lookup,
                            s.sp,
                            used.then_some(s.fp),
                            s.fp_at,
                            s.outputs,
                            s.others,
                            s.kind,
                            s.flags,
                        )
                    })
                    .collect()
            };
            let reads = |w: &Walked| {
                (
                    w.reads[..w.outputs].to_vec(),
                    w.reads[REPLAY_READS - (w.len - w.outputs)..].to_vec(),
                )
            };
            assert!(a.len > 0 && b.len > 0, "capture {i}: a log left unusable");
            assert_eq!(
                steps(a),
                steps(b),
                "capture {i} (path {bits:#b}): the spliced log's steps"
            );
            assert_eq!(
                reads(a),
                reads(b),
                "capture {i} (path {bits:#b}): the spliced log's reads"
            );
            let start = |w: &Walked| (w.start[0], w.start[1], w.fp_used.then_some(w.start[2]));
            assert_eq!(
                (a.fp_used, a.capped, start(a)),
                (b.fp_used, b.capped, start(b)),
                "capture {i}"
            );
        }
        let (kept, met, moved) = SPLICES.with(|c| c.get());
        assert!(
            kept > 20 && met > 20 && moved > 5,
            "splices: kept {kept}, met {met}, moved {moved}"
        );
    }

    /// Random made-up stacks, one after another over the same words (the
    /// old frames' words stay where the new stack does not reach), laid out
    /// from a fixed top as real stacks are (a frame grown or added inside
    /// moves the start, not the outer frames, so walks meet after parts of
    /// other sizes and the rest moves): frames of functions with rsp-based
    /// rules (some saving rbp, then using it for anything) and
    /// frame-pointer functions with allocas, up to 160 deep, changed mostly
    /// near the inside (a function, an alloca, frames in or out, the
    /// garbage in rbp), into outputs of 6 to 128 frames, with and without
    /// an eval-loop stop (function 4 plays the eval loop). Every capture
    /// through the shared log must give what a full walk gives, and what
    /// the stack holds.
    #[test]
    fn random_stacks_splice_as_they_walk() {
        const FUNCTIONS: usize = 9;
        const WORDS: usize = 2048;
        // Function n: an rsp-based frame of 2, 4 or 6 words, saving rbp
        // (4 and 6) or not, or (n % 3 == 2) a frame-pointer frame.
        let site = |n: usize| 0x2000_0000_0000usize + n * 0x40 + 0x10;
        let ret = |n: usize| site(n) + 1;
        let is_fp = |n: usize| n % 3 == 2;
        let words = |n: usize| 2 + 2 * (n % 3);
        let saves = |n: usize| !is_fp(n) && n % 2 == 1;
        let rule = |n: usize| {
            if is_fp(n) {
                Rule::FRAME_POINTER
            } else {
                Rule {
                    cfa_offset: 8 * words(n) as i32,
                    rbp_offset: -16,
                    kind: KIND_RSP | if saves(n) { RBP_SAVED } else { 0 },
                    ra_offset: -8,
                }
            }
        };
        let mut mem = vec![0usize; WORDS].into_boxed_slice();
        let base = mem.as_mut_ptr() as usize;
        let at = |i: usize| base + 8 * i;
        let mut x = 0x9e37_79b9u64;
        let mut rand = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let mut shared = Box::new(ReplayLog::EMPTY);
        // (function, alloca words) innermost first; the last returns to 0.
        let mut frames: Vec<(usize, usize)> = Vec::new();
        let mut near_full = 0;
        let (mut room, mut after) = (128, 0);
        SPLICES.with(|c| c.set((0, 0, 0)));
        for round in 0..6000 {
            // Three phases: shallow stacks laid out from a fixed start
            // (parts kept), shallow and then deep ones (nearly full logs)
            // from a fixed top (rests moved).
            let from_top = round >= 2000;
            if round % 2000 == 0 {
                let depth = if round < 4000 { 8 } else { 140 };
                frames = (0..depth).map(|i| (i % FUNCTIONS, 0)).collect();
            }
            // From the top: mostly the innermost few frames (where walks
            // then meet), sometimes any.
            let mut pick = |len: usize| {
                if !from_top || rand(3) == 0 {
                    rand(len)
                } else {
                    rand(len.min(4))
                }
            };
            let (i, j) = (pick(frames.len()), pick(frames.len() + 1));
            match rand(6) {
                0 => frames[i].0 = rand(FUNCTIONS),
                1 => frames[i].1 = 2 * rand(3),
                2 if frames.len() > 2 => {
                    frames.remove(i);
                }
                3 if frames.len() < 160 => frames.insert(j, (rand(FUNCTIONS), 2 * rand(2))),
                _ => {} // only the garbage in rbp changes
            }
            // Lay the frames out from the innermost, the outermost ending 8
            // words below the top, then each one's rbp from the outermost
            // (what it saves is its caller's).
            let mut sp = 0;
            let mut layout = Vec::new(); // (cfa, frame pointer word)
            for &(f, alloca) in &frames {
                let (cfa, fp) = if is_fp(f) {
                    (sp + alloca + 2, Some(sp + alloca))
                } else {
                    (sp + words(f), None)
                };
                layout.push((cfa, fp));
                sp = cfa;
            }
            let o = if from_top { WORDS - 8 - sp } else { 0 };
            let mut rbp = 0x5a5a_0000 + rand(1000); // beyond the outermost
            for (i, &(f, _)) in frames.iter().enumerate().rev() {
                let (cfa, fp) = layout[i];
                mem[o + cfa - 1] = frames.get(i + 1).map_or(0, |&(g, _)| ret(g));
                if is_fp(f) || saves(f) {
                    mem[o + cfa - 2] = rbp;
                }
                rbp = match fp {
                    Some(w) => at(o + w),
                    None if saves(f) => 0x6b6b_0000 + rand(1000),
                    None => rbp,
                };
            }
            for f in 0..FUNCTIONS {
                remember_rule(site(f) as u64, rule(f));
            }
            let start = [site(frames[0].0), at(o), rbp];
            let bounds = (at(o), at(WORDS));
            // The output's length and the stop change now and then (in a
            // process they are fixed, or fixed per Python stack).
            if rand(20) == 0 {
                room = if rand(2) == 0 { 6 + rand(14) } else { 40 + rand(89) };
                after = if rand(3) == 0 { 0 } else { 1 + rand(3) as u32 };
            }
            let stop = EvalStop {
                lo: site(4),
                hi: site(4) + 1,
                after,
            };
            let mut want: Vec<u64> = frames[1..]
                .iter()
                .map(|&(f, _)| ret(f) as u64)
                .take(room)
                .collect();
            if after > 0 {
                let evals = want.iter().enumerate().filter(|(_, &r)| r as usize == ret(4));
                if let Some((last, _)) = evals.clone().nth(after as usize - 1) {
                    want.truncate(last + 1);
                }
            }
            let mut spliced = [MaybeUninit::uninit(); 128];
            let n = from_log(&mut shared, start, bounds, (0, 0), stop, &mut spliced[..room]);
            // SAFETY: the capture wrote the first `n` entries.
            let spliced: Vec<u64> = spliced[..n].iter().map(|v| unsafe { v.assume_init() }).collect();
            let mut full = [MaybeUninit::uninit(); 128];
            let m = from_log(
                &mut Box::new(ReplayLog::EMPTY),
                start,
                bounds,
                (0, 0),
                stop,
                &mut full[..room],
            );
            // SAFETY: as above.
            let full: Vec<u64> = full[..m].iter().map(|v| unsafe { v.assume_init() }).collect();
            assert_eq!(full, want, "round {round}: the full walk ({frames:?})");
            assert_eq!(
                spliced, want,
                "round {round}: the splice ({frames:?}, room {room}, stop {after})"
            );
            near_full += usize::from(shared.last.len > 150);
        }
        let (kept, met, moved) = SPLICES.with(|c| c.get());
        assert!(
            kept > 500 && met > 500 && moved > 100 && near_full > 0,
            "splices: kept {kept}, met {met}, moved {moved}; nearly full logs {near_full}"
        );
    }

    /// A nearly full log (191 reads) where the walked part has more outputs
    /// and fewer other reads than the part it replaces: moving the rest's
    /// outputs up first covered the lowest of its other reads, which was
    /// the outermost return address. When that word alone changes, the
    /// shared log must not replay the stale stack (a review found it).
    #[test]
    fn a_rest_moved_in_a_nearly_full_log_keeps_every_read() {
        let site = |n: usize| 0x3000_0000_0000usize + n * 0x40 + 0x10;
        let ret = |n: usize| site(n) + 1;
        // 0: an rsp-based frame of 2 words, saving nothing; 5: a
        // frame-pointer frame.
        let rule = |n: usize| {
            if n == 5 {
                Rule::FRAME_POINTER
            } else {
                Rule {
                    cfa_offset: 16,
                    rbp_offset: 0,
                    kind: KIND_RSP,
                    ra_offset: -8,
                }
            }
        };
        let mut mem = vec![0usize; 1024].into_boxed_slice();
        let base = mem.as_mut_ptr() as usize;
        let bounds = (base, base + 8 * 1024);
        // Lays `frames` (function, alloca words) out from word 0; returns
        // the start's rbp.
        let lay = |mem: &mut [usize], frames: &[(usize, usize)]| -> usize {
            let mut sp = 0;
            let mut layout = Vec::new();
            for &(f, alloca) in frames {
                let (cfa, fp) = if f == 5 {
                    (sp + alloca + 2, Some(sp + alloca))
                } else {
                    (sp + 2, None)
                };
                layout.push((cfa, fp));
                sp = cfa;
            }
            let mut rbp = 0x5a5a_0000;
            for (i, &(f, _)) in frames.iter().enumerate().rev() {
                let (cfa, fp) = layout[i];
                mem[cfa - 1] = frames.get(i + 1).map_or(0, |&(g, _)| ret(g));
                if f == 5 {
                    mem[cfa - 2] = rbp;
                }
                if let Some(w) = fp {
                    rbp = base + 8 * w;
                }
            }
            rbp
        };
        let capture = |log: &mut ReplayLog, mem: &[usize], first: usize, rbp: usize| -> Vec<u64> {
            remember_rule(site(0) as u64, rule(0));
            remember_rule(site(5) as u64, rule(5));
            let mut out = [MaybeUninit::uninit(); 128];
            let start = [site(first), mem.as_ptr() as usize, rbp];
            let n = from_log(log, start, bounds, (0, 0), EvalStop::default(), &mut out);
            // SAFETY: the capture wrote the first `n` entries.
            out[..n].iter().map(|v| unsafe { v.assume_init() }).collect()
        };
        let full = |mem: &[usize], first: usize, rbp: usize| {
            capture(&mut Box::new(ReplayLog::EMPTY), mem, first, rbp)
        };
        // Old: two frame-pointer frames with allocas, then 94 plain ones:
        // 191 reads.
        const REST: usize = 94;
        let mut shared = Box::new(ReplayLog::EMPTY);
        let mut old = vec![(5, 2), (5, 2)];
        old.extend([(5, 0); REST]);
        let rbp = lay(&mut mem, &old);
        capture(&mut shared, &mem, 5, rbp);
        assert_eq!(shared.last.len, 191);
        // New: four rsp-based frames over the same 8 words, the same rest.
        let mut new = vec![(0, 0); 4];
        new.extend([(5, 0); REST]);
        let rbp = lay(&mut mem, &new);
        assert_eq!(
            capture(&mut shared, &mem, 0, rbp),
            full(&mem, 0, rbp),
            "the splice"
        );
        // The outermost frame now returns into another frame.
        let top = 8 + 2 * REST;
        mem[top - 1] = ret(5);
        mem[top + 1] = ret(0);
        let got = capture(&mut shared, &mem, 0, rbp);
        assert_eq!(
            got,
            full(&mem, 0, rbp),
            "after the outermost return address changed"
        );
    }

    /// Made-up stacks: words in a buffer, unwound by rules given for
    /// made-up return addresses, where the words a splice must check can be
    /// changed one at a time, with the stale words a real stack keeps
    /// (old return addresses where the frames used to be) left in place.
    /// Each capture through the shared log (replay or splice) must give
    /// what a full walk gives.
    #[test]
    fn splices_check_every_word_the_rest_depends_on() {
        // Function n: its rule is the one of its call site, `site(n)`; a
        // return address into it is `ret(n)`.
        let site = |n: usize| 0x1000_0000_0000usize + n * 0x40 + 0x10;
        let ret = |n: usize| site(n) + 1;
        let rsp = |size: i32, saved: Option<i16>| Rule {
            cfa_offset: size,
            rbp_offset: saved.unwrap_or(0),
            kind: KIND_RSP | if saved.is_some() { RBP_SAVED } else { 0 },
            ra_offset: -8,
        };
        // 0, 1, 3 (and 7): frames of 32 bytes saving rbp at -16; 2, 4, 5:
        // 16 bytes, saving nothing; 6: rbp-based (a frame pointer, which an
        // alloca moves), saving rbp at -16; 7 saves it at -24.
        let rules = [
            rsp(32, Some(-16)),
            rsp(32, Some(-16)),
            rsp(16, None),
            rsp(32, Some(-16)),
            rsp(16, None),
            rsp(16, None),
            Rule::FRAME_POINTER,
            rsp(32, Some(-24)),
        ];
        let mut mem = vec![0usize; 64].into_boxed_slice();
        let base = mem.as_mut_ptr() as usize;
        let at = |i: usize| base + 8 * i;
        let bounds = (base, base + 8 * 64);
        let mut shared = Box::new(ReplayLog::EMPTY);
        let mut capture_with_rbp = |mem: &[usize], start_fn: usize, rbp: usize, what: &str| {
            for (n, r) in rules.iter().enumerate() {
                remember_rule(site(n) as u64, *r);
            }
            let start = [site(start_fn), mem.as_ptr() as usize, rbp];
            let mut spliced = [MaybeUninit::uninit(); 16];
            let n = from_log(
                &mut shared,
                start,
                bounds,
                (0, 0),
                EvalStop::default(),
                &mut spliced,
            );
            let mut full = [MaybeUninit::uninit(); 16];
            let m = from_log(
                &mut Box::new(ReplayLog::EMPTY),
                start,
                bounds,
                (0, 0),
                EvalStop::default(),
                &mut full,
            );
            // SAFETY: each capture wrote the first `n`/`m` entries.
            let spliced: Vec<u64> = spliced[..n].iter().map(|v| unsafe { v.assume_init() }).collect();
            // SAFETY: as above.
            let full: Vec<u64> = full[..m].iter().map(|v| unsafe { v.assume_init() }).collect();
            assert_eq!(spliced, full, "{what}");
            full
        };
        let r = |ns: &[usize]| ns.iter().map(|&n| ret(n) as u64).collect::<Vec<_>>();
        // I: the start is a frame-pointer frame (6) at [4, 6), then 2, 2.
        // J: the same words but one far out, and the start's rbp is another
        // frame at [12, 14) called by 4; I's frames are still there, stale.
        mem[..10].copy_from_slice(&[0, 0, 0, 0, 0, ret(2), 0, ret(2), 0, 0]);
        assert_eq!(capture_with_rbp(&mem, 6, at(4), "I"), r(&[2, 2]));
        mem[9] = 5;
        mem[12..16].copy_from_slice(&[0, ret(4), 0, 0]);
        assert_eq!(
            capture_with_rbp(&mem, 6, at(12), "J: the start's rbp changed"),
            r(&[4])
        );
        // K: 2 (start) passes the start's rbp on to 6, a frame-pointer
        // frame at [4, 6), then 2. L: the start's rbp is a frame at
        // [10, 12) called by 4: the frame of 2 stands, the walk resumes at
        // 6 with the start's rbp as it is now.
        mem.fill(0);
        mem[..8].copy_from_slice(&[0, ret(6), 0, 0, 0, ret(2), 0, 0]);
        assert_eq!(capture_with_rbp(&mem, 2, at(4), "K"), r(&[6, 2]));
        mem[10..14].copy_from_slice(&[0, ret(4), 0, 0]);
        assert_eq!(
            capture_with_rbp(&mem, 2, at(10), "L: the start's rbp changed, used later"),
            r(&[6, 4])
        );
        mem.fill(0);
        let mut capture =
            |mem: &[usize], start_fn: usize, what: &str| capture_with_rbp(mem, start_fn, 0x1234, what);

        // A: 0 (start) saves F6's rbp; 6 is a frame-pointer frame at
        // [10, 12); then 2, 2, 2.
        mem[..18].copy_from_slice(&[
            0,
            0,
            at(10),
            ret(6),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            ret(2),
            0,
            ret(2),
            0,
            ret(2),
            0,
            0,
        ]);
        assert_eq!(capture(&mem, 0, "A"), r(&[6, 2, 2, 2]));
        // B: 6's frame pointer moved (an alloca) to [20, 22), called by 4;
        // A's words stay where they were, but for one further out, so that
        // a splice that took A's saved rbp as still good would resume
        // inside A's frames.
        mem[2] = at(20);
        mem[15] = 7;
        mem[21] = ret(4);
        mem[23] = 0;
        assert_eq!(
            capture(&mem, 0, "B: a saved rbp changed, stale frames above"),
            r(&[6, 4])
        );

        // C: 0 (start, saves garbage), 2, 3 (saves 6's rbp), 6 at [20, 22),
        // 4. D: 0 returns into 5 (another function), and 6's frame pointer
        // moved to [30, 32), called by 5: the walks meet at 3 and the rest
        // read C's words, all stale but 3's saved rbp.
        mem.fill(0);
        mem[..10].copy_from_slice(&[0, 0, 0x5555, ret(2), 0, ret(3), 0, 0, at(20), ret(6)]);
        mem[20..24].copy_from_slice(&[0, ret(4), 0, 0]);
        assert_eq!(capture(&mem, 0, "C"), r(&[2, 3, 6, 4]));
        mem[3] = ret(5);
        mem[8] = at(30);
        mem[30..34].copy_from_slice(&[0, ret(5), 0, 0]);
        assert_eq!(
            capture(&mem, 0, "D: the rest's saved rbp changed"),
            r(&[5, 3, 6, 5])
        );

        // E: 2 (start), 1 (saves 6's rbp at 4), 6 at [20, 22), 4. F: 2
        // returns into 7 instead, which saves 6's rbp elsewhere (at 3): the
        // walks meet at 6 with rbp from another word, and C's is stale.
        mem.fill(0);
        mem[..6].copy_from_slice(&[0, ret(1), 0, 0, at(20), ret(6)]);
        mem[20..24].copy_from_slice(&[0, ret(4), 0, 0]);
        assert_eq!(capture(&mem, 2, "E"), r(&[1, 6, 4]));
        mem[1] = ret(7);
        mem[3] = at(30);
        mem[30..34].copy_from_slice(&[0, ret(5), 0, 0]);
        assert_eq!(
            capture(&mem, 2, "F: rbp where the walks meet differs"),
            r(&[7, 6, 5])
        );
        // G: as F, but 6's rbp as in E: the walks meet and take E's rest,
        // which must now check the word 7 saved rbp in. H: that word
        // changes, nothing else: no replay of G.
        mem[3] = at(20);
        mem[..2].copy_from_slice(&[0, ret(1)]);
        assert_eq!(capture(&mem, 2, "E again"), r(&[1, 6, 4]));
        mem[1] = ret(7);
        assert_eq!(
            capture(&mem, 2, "G: meets E's rest through another saved rbp"),
            r(&[7, 6, 4])
        );
        mem[3] = at(30);
        assert_eq!(capture(&mem, 2, "H: that saved rbp alone changed"), r(&[7, 6, 5]));
    }

    #[inline(never)]
    fn recurse(depth: usize, f: &mut dyn FnMut()) {
        if depth == 0 {
            f();
        } else {
            recurse(depth - 1, f);
        }
        std::hint::black_box(depth);
    }

    /// The fast unwinder gives the same return addresses as libgcc's,
    /// through 30 frames of this (optimized) test binary, then again
    /// from the warm cache. x86-64 only: elsewhere the fast unwinder is
    /// the reference one, called from another line of the closure, so
    /// the two captures differ in that frame alone (seen on aarch64,
    /// scripts/aarch64-check.sh, issue 27).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fast_matches_the_reference_unwinder() {
        let mut log = Box::new(ReplayLog::EMPTY);
        for _ in 0..2 {
            let mut fast = [MaybeUninit::uninit(); 64];
            let mut reference = [MaybeUninit::uninit(); 64];
            let (mut nf, mut nr) = (0, 0);
            // In this test binary our own code is the code under test:
            // skip nothing.
            recurse(30, &mut || {
                nf = fast_skipping(
                    &mut fast,
                    (0, 0),
                    crate::base::thread::current(),
                    &mut log,
                    EvalStop::default(),
                );
                nr = dwarf_skipping(&mut reference, (0, 0), EvalStop::default());
            });
            // SAFETY: each capture wrote the first `nf`/`nr` entries it
            // returned.
            let f: Vec<u64> = fast[..nf].iter().map(|v| unsafe { v.assume_init() }).collect();
            let r: Vec<u64> = reference[..nr]
                .iter()
                // SAFETY: as above.
                .map(|v| unsafe { v.assume_init() })
                .collect();
            assert!(nf >= 30, "fast unwinder stopped after {nf} frames");
            // The two captures start in different functions; from the
            // first common return address on, they must agree.
            let start_f = f.iter().position(|a| r.contains(a)).expect("no common frame");
            let start_r = r.iter().position(|a| *a == f[start_f]).unwrap();
            let common = (nf - start_f).min(nr - start_r);
            assert!(common >= 30, "only {common} common frames");
            assert_eq!(&f[start_f..start_f + common], &r[start_r..start_r + common]);
        }
    }
}
