//! A thread's several Python replay logs, on 3.11 chains in memory: call
//! paths taken in turn replay from their own logs, every capture returns
//! what a walk with a fresh log returns, and looking through the logs
//! stays rare where it does not pay.

use super::model::Interpreter311;
use super::replay::copy_frames;
use super::replay_log::{PyReplayLog, PyReplayLogs};
use super::replay_tests::Chain311;
use super::walk::{walk_frames, walk_logs};
use crate::capture::looks::{LogChoice, GUESSES};
use crate::capture::python_layouts::PY311;
use cudaleak_core::record::python::PyRawFrame;
use std::mem::MaybeUninit;

/// Frames of the chain: a leaf, `ROUTES` routing frames whose code
/// objects depend on the call path (route A or B, as `bench/py_step.py`
/// routes its ops), a recursion of one function, and the outermost frame.
/// Deeper than 32 frames: a walk of a real program's depth is logged.
const ROUTES: usize = 6;
const DEPTH: usize = 40;

/// The address the chain's code objects name as their type
/// (`PyCode_Type`'s, to the walk).
static CODE_TYPE_OBJECT: u64 = 0;

/// The chain, and the code type its code objects have. Code objects: the
/// leaf, route A, route B, the recursion, the outermost.
fn chain() -> (Chain311, usize) {
    let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
    let mut c = Chain311::new(5, DEPTH, code_type);
    for i in 0..DEPTH - 1 {
        let next = c.frame(i + 1);
        c.link(i, next);
    }
    let (leaf, nest, outer) = (c.code(0), c.code(3), c.code(4));
    c.set_frame(0, leaf, 10, 0, 0);
    for i in ROUTES + 1..DEPTH - 1 {
        c.set_frame(i, nest, 6, 0, 0);
    }
    c.set_frame(DEPTH - 1, outer, 8, 1, 0);
    (c, code_type)
}

/// Routes the chain's call through `path`'s frames.
fn take_path(c: &mut Chain311, path: usize) {
    for k in 0..ROUTES {
        let code = c.code(1 + (path >> k & 1));
        c.set_frame(1 + k, code, 4, 0, 0);
    }
}

/// (code, guard, offset, flags) of each frame.
type Frames = Vec<(u64, u64, u32, u32)>;

fn frames_of(out: &[MaybeUninit<PyRawFrame>], n: usize) -> Frames {
    out[..n]
        .iter()
        // SAFETY: the walk wrote `out[..n]`.
        .map(|f| unsafe { f.assume_init() })
        .map(|f| (f.code, f.guard, f.offset, f.flags))
        .collect()
}

/// A capture through `logs`: its frames and generation, and whether it
/// walked or patched (a new generation), after checking it against a
/// walk with a fresh log.
fn capture(c: &Chain311, logs: &mut PyReplayLogs, code_type: usize) -> (Frames, u64, bool) {
    let mut out = [MaybeUninit::<PyRawFrame>::uninit(); 64];
    let walks = logs.walks;
    // SAFETY: every address is in `c.codes` or `c.frames`, alive, laid
    // out as 3.11's; the chain ends at 0.
    let n = unsafe { walk_logs::<Interpreter311>(&PY311, code_type, c.frame(0), &mut out, logs) };
    // A replay leaves the frames in its log (`take_frames`).
    if logs.walks == walks {
        copy_frames(&logs.last().out[..n], &mut out);
    }
    let got = frames_of(&out, n);
    let mut own = Box::new(PyReplayLog::EMPTY);
    let mut fresh = [MaybeUninit::<PyRawFrame>::uninit(); 64];
    // SAFETY: the same chain, alive and laid out as 3.11's (its
    // addresses in `c.codes` or `c.frames`, ending at 0), with a log of
    // its own.
    let m = unsafe { walk_frames::<Interpreter311>(&PY311, code_type, c.frame(0), &mut fresh, &mut own) };
    assert_eq!(got, frames_of(&fresh, m), "not what a walk sees");
    assert_eq!(n, DEPTH);
    (got, logs.generation(), logs.walks != walks)
}

