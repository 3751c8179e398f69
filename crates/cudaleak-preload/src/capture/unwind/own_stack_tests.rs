//! Captures of this test binary's own stack: replays, splices between call
//! paths, and the fast unwinder against the reference one.

use super::reference::dwarf_skipping;
use super::replay::SPLICES;
use super::replay_log::{WalkLog, REPLAY_READS, STEP_PENDING};
use super::*;
use crate::base::thread::ThreadState;

/// The top of the calling thread's stack, as `Stack::capture_into` finds
/// it for a capture.
#[inline(never)]
fn stack_top(thread: &ThreadState) -> Option<usize> {
    let here = 0u8;
    stack_bounds(std::hint::black_box(&here) as *const u8 as usize, thread).map(|(_, top)| top)
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
            let walks = log.walks;
            nf = fast_skipping(
                &mut fast,
                (0, 0),
                stack_top(thread),
                &mut log,
                EvalStop::default(),
            );
            replayed = log.walks == walks;
            nr = dwarf_skipping(&mut reference, (0, 0), EvalStop::default());
        };
        // a a b b a a: the second of each pair replays, and so does the
        // first of the last pair, from the log of path a's walk
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
            // SAFETY: the reference capture wrote the first `nr` entries.
            .map(|v| unsafe { v.assume_init() })
            .collect();
        let start = f.iter().position(|a| r.contains(a)).unwrap();
        let rs = r.iter().position(|a| *a == f[start]).unwrap();
        assert_eq!(&f[start..], &r[rs..rs + (nf - start)], "capture {i}");
        results.push((replayed, log.generation, f));
    }
    assert_eq!(
        results.iter().map(|r| r.0).collect::<Vec<_>>(),
        [false, true, false, true, true, true]
    );
    // Each walk makes a new generation; a replay gives the walk's.
    let generations: Vec<u64> = results.iter().map(|r| r.1).collect();
    let (g, h) = (generations[0], generations[2]);
    assert_ne!(g, h);
    assert_eq!(generations, [g, g, h, h, g, g]);
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
            let n = fast_skipping(
                &mut buf,
                (0, 0),
                stack_top(thread),
                &mut fresh,
                EvalStop::default(),
            );
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
        // Nothing to replay or splice for `fresh`: a full walk. Only the
        // last walk for `shared`: a replay of it or a splice (the other
        // logs would replay most of these 32 paths).
        fresh.forget();
        shared.forget_others();
        let logs: [*mut ReplayLog; 2] = [&mut *shared, &mut *fresh];
        let mut f = || {
            // One call site for both captures (a branch to choose the
            // log would let the compiler make two).
            for which in 0..std::hint::black_box(2) {
                // SAFETY: the two boxes above, alive and not otherwise
                // borrowed while the closure runs.
                let log = unsafe { &mut *logs[std::hint::black_box(which)] };
                let mut buf = [MaybeUninit::uninit(); 64];
                let n = fast_skipping(&mut buf, skip, stack_top(thread), log, EvalStop::default());
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
        let (a, b) = (shared.last(), fresh.last());
        let steps = |w: &WalkLog| -> Vec<_> {
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
        let reads = |w: &WalkLog| {
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
        let start = |w: &WalkLog| (w.start[0], w.start[1], w.fp_used.then_some(w.start[2]));
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
/// the two captures differ in that frame alone (seen on aarch64, under
/// scripts/aarch64-check.sh).
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
                stack_top(crate::base::thread::current()),
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
            // SAFETY: the reference capture wrote the first `nr` entries.
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
