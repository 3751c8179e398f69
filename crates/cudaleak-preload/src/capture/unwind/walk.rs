//! The walk from frame to frame, by each return address's rule, logging
//! what it reads.

use super::cache::rule_for;
use super::replay_log::{FrameStart, Recorder};
use super::rules::{KIND_MASK, KIND_RBP, KIND_RBP_DEREF, KIND_RSP, RBP_SAVED};
use super::stack::read_stack;
use super::{is_own, EvalStop};
use std::mem::MaybeUninit;

/// Called by a walk where each frame's unwinding starts: true stops the
/// walk there, to take the rest from the last walk (a splice).
pub(super) trait MeetsLastWalk {
    fn meets_last_walk(&mut self, at: &FrameStart, n: usize, room: usize) -> bool;
}

/// A plain walk meets nothing.
pub(super) struct NothingToMeet;

impl MeetsLastWalk for NothingToMeet {
    #[inline(always)]
    fn meets_last_walk(&mut self, _: &FrameStart, _: usize, _: usize) -> bool {
        false
    }
}

/// Walks on from `at` (first: the frame executing the start's pc, exactly,
/// not a return address), with `n` frames in `out` already. `bounds` is
/// (the capture's stack pointer, the stack's top). At each frame, `meeting`
/// may stop the walk, to take the rest from the last one (a splice); with
/// `EVAL_STOP`, `stop` ends it too.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn walk<M: MeetsLastWalk, const EVAL_STOP: bool>(
    mut at: FrameStart,
    bounds: (usize, usize),
    own: (usize, usize),
    stop: EvalStop,
    out: &mut [MaybeUninit<u64>],
    mut n: usize,
    rec: &mut Recorder,
    meeting: &mut M,
) -> usize {
    while n < out.len() {
        if meeting.meets_last_walk(&at, n, out.len()) {
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