#[test]
fn python_call_paths_in_turn_replay_from_their_own_logs() {
    let (mut c, code_type) = chain();
    let mut logs = Box::new(PyReplayLogs::EMPTY);
    let round = |c: &mut Chain311, logs: &mut PyReplayLogs, paths: usize| {
        let mut walked = 0;
        let mut generations = Vec::new();
        for p in 0..paths {
            take_path(c, p);
            let (_, generation, new) = capture(c, logs, code_type);
            walked += usize::from(new);
            generations.push(generation);
        }
        (walked, generations)
    };
    // 12 paths: walked once each, then each replays its own log (the
    // generation its walk gave), round after round.
    let (walked, first) = round(&mut c, &mut logs, 12);
    assert_eq!(walked, 12);
    GUESSES.with(|g| g.set((0, 0)));
    for r in 0..3 {
        assert_eq!(round(&mut c, &mut logs, 12), (0, first.clone()), "round {r}");
    }
    // Each replays the guess, the log that followed the last one, but the
    // first after the walks (path 11's log had no follower yet).
    assert_eq!(GUESSES.with(|g| g.get()), (35, 0), "guesses replayed, not");
    // Generations are the thread's, not a log's: no two paths share one.
    let mut unique = first.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 12);
    // Another line in the outermost frame: every log is stale. A round
    // of walks, and replays again soon.
    let outer = c.code(4);
    c.set_frame(DEPTH - 1, outer, 12, 1, 0);
    let rounds: Vec<usize> = (0..6).map(|_| round(&mut c, &mut logs, 12).0).collect();
    assert!(
        rounds[0] == 12 && rounds[3..] == [0, 0, 0],
        "walks per round: {rounds:?}"
    );

    // 40 paths, more than the logs: every capture is still what a walk
    // sees (checked in `capture`), and looks that find nothing are not
    // many more than those that found a log.
    let mut logs = Box::new(PyReplayLogs::EMPTY);
    let (mut looked, mut replayed) = (0, 0);
    for _ in 0..100 {
        for p in 0..40 {
            looked += usize::from(logs.choice.looking());
            take_path(&mut c, p);
            replayed += usize::from(!capture(&c, &mut logs, code_type).2);
        }
    }
    let vain = looked.saturating_sub(replayed);
    assert!(
        vain < replayed + 400,
        "of 4,000 captures, {looked} looked, {vain} in vain"
    );
    // 64 paths, twice the logs: the thread soon looks for few captures.
    let mut logs = Box::new(PyReplayLogs::EMPTY);
    let mut looked = 0;
    for _ in 0..64 {
        for p in 0..64 {
            looked += usize::from(logs.choice.looking());
            take_path(&mut c, p);
            capture(&c, &mut logs, code_type);
        }
    }
    assert!(
        looked < 400,
        "of 4,096 captures, {looked} looked through the logs"
    );
}

/// A capture that misses the last log and finds none keeps the last
/// log's path: the next capture of that path replays.
#[test]
fn a_new_path_does_not_take_the_last_paths_log() {
    let (mut c, code_type) = chain();
    let mut logs = Box::new(PyReplayLogs::EMPTY);
    take_path(&mut c, 0);
    let (_, g0, walked) = capture(&c, &mut logs, code_type);
    assert!(walked);
    // Another path: its route frames changed in place (patched or walked
    // into another log).
    take_path(&mut c, 1);
    assert!(capture(&c, &mut logs, code_type).2);
    take_path(&mut c, 0);
    assert_eq!(capture(&c, &mut logs, code_type).1, g0);
    // With the others forgotten, the last log alone: patched in place.
    logs.forget_others();
    take_path(&mut c, 1);
    let (_, g1, walked) = capture(&c, &mut logs, code_type);
    assert!(walked);
    assert_ne!(g1, g0);
}

/// The empty logs are all zero bits: a thread's buffers are allocated
/// zeroed and the logs are not written before use (`capture/mod.rs`).
#[test]
fn empty_python_logs_are_all_zero_bits() {
    fn empty(log: &PyReplayLog) -> bool {
        (log.visited, log.head, log.generation, log.groups) == (0, 0, 0, 0)
            && (log.guarded, log.not_codes, log.recorded) == (0, 0, 0)
            && log
                .visits
                .iter()
                .all(|v| (v.next, v.code, v.instr, v.bytes) == (0, 0, 0, 0))
            && log.visit_of.iter().all(|&v| v == 0)
            && log.guards.iter().all(|g| (g.code, g.guard) == (0, 0))
            && log.not_code.iter().all(|&c| c == 0)
            && log.out.iter().all(|f| *f == PyRawFrame::default())
    }
    let logs = Box::new(PyReplayLogs::EMPTY);
    // SAFETY: a plain allocation of the type's layout.
    let zeroed =
        unsafe { std::alloc::alloc_zeroed(std::alloc::Layout::new::<PyReplayLogs>()) }.cast::<PyReplayLogs>();
    assert!(!zeroed.is_null());
    // SAFETY: the fields are integers and arrays of them, for which
    // all-zero bits are valid values.
    let z = unsafe { &*zeroed };
    for l in [&*logs, z] {
        assert!(l.logs.iter().all(empty));
        assert_eq!((l.choice, l.walks), (LogChoice::ZERO, 0));
    }
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(zeroed.cast(), std::alloc::Layout::new::<PyReplayLogs>()) };
}
