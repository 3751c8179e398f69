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
) -> (usize, Option<u64>) {
    match crate::base::settings::config().unwinder {
        Unwinder::Dwarf => (capture_dwarf(out), None),
        Unwinder::Fast => {
            let (n, _replayed) = fast_skipping(out, own_range(), thread, log);
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
pub struct ReplayLog {
    start: [usize; 3],
    /// whether the walk used the start's rbp (a frame-pointer rule before
    /// any saved rbp was restored); when not, rbp may hold anything (a
    /// caller's loop counter, without frame pointers) and replay still holds
    fp_used: bool,
    /// recorded reads; 0 when the log is not usable
    len: usize,
    /// of which reads of output return addresses, in walk order, at the
    /// front of `reads`; the others are at its back
    outputs: usize,
    /// Bumped by every full walk (logged or not), kept by a replay: the
    /// frames of a capture with generation g are those of the walk that
    /// made g. A trace's reuse (`capture.rs`) compares generations instead
    /// of frames (issue 24), and a capture that was never interned (a
    /// failed call) cannot lend its replay to the previous trace's id.
    generation: u64,
    /// (address, value): the output return addresses from the front, the
    /// other words (saved rbp, our own frames' return addresses) from the
    /// back. Kept apart, replay checks the others in one tight loop and
    /// writes each output without testing a flag (issue 24: about 110
    /// instructions less for a 25-frame stack).
    reads: [(usize, usize); REPLAY_READS],
}

const REPLAY_READS: usize = 192;

impl ReplayLog {
    pub const EMPTY: ReplayLog = ReplayLog {
        start: [0; 3],
        fp_used: false,
        len: 0,
        outputs: 0,
        generation: 0,
        reads: [(0, 0); REPLAY_READS],
    };
}

/// Reads that a walk records (or not, when the log is full).
struct Recorder<'a> {
    log: &'a mut ReplayLog,
    outputs: usize,
    others: usize,
    overflow: bool,
    fp_used: bool,
}

impl Recorder<'_> {
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
}

/// Replays the log if the stack is unchanged; None otherwise.
#[inline(always)]
fn replay(log: &ReplayLog, start: [usize; 3], out: &mut [MaybeUninit<u64>]) -> Option<usize> {
    if log.len == 0 || log.start[..2] != start[..2] || (log.fp_used && log.start[2] != start[2]) {
        return None;
    }
    let outputs = &log.reads[..log.outputs];
    if outputs.len() > out.len() {
        return None;
    }
    for &(a, v) in &log.reads[REPLAY_READS - (log.len - log.outputs)..] {
        // SAFETY: the address was checked to lie between the capture's
        // stack pointer (the same now) and the stack's top when recorded.
        if unsafe { (a as *const usize).read() } != v {
            return None;
        }
    }
    // (a mismatch leaves `out` partly written: the walk that follows
    // writes it again)
    for (slot, &(a, v)) in out.iter_mut().zip(outputs) {
        // SAFETY: as above.
        if unsafe { (a as *const usize).read() } != v {
            return None;
        }
        slot.write(v as u64);
    }
    Some(outputs.len())
}

#[inline]
fn is_own(ip: usize, range: (usize, usize)) -> bool {
    range.0 <= ip && ip < range.1
}

/// The reference unwinder: libgcc's, through the backtrace crate.
pub fn capture_dwarf(out: &mut [MaybeUninit<u64>]) -> usize {
    dwarf_skipping(out, own_range())
}

#[inline(never)]
fn dwarf_skipping(out: &mut [MaybeUninit<u64>], range: (usize, usize)) -> usize {
    let mut n = 0;
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
/// leaving out return addresses inside `skip`; true when replayed. A
/// capture that did not replay made a new generation of the log (see
/// [`capture`]).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn fast_skipping(
    out: &mut [MaybeUninit<u64>],
    skip: (usize, usize),
    thread: &ThreadState,
    log: &mut ReplayLog,
) -> (usize, bool) {
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
        log.len = 0;
        log.generation += 1;
        return (dwarf_skipping(out, skip), false);
    };
    let start = [pc, sp, fp];
    if let Some(n) = replay(log, start, out) {
        return (n, true);
    }
    let mut rec = Recorder {
        log,
        outputs: 0,
        others: 0,
        overflow: false,
        fp_used: false,
    };
    let n = walk(pc, sp, fp, (sp, top), skip, out, &mut rec);
    rec.log.len = if rec.overflow { 0 } else { rec.outputs + rec.others };
    rec.log.outputs = rec.outputs;
    rec.log.start = start;
    rec.log.fp_used = rec.fp_used;
    rec.log.generation += 1;
    (n, false)
}

#[cfg(not(target_arch = "x86_64"))]
fn fast_skipping(
    out: &mut [MaybeUninit<u64>],
    skip: (usize, usize),
    _thread: &ThreadState,
    log: &mut ReplayLog,
) -> (usize, bool) {
    log.generation += 1;
    (dwarf_skipping(out, skip), false)
}

/// Walks from the frame executing `pc` (exactly: not a return address).
/// `bounds` is (the capture's stack pointer, the stack's top).
#[inline(always)]
fn walk(
    mut pc: usize,
    mut sp: usize,
    mut fp: usize,
    bounds: (usize, usize),
    own: (usize, usize),
    out: &mut [MaybeUninit<u64>],
    rec: &mut Recorder,
) -> usize {
    let mut n = 0;
    let mut lookup = pc as u64;
    // rbp is the start's until a rule restores a saved one; a restored
    // rbp's stack word matters (is logged for replay) only once a rule
    // uses rbp: without frame pointers, callers park anything in rbp.
    let mut fp_is_start = true;
    let mut fp_saved_at: Option<(usize, usize)> = None;
    while n < out.len() {
        let rule = rule_for(lookup);
        let kind = rule.kind & KIND_MASK;
        if kind == KIND_RBP || kind == KIND_RBP_DEREF {
            rec.fp_used |= fp_is_start;
            if let Some((at, v)) = fp_saved_at.take() {
                rec.note(at, v, false);
            }
        }
        let cfa = match kind {
            KIND_RSP => sp.wrapping_add_signed(rule.cfa_offset as isize),
            KIND_RBP => fp.wrapping_add_signed(rule.cfa_offset as isize),
            KIND_RBP_DEREF => {
                let at = fp.wrapping_add_signed(rule.cfa_offset as isize);
                match read_stack(at, bounds) {
                    Some(c) => {
                        rec.note(at, c, false);
                        c
                    }
                    None => break,
                }
            }
            _ => break,
        };
        if cfa <= sp || cfa > bounds.1 {
            break;
        }
        let ra_at = cfa.wrapping_add_signed(rule.ra_offset as isize);
        let Some(ra) = read_stack(ra_at, bounds) else {
            break;
        };
        if rule.kind & RBP_SAVED != 0 {
            let at = cfa.wrapping_add_signed(rule.rbp_offset as isize);
            match read_stack(at, bounds) {
                Some(v) => {
                    fp_saved_at = Some((at, v));
                    fp = v;
                    fp_is_start = false;
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
        }
        sp = cfa;
        pc = ra;
        // The call instruction is just before the return address; its rule
        // is the caller's state (and a call that never returns can be the
        // last instruction of a function).
        lookup = (pc - 1) as u64;
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
                (nf, replayed) = fast_skipping(&mut fast, (0, 0), thread, &mut log);
                nr = dwarf_skipping(&mut reference, (0, 0));
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
                nf = fast_skipping(&mut fast, (0, 0), crate::base::thread::current(), &mut log).0;
                nr = dwarf_skipping(&mut reference, (0, 0));
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
