//! Replay of the last walk when the stack is unchanged, and splices of it
//! when the stack changed in part.

use super::replay_log::{
    Counts, FrameStart, LoggedStep, Recorder, WalkLog, REPLAY_READS, REPLAY_STEPS, STEP_FP_USED, STEP_PENDING,
};
use super::rules::RBP_SAVED;
use super::stack::read_stack;
use super::walk::{walk, MeetsLastWalk, NothingToMeet};
use super::EvalStop;
use std::mem::MaybeUninit;

/// Why a replay did not happen: the first output read that changed,
/// when the log was made from the same start and all its other reads
/// hold (what a splice would look for again); None otherwise.
type Changed = Option<usize>;

/// Replays the log if the stack is unchanged.
#[inline(always)]
pub(super) fn replay(
    log: &WalkLog,
    start: &[usize; 3],
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
    // SAFETY: every logged read lies between the capture's stack pointer
    // (the same now) and the stack's top, checked when it was recorded.
    if unsafe { any_changed(&log.reads[REPLAY_READS - (log.len - log.outputs)..]) } {
        return Err(None);
    }
    // SAFETY: logged output reads, each checked when recorded to lie
    // between the capture's stack pointer (the same now) and the stack's
    // top: this thread's mapped stack, aligned.
    if let Err(from) = unsafe { write_outputs(outputs, out) } {
        // SAFETY: the reads of `outputs` lie on this thread's stack as
        // just said.
        return Err(Some(unsafe { first_changed(outputs, from) }));
    }
    Ok(outputs.len())
}

/// Writes the logged values of `outputs` to the start of `out` and
/// checks that their reads still hold: four a turn, their values written
/// and then their reads compared, one loop test for four frames (against
/// one a turn, 64 instructions less for 25 frames). A read that changed
/// gives the index in `outputs` of the piece it is in (the reads before
/// it hold); `out` is then partly written (the walk that follows writes
/// it again).
///
/// # Safety
/// Every address in `outputs` lies on this thread's mapped stack, aligned.
#[inline(always)]
unsafe fn write_outputs(outputs: &[(usize, usize)], out: &mut [MaybeUninit<u64>]) -> Result<(), usize> {
    let out = &mut out[..outputs.len()];
    let mut chunks = outputs.chunks_exact(4);
    let mut slots = out.chunks_exact_mut(4);
    // (an index, not the piece: a slice returned cost the loop registers,
    // 4 instructions a turn)
    for (i, (c, o)) in (&mut chunks).zip(&mut slots).enumerate() {
        for k in 0..4 {
            o[k].write(c[k].1 as u64);
        }
        // SAFETY: reads of `outputs`: this function's contract.
        if unsafe { any_changed(c) } {
            return Err(4 * i);
        }
    }
    let from = outputs.len() - chunks.remainder().len();
    for (&(a, v), o) in chunks.remainder().iter().zip(slots.into_remainder()) {
        // SAFETY: a read of `outputs`: this function's contract.
        if unsafe { (a as *const usize).read() } != v {
            return Err(from);
        }
        o.write(v as u64);
    }
    Ok(())
}

/// Whether any of `reads` changed: four a turn, one loop test for four.
///
/// # Safety
/// Every address lies on this thread's mapped stack, aligned.
#[inline(always)]
unsafe fn any_changed(reads: &[(usize, usize)]) -> bool {
    // SAFETY: this function's contract.
    let read = |a: usize| unsafe { (a as *const usize).read() };
    let mut chunks = reads.chunks_exact(4);
    for c in &mut chunks {
        if (read(c[0].0) ^ c[0].1)
            | (read(c[1].0) ^ c[1].1)
            | (read(c[2].0) ^ c[2].1)
            | (read(c[3].0) ^ c[3].1)
            != 0
        {
            return true;
        }
    }
    chunks.remainder().iter().any(|&(a, v)| read(a) != v)
}

/// The index in `outputs` of the first read from `from` on that changed,
/// where the reads before `from` hold: out of line, where a replay fails.
/// (`from` if none changed: a splice from there.)
///
/// # Safety
/// Every address in `outputs` lies on this thread's mapped stack, aligned.
#[cold]
#[inline(never)]
unsafe fn first_changed(outputs: &[(usize, usize)], from: usize) -> usize {
    // SAFETY: this function's contract.
    from + outputs[from..]
        .iter()
        .position(|&(a, v)| unsafe { (a as *const usize).read() } != v)
        .unwrap_or(0)
}

/// Replays a log other than the last one if the stack is unchanged
/// since its walk. `changed`: the first output of the last log that
/// changed (as [`replay`] found it), where this stack differs from that
/// one, and so where a log of another call path most likely differs from
/// it too: that output is checked first. Then the outputs, innermost
/// first, and the others (saved rbp, our own frames), which hold for
/// every path.
#[inline(always)]
pub(super) fn replay_other(
    log: &WalkLog,
    start: &[usize; 3],
    stop: EvalStop,
    changed: Changed,
    out: &mut [MaybeUninit<u64>],
) -> Option<usize> {
    if log.len == 0
        || log.start[..2] != start[..2]
        || (log.fp_used && log.start[2] != start[2])
        || log.stop_after != stop.after
        || log.room != out.len()
    {
        return None;
    }
    let outputs = &log.reads[..log.outputs];
    if let Some(&(a, v)) = changed.and_then(|i| outputs.get(i)) {
        // SAFETY: a read this log's walk made from the same stack pointer
        // as now (checked above), so between it and the stack's top, on
        // this thread's mapped stack, aligned.
        if unsafe { (a as *const usize).read() } != v {
            return None;
        }
    }
    // SAFETY: logged by this log's walk from this stack pointer, so
    // between it and the stack's top, on this thread's mapped stack,
    // aligned.
    unsafe { write_outputs(outputs, out) }.ok()?;
    // SAFETY: reads this log's walk made from the same stack pointer as
    // now (checked above): between it and the stack's top, on this
    // thread's mapped stack, aligned.
    let others_changed = unsafe { any_changed(&log.reads[REPLAY_READS - (log.len - log.outputs)..]) };
    (!others_changed).then_some(outputs.len())
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
    // mapped stack. Four a turn, as a replay compares them.
    !unsafe { any_changed(reads) }
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
struct MeetingSearch<'a> {
    last: &'a WalkLog,
    /// the last walk's first step not yet passed; where the walks met,
    /// once `met`
    j: usize,
    met: bool,
    /// whether the rest uses the rbp it has at `j`
    needs_fp: bool,
    /// where this walk stood when it met the last one
    at: FrameStart,
    tries: u32,
    bounds: (usize, usize),
}

impl MeetsLastWalk for MeetingSearch<'_> {
    #[inline(always)]
    fn meets_last_walk(&mut self, at: &FrameStart, n: usize, room: usize) -> bool {
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

impl MeetingSearch<'_> {
    #[inline(never)]
    fn check_rest(&mut self, at: &FrameStart, n: usize, room: usize) -> bool {
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
/// again ([`MeetingSearch`]) the rest is taken. Only the part that changed is
/// written into `last` (the rest moves when the two parts differ in
/// size). Returns the frames.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) fn splice(
    last: &mut WalkLog,
    scratch: &mut WalkLog,
    start: [usize; 3],
    bounds: (usize, usize),
    own: (usize, usize),
    stop: EvalStop,
    changed: Changed,
    out: &mut [MaybeUninit<u64>],
) -> usize {
    let mut at = FrameStart {
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
                    at = FrameStart {
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
            walk::<_, false>(at, bounds, own, stop, out, outputs, &mut rec, &mut NothingToMeet)
        } else {
            walk::<_, true>(at, bounds, own, stop, out, outputs, &mut rec, &mut NothingToMeet)
        };
        (n, None)
    } else {
        let mut rejoin = MeetingSearch {
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
    count_splice(k > 0, rejoin.is_some());
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
    count_move(new.steps != j);
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
fn valid_steps(last: &WalkLog, start: [usize; 3], room: usize, known: Changed) -> usize {
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
    let noted = |before: &dyn Fn(&LoggedStep) -> bool| steps.partition_point(before).saturating_sub(1);
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

#[cfg(test)]
std::thread_local! {
    /// Splices on this thread (tests: that they happen): (kept a part of
    /// the last walk, met it again, moved its rest).
    pub(super) static SPLICES: std::cell::Cell<(u32, u32, u32)> = const { std::cell::Cell::new((0, 0, 0)) };
}

#[cfg(test)]
fn count_splice(kept: bool, met: bool) {
    SPLICES.with(|c| {
        let (k, m, v) = c.get();
        c.set((k + kept as u32, m + met as u32, v));
    });
}

#[cfg(test)]
fn count_move(moved: bool) {
    SPLICES.with(|c| {
        let (k, m, v) = c.get();
        c.set((k, m, v + moved as u32));
    });
}
