//! Replay against full walks of 3.11 and 3.14 chains in memory: each word
//! a walk reads, changed alone, must make the next capture walk again and
//! see it; unchanged, the capture is a replay (same generation). Each
//! test here failed with the check it guards taken out of `replay`.

use super::model::{FrameModelType, Interpreter311, Interpreter312, Interpreter314};
use super::replay::PATCHES;
use super::replay_log::PyReplayLog;
use super::walk::walk_frames;
use crate::capture::python_layouts::{FrameModel, PyLayout, PY311};
use cudaleak_core::record::python::eval_groups;
use cudaleak_core::record::python::{PyRawFrame, PY_FRAME_ENTRY};
use std::mem::MaybeUninit;

/// What a capture returned: (code, guard, offset, flags) per frame,
/// the generation, and the log's group count.
type Got = (Vec<(usize, u64, u32, u32)>, u64, usize);

/// # Safety
/// `head` is 0 or a frame of a chain in live memory laid out as `l`
/// says, whose code objects have type `code_type`.
unsafe fn capture_from<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    head: usize,
    log: &mut PyReplayLog,
) -> Got {
    // SAFETY: `head` is 0 or a frame of a live chain laid out as `l` says,
    // its code objects of type `code_type` (this function's contract, the
    // same as `capture_within`'s).
    unsafe { capture_within::<M>(l, code_type, head, log, 16) }
}

/// As `capture_from`, into `out_len` frames at most.
///
/// # Safety
/// As `capture_from`.
unsafe fn capture_within<M: FrameModelType>(
    l: &PyLayout,
    code_type: usize,
    head: usize,
    log: &mut PyReplayLog,
    out_len: usize,
) -> Got {
    let mut out = [MaybeUninit::<PyRawFrame>::uninit(); 16];
    let out = &mut out[..out_len];
    // SAFETY: `head` is 0 or a frame of a live chain laid out as `l` says,
    // its code objects of type `code_type` (this function's contract):
    // what `walk_frames` reads is there, and the chain ends at 0.
    let n = unsafe { walk_frames::<M>(l, code_type, head, out, log) };
    let frames: Vec<PyRawFrame> = out[..n]
        .iter()
        // SAFETY: the walk wrote `out[..n]`.
        .map(|f| unsafe { f.assume_init() })
        .collect();
    assert_eq!(log.eval_groups(), eval_groups(&frames).len());
    let frames = frames
        .iter()
        .map(|f| (f.code as usize, f.guard, f.offset, f.flags))
        .collect();
    (frames, log.generation, log.eval_groups())
}

/// CPython 3.11 (x86-64): code objects with their type, qualname and
/// line table (the guard) and `_co_firsttraceable`, code at 184;
/// `_PyInterpreterFrame`s with f_code at 32, previous at 48,
/// prev_instr at 56, is_entry at 68 and owner at 69.
pub(super) struct Chain311 {
    pub(super) codes: Vec<[u64; 40]>,
    pub(super) frames: Vec<[u64; 9]>,
}

impl Chain311 {
    /// `codes` code objects of type `code_type` (and guard words
    /// 0x1000 + i, 0x2000 + i), `frames` zeroed frames.
    pub(super) fn new(codes: usize, frames: usize, code_type: usize) -> Chain311 {
        let mut c = Chain311 {
            codes: vec![[0u64; 40]; codes],
            frames: vec![[0u64; 9]; frames],
        };
        for (i, code) in c.codes.iter_mut().enumerate() {
            code[1] = code_type as u64;
            code[128 / 8] = 0x1000 + i as u64;
            code[136 / 8] = 0x2000 + i as u64;
        }
        c
    }
    pub(super) fn code(&self, i: usize) -> usize {
        self.codes[i].as_ptr() as usize
    }
    pub(super) fn frame(&self, i: usize) -> usize {
        self.frames[i].as_ptr() as usize
    }
    pub(super) fn set_frame(&mut self, i: usize, code: usize, offset: usize, entry: u64, owner: u64) {
        let f = &mut self.frames[i];
        f[32 / 8] = code as u64;
        f[56 / 8] = (code + 184 + offset) as u64;
        f[64 / 8] = entry << 32 | owner << 40;
    }
    pub(super) fn link(&mut self, i: usize, next: usize) {
        self.frames[i][48 / 8] = next as u64;
    }
}

#[test]
fn a_3_11_replay_sees_each_frame_word_entry_and_owner_byte_and_guard_change() {
    let l = &PY311;
    static CODE_TYPE_OBJECT: u64 = 0;
    let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
    // Code objects A, B, C, D (incomplete below offset 6), E.
    let mut c = Chain311::new(5, 5, code_type);
    c.codes[3][168 / 8] = 3; // `_co_firsttraceable`, in code units
    let (a, b, cc, d, e) = (c.code(0), c.code(1), c.code(2), c.code(3), c.code(4));
    // innermost A; D in its prelude (skipped); B twice (a recursion,
    // the outer one entered from C); C outermost.
    c.set_frame(0, a, 10, 0, 0);
    c.set_frame(1, d, 2, 0, 0);
    c.set_frame(2, b, 4, 0, 0);
    c.set_frame(3, b, 6, 1, 0);
    c.set_frame(4, cc, 8, 0, 0);
    for i in 0..4 {
        let next = c.frame(i + 1);
        c.link(i, next);
    }
    let head = c.frame(0);
    let mut log = PyReplayLog::EMPTY;
    let mut capture = |c: &Chain311| {
        let _ = c;
        // SAFETY: every address is in `c.codes` or `c.frames`, alive.
        unsafe { capture_from::<Interpreter311>(l, code_type, head, &mut log) }
    };
    let guard_of = |c: &Chain311, i: usize| c.codes[i][16] ^ c.codes[i][17].rotate_left(32);
    let expected = |c: &Chain311| {
        vec![
            (a, guard_of(c, 0), 10, 0),
            (b, guard_of(c, 1), 4, 0),
            (b, guard_of(c, 1), 6, PY_FRAME_ENTRY),
            (cc, guard_of(c, 2), 8, PY_FRAME_ENTRY),
        ]
    };
    let (first, g1, groups) = capture(&c);
    assert_eq!((first.clone(), groups), (expected(&c), 2));
    // Unchanged: a replay (the same generation), the same frames.
    assert_eq!(capture(&c), (first.clone(), g1, 2));

    // Each change: walked again (a new generation), and seen; then
    // changed back: walked again, the first frames.
    let mut check = |c: &mut Chain311,
                     what: &str,
                     change: &dyn Fn(&mut Chain311),
                     frames: Vec<(usize, u64, u32, u32)>| {
        let saved = (c.codes.clone(), c.frames.clone());
        change(c);
        let (got, g, groups) = capture(c);
        assert_ne!(g, g1, "{what}: replayed");
        assert_eq!(got, frames, "{what}");
        let mut own_log = PyReplayLog::EMPTY;
        // SAFETY: as for `capture`; a walk with a log of its own.
        let fresh = unsafe { capture_from::<Interpreter311>(l, code_type, head, &mut own_log) };
        assert_eq!(
            (&got, groups),
            (&fresh.0, fresh.2),
            "{what}: not what a walk sees"
        );
        assert_eq!(groups, eval_groups_of(&got), "{what}");
        // The log of the changed chain replays it.
        assert_eq!(capture(c), (got, g, groups), "{what}: not replayed");
        let changed_frames = c.frames.clone();
        c.codes.copy_from_slice(&saved.0);
        c.frames.copy_from_slice(&saved.1);
        // On 3.11 a frame's code word changes with its instruction word
        // kept only over the freed memory of the code object it ran
        // (replay compares the instruction word alone): changing back
        // replaces that object too.
        for (now, back) in changed_frames.iter().zip(&c.frames) {
            if now[32 / 8] != back[32 / 8] && now[56 / 8] == back[56 / 8] {
                if let Some(k) = (0..c.codes.len()).find(|&k| c.code(k) == now[32 / 8] as usize) {
                    c.codes[k][16] ^= 0x40;
                }
            }
        }
        let (back, g_back, _) = capture(c);
        assert_ne!(g_back, g, "{what}: changed back, replayed");
        assert_eq!(back, first, "{what}: changed back");
    };
    let ex = expected(&c);
    // The outermost frame's instruction (a word deep in the chain).
    let mut changed = ex.clone();
    changed[3].2 = 12;
    check(&mut c, "instruction", &|c| c.set_frame(4, cc, 12, 0, 0), changed);
    // A `previous` word: the outer B frame left out.
    let changed = vec![ex[0], ex[1], ex[3]];
    check(
        &mut c,
        "previous",
        &|c| {
            let next = c.frame(4);
            c.link(2, next)
        },
        changed,
    );
    // An entry flag cleared, and one set.
    let mut changed = ex.clone();
    changed[2].3 = 0;
    check(
        &mut c,
        "is_entry cleared",
        &|c| c.set_frame(3, b, 6, 0, 0),
        changed,
    );
    let mut changed = ex.clone();
    changed[0].3 = PY_FRAME_ENTRY;
    check(&mut c, "is_entry set", &|c| c.set_frame(0, a, 10, 1, 0), changed);
    // The owner byte: D owned by a generator is never incomplete.
    let changed = vec![ex[0], (d, guard_of(&c, 3), 2, 0), ex[1], ex[2], ex[3]];
    check(&mut c, "owner", &|c| c.set_frame(1, d, 2, 0, 1), changed);
    // Another code object in the innermost frame (A stays alive: only
    // the frame's code word tells), its instruction in E's code; and
    // alone, the instruction left in A's (a frame not started, or an
    // offset out of E: what the walk makes of it, which depends on
    // where E lies). On 3.11 the code word changes alone only when a
    // code object was allocated over A's freed memory, where A's
    // words now differ: replay compares the instruction word alone
    // (`INSTR_NAMES_CODE`), and A's guard tells.
    let mut changed = ex.clone();
    changed[0] = (e, guard_of(&c, 4), 10, 0);
    check(
        &mut c,
        "code and instruction",
        &|c| c.set_frame(0, e, 10, 0, 0),
        changed,
    );
    let mut changed = ex.clone();
    if e > a {
        changed.remove(0);
    } else {
        changed[0] = (e, guard_of(&c, 4), (a - e + 10) as u32, 0);
    }
    check(
        &mut c,
        "code word",
        &|c| {
            c.frames[0][32 / 8] = e as u64;
            c.codes[0][16] ^= 0x40;
        },
        changed,
    );
    // A new code object at A's address (its qualname differs), and at
    // B's, the recursion's (its line table differs), and at C's, the
    // last one checked.
    for (i, what) in [(0, "A replaced"), (1, "B replaced"), (2, "C replaced")] {
        let mut changed = ex.clone();
        let new_guard = {
            let mut n = c.codes[i];
            n[16 + (i == 1) as usize] ^= 0x40;
            n[16] ^ n[17].rotate_left(32)
        };
        for f in changed.iter_mut().filter(|f| f.0 == c.code(i)) {
            f.1 = new_guard;
        }
        check(
            &mut c,
            what,
            &|c| c.codes[i][16 + (i == 1) as usize] ^= 0x40,
            changed,
        );
    }
}

/// A random chain in memory under layout `l`, changed one random way
/// at a time: after each change a capture with the thread's log must
/// return what a walk with a fresh log returns, and with no change it
/// must be a replay (when the last walk was logged).
fn differential<M: FrameModelType>(l: &PyLayout, seed: u64, rounds: usize) -> (usize, usize) {
    static CODE_TYPE_OBJECT: u64 = 0;
    static OTHER_TYPE_OBJECT: u64 = 0;
    let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
    let other_type = &OTHER_TYPE_OBJECT as *const u64 as usize;
    let mut state = seed;
    let mut rand = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let code_start = l.code_code_adaptive.unwrap_or(0);
    let first_traceable = l.code_first_traceable.unwrap_or(0);
    let mut codes = vec![[0u64; 40]; CODES];
    let mut frames = vec![[0u64; 12]; 14];
    let code_addr = |codes: &Vec<[u64; 40]>, i: usize| codes[i].as_ptr() as usize;
    let frame_addr = |frames: &Vec<[u64; 12]>, i: usize| frames[i].as_ptr() as usize;
    for (i, c) in codes.iter_mut().enumerate() {
        c[1] = code_type as u64;
        c[128 / 8] = 0x1000 + i as u64;
        c[136 / 8] = 0x2000 + i as u64;
        c[first_traceable / 8] = [0, 0, 2][i % 3];
    }
    // 3.13+: one object that is not a code object, at first.
    if M::SINCE_313 {
        codes[5][1] = other_type as u64;
    }
    let owners: &[u64] = match M::MODEL {
        FrameModel::Interpreter311 => &[0, 0, 0, 1],
        FrameModel::Interpreter314 => &[0, 0, 0, 1, 3, 4],
        _ => &[0, 0, 0, 1, 3],
    };
    // (code index, instruction offset, entry, owner, tag) of a frame
    type Words = (usize, i64, u64, u64, usize);
    let write = |frames: &mut Vec<[u64; 12]>, codes: &Vec<[u64; 40]>, i: usize, w: Words| {
        let (c, offset, entry, owner, tag) = w;
        let code = code_addr(codes, c);
        let base = frames[i].as_mut_ptr() as usize;
        let exe = if tag == 3 { 0x7003 } else { code | tag };
        let instr = (code + code_start) as i64 + offset;
        // SAFETY: offsets of the layout, all inside the 96-byte frame
        // (`frames[i]`), written as the interpreter would.
        unsafe {
            ((base + l.frame_code) as *mut usize).write_unaligned(exe);
            ((base + l.frame_instr) as *mut i64).write_unaligned(instr);
            if let Some(at) = l.frame_is_entry {
                ((base + at) as *mut u8).write(entry as u8);
            }
            ((base + l.frame_owner.unwrap_or(0)) as *mut u8).write(owner as u8);
        }
    };
    let link = |frames: &mut Vec<[u64; 12]>, chain: &[usize]| {
        for (k, &i) in chain.iter().enumerate() {
            let next = chain.get(k + 1).map_or(0, |&j| frames[j].as_ptr() as usize);
            let base = frames[i].as_mut_ptr() as usize;
            // SAFETY: `previous` at the layout's offset, inside the 96-byte
            // frame `frames[i]`, written as the interpreter would.
            unsafe { ((base + l.frame_back) as *mut usize).write_unaligned(next) };
        }
    };
    let random_words = |rand: &mut dyn FnMut(u64) -> u64| -> Words {
        let tag = if M::SINCE_314 {
            // borrowed (1) or owned references, rarely a tagged int (3)
            if rand(24) == 0 {
                3
            } else {
                rand(2) as usize
            }
        } else {
            0
        };
        (
            rand(CODES as u64) as usize,
            rand(24) as i64 - 4,
            u64::from(M::IS_311 && rand(3) == 0),
            owners[rand(owners.len() as u64) as usize],
            tag,
        )
    };
    let mut words: Vec<Words> = (0..frames.len()).map(|_| random_words(&mut rand)).collect();
    // Recursions: runs of one code object.
    let new_chain = |rand: &mut dyn FnMut(u64) -> u64| {
        let mut pool: Vec<usize> = (0..14).collect();
        let len = 1 + rand(12) as usize;
        (0..len)
            .map(|_| pool.remove(rand(pool.len() as u64) as usize))
            .collect::<Vec<_>>()
    };
    let mut chain = new_chain(&mut rand);
    for (i, &w) in words.iter().enumerate() {
        write(&mut frames, &codes, i, w);
    }
    // What the frames hold now.
    let mut written = words.clone();
    link(&mut frames, &chain);
    let mut log = PyReplayLog::EMPTY;
    let mut last_generation = 0;
    let mut replays = 0;
    let patches = PATCHES.with(|c| c.get());
    // Guard words given to new code objects, never repeated.
    let mut fresh = 1u64 << 40;
    for round in 0..rounds {
        // One change, or two (the innermost frame's and another).
        let change = rand(14);
        let also = if change >= 2 && rand(2) == 0 {
            2 + rand(12)
        } else {
            change
        };
        for change in [change, also].into_iter().take(1 + usize::from(also != change)) {
            match change {
                0 | 1 => {}
                2 => {
                    let i = chain[rand(chain.len() as u64) as usize];
                    words[i].1 = rand(24) as i64 - 4;
                }
                3 => {
                    let i = chain[rand(chain.len() as u64) as usize];
                    let old = words[i].0;
                    words[i].0 = rand(CODES as u64) as usize;
                    if rand(2) == 0 {
                        // the same code object as the frame after it or
                        // before it: a recursion
                        let k = chain.iter().position(|&f| f == i).unwrap_or(0);
                        let j = if rand(2) == 0 {
                            chain.get(k + 1)
                        } else {
                            k.checked_sub(1).map(|k| &chain[k])
                        };
                        if let Some(&j) = j {
                            words[i].0 = words[j].0;
                        }
                    }
                    if rand(2) == 0 {
                        // the code word alone: the instruction word kept
                        words[i].1 += code_addr(&codes, old) as i64 - code_addr(&codes, words[i].0) as i64;
                    }
                }
                4 => {
                    let i = chain[rand(chain.len() as u64) as usize];
                    words[i].2 ^= u64::from(M::IS_311);
                    words[i].3 = owners[rand(owners.len() as u64) as usize];
                }
                5 => {
                    // A new code object at an old one's address: its
                    // guard differs, and maybe its first traceable one.
                    let c = rand(CODES as u64) as usize;
                    // (A value never used before: two changes in a round
                    // must not cancel, leaving a new object with the old
                    // guard, which replay takes for the old object.)
                    fresh += 1;
                    codes[c][16 + rand(2) as usize] = fresh;
                    if rand(2) == 0 {
                        codes[c][first_traceable / 8] = rand(3);
                    }
                }
                6 => chain = new_chain(&mut rand),
                10 => {
                    // Other innermost frames over the same outer ones: a
                    // call from another line, deeper or less deep.
                    let k = rand(chain.len() as u64) as usize;
                    let mut inner: Vec<usize> = (0..14).filter(|f| !chain.contains(f)).collect();
                    inner.truncate(rand(3) as usize);
                    for &f in &inner {
                        words[f] = random_words(&mut rand);
                    }
                    chain.splice(..k, inner);
                    if chain.is_empty() {
                        chain = new_chain(&mut rand);
                    }
                }
                11..=13 => {
                    // The innermost frame at another line, or running
                    // another code object (a loop that allocates from two
                    // lines or calls in turn).
                    let i = chain[0];
                    if rand(2) == 0 {
                        words[i].1 = rand(24) as i64 - 4;
                    } else {
                        words[i].0 = rand(CODES as u64) as usize;
                    }
                }
                7 => {
                    let k = rand(chain.len() as u64) as usize;
                    if chain.len() > 1 && rand(2) == 0 {
                        chain.remove(k);
                    } else if let Some(f) = (0..14).find(|f| !chain.contains(f)) {
                        chain.insert(k, f);
                    }
                }
                8 => {
                    let i = chain[rand(chain.len() as u64) as usize];
                    words[i] = random_words(&mut rand);
                }
                9 => {
                    // 3.13+: a new object at an old one's address, a code
                    // object where none was or none where one was (the
                    // guard, the identity replay relies on, differs:
                    // `guard`).
                    if M::SINCE_313 {
                        let c = rand(CODES as u64) as usize;
                        fresh += 1;
                        codes[c][16] = fresh;
                        codes[c][1] = if codes[c][1] == code_type as u64 {
                            other_type as u64
                        } else {
                            code_type as u64
                        };
                    }
                }
                _ => unreachable!(),
            }
        }
        if M::INSTR_NAMES_CODE {
            // On 3.11 and 3.12 the instruction word points into the code
            // object the frame runs: a frame whose code word changed with
            // its instruction word kept runs an object allocated over the
            // old one's freed memory, whose words then differ (replay
            // compares the instruction word alone, and leaves this to the
            // old object's guard).
            for (w, then) in words.iter().zip(&written) {
                let now = (w.0, code_addr(&codes, w.0) as i64 + w.1);
                let old = (then.0, code_addr(&codes, then.0) as i64 + then.1);
                if now.0 != old.0 && now.1 == old.1 {
                    fresh += 1;
                    codes[old.0][16] = fresh;
                }
            }
        }
        for (i, &w) in words.iter().enumerate() {
            write(&mut frames, &codes, i, w);
        }
        written.clone_from(&words);
        link(&mut frames, &chain);
        let head = frame_addr(&frames, chain[0]);
        let was_logged = log.visited > 0;
        // Mostly room for all frames; sometimes not (the walk stops
        // where `out` is full).
        let out_len = if rand(4) == 0 { 1 + rand(12) as usize } else { 16 };
        // SAFETY: every address in the chain is in `frames` or `codes`,
        // alive; tagged ints end the walk.
        let got = unsafe { capture_within::<M>(l, code_type, head, &mut log, out_len) };
        let mut own_log = PyReplayLog::EMPTY;
        // SAFETY: the same chain: every address in it is in `frames` or
        // `codes`, alive; tagged ints end the walk.
        let fresh = unsafe { capture_within::<M>(l, code_type, head, &mut own_log, out_len) };
        assert_eq!(
            (&got.0, got.2),
            (&fresh.0, fresh.2),
            "round {round}, change {change}"
        );
        assert!(
            got.0.iter().all(|f| f.3 & !PY_FRAME_ENTRY == 0),
            "flags: {:?}",
            got.0
        );
        if change <= 1 && was_logged && out_len == 16 {
            assert_eq!(got.1, last_generation, "round {round}: unchanged, not replayed");
            replays += 1;
        }
        last_generation = got.1;
    }
    (replays, PATCHES.with(|c| c.get()) - patches)
}

/// Runs `differential` over SEEDS seeds and checks that replays and
/// patched heads came (that the test tests them, not only walks).
fn differential_seeds<M: FrameModelType>(l: &PyLayout) {
    let rounds = 500;
    let (mut replays, mut patches) = (0, 0);
    for seed in 1..=SEEDS {
        let (r, p) = differential::<M>(l, seed * 0x9e37_79b9_7f4a_7c15, rounds);
        replays += r;
        patches += p;
    }
    let runs = SEEDS as usize * rounds;
    assert!(replays > runs / 20, "only {replays} replays in {runs} rounds");
    assert!(
        patches > runs / 100,
        "only {patches} heads patched in {runs} rounds"
    );
}

/// Seeds of each model's differential test (about 1 s in all).
const SEEDS: u64 = 3000;
/// Code objects of the differential test's chains.
const CODES: usize = 12;

#[test]
fn replay_returns_what_a_walk_returns_on_random_3_11_chains() {
    differential_seeds::<Interpreter311>(&PY311);
}

#[test]
fn replay_returns_what_a_walk_returns_on_random_3_12_chains() {
    differential_seeds::<Interpreter312>(&crate::capture::python_layouts::PY312);
}

#[test]
fn replay_returns_what_a_walk_returns_on_random_3_14_chains() {
    let l = PyLayout {
        minor: 14,
        frames: FrameModel::Interpreter314,
        executable_tag_mask: 3,
        frame_owner: Some(74),
        owner_c_entry: Some(3),
        code_code_adaptive: Some(208),
        code_first_traceable: Some(192),
        ..crate::capture::python_layouts::PY313
    };
    differential_seeds::<Interpreter314>(&l);
}

fn eval_groups_of(frames: &[(usize, u64, u32, u32)]) -> usize {
    frames.iter().filter(|f| f.3 & PY_FRAME_ENTRY != 0).count()
}

/// 3.13+: an executable that is not a code object is skipped; one that
/// has become a code object since (a new object at the address) is a
/// frame of the next capture.
#[test]
fn a_3_14_replay_sees_an_executable_become_a_code_object() {
    let l = PyLayout {
        minor: 14,
        frames: FrameModel::Interpreter314,
        executable_tag_mask: 3,
        frame_owner: Some(74),
        code_code_adaptive: Some(208),
        code_first_traceable: Some(192),
        ..crate::capture::python_layouts::PY313
    };
    static CODE_TYPE_OBJECT: u64 = 0;
    static OTHER_TYPE_OBJECT: u64 = 0;
    let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
    let other_type = &OTHER_TYPE_OBJECT as *const u64 as usize;
    let mut objects = vec![[0u64; 40]; 2];
    for (i, o) in objects.iter_mut().enumerate() {
        o[1] = code_type as u64;
        o[128 / 8] = 0x1000 + i as u64;
        o[136 / 8] = 0x2000 + i as u64;
    }
    objects[1][1] = other_type as u64; // not a code object (yet)
    let obj = |objects: &Vec<[u64; 40]>, i: usize| objects[i].as_ptr() as usize;
    let (a, x) = (obj(&objects, 0), obj(&objects, 1));
    let mut frames = vec![[0u64; 11]; 3];
    let frame = |frames: &Vec<[u64; 11]>, i: usize| frames[i].as_ptr() as usize;
    // (executable, instruction offset, owner): A; X; the entry frame
    let chain = [(a, 4, 0u64), (x, 2, 0), (0x5000 | 1, 0, 3)];
    for (i, &(exe, offset, owner)) in chain.iter().enumerate() {
        let next = if i + 1 < chain.len() {
            frame(&frames, i + 1)
        } else {
            0
        };
        let f = &mut frames[i];
        f[0] = exe as u64;
        f[1] = next as u64;
        f[56 / 8] = ((exe & !3) + 208 + offset) as u64;
        f[72 / 8] = owner << 16;
    }
    let mut log = PyReplayLog::EMPTY;
    let head = frame(&frames, 0);
    let mut capture = |objects: &Vec<[u64; 40]>| {
        let _ = objects;
        // SAFETY: every address is in `objects` or `frames`, alive.
        unsafe { capture_from::<Interpreter314>(&l, code_type, head, &mut log) }
    };
    let (first, g1, groups) = capture(&objects);
    assert_eq!(first.iter().map(|f| (f.0, f.2)).collect::<Vec<_>>(), [(a, 4)]);
    assert_eq!(groups, 1);
    assert_eq!(capture(&objects), (first, g1, 1));
    objects[1][1] = code_type as u64;
    let (now, g2, groups) = capture(&objects);
    assert_ne!(g2, g1);
    assert_eq!(
        now.iter().map(|f| (f.0, f.2)).collect::<Vec<_>>(),
        [(a, 4), (x, 2)]
    );
    assert_eq!(groups, 1);
}

/// The group count is the last capture's, 0 after one that returned no
/// frames without walking (`forget`) and after an empty chain.
#[test]
fn the_group_count_is_the_last_captures() {
    let l = &PY311;
    static CODE_TYPE_OBJECT: u64 = 0;
    let code_type = &CODE_TYPE_OBJECT as *const u64 as usize;
    let mut c = Chain311::new(1, 3, code_type);
    let a = c.code(0);
    // three frames of A, each entered from C: three groups
    for i in 0..3 {
        c.set_frame(i, a, 2 * i, 1, 0);
        let next = if i < 2 { c.frame(i + 1) } else { 0 };
        c.link(i, next);
    }
    let mut log = PyReplayLog::EMPTY;
    // SAFETY: every address is in `c`, alive.
    let (_, g1, groups) = unsafe { capture_from::<Interpreter311>(l, code_type, c.frame(0), &mut log) };
    assert_eq!(groups, 3);
    // SAFETY: the same chain, every address in `c`, alive.
    let (_, again, _) = unsafe { capture_from::<Interpreter311>(l, code_type, c.frame(0), &mut log) };
    assert_eq!(again, g1);
    assert_eq!(log.eval_groups(), 3);
    // Another head: walked, not replayed.
    // SAFETY: a frame of the same chain, every address in `c`, alive.
    let (_, g2, groups) = unsafe { capture_from::<Interpreter311>(l, code_type, c.frame(1), &mut log) };
    assert_ne!(g2, g1);
    assert_eq!(groups, 2);
    log.forget();
    assert_eq!(log.eval_groups(), 0);
    // SAFETY: the same chain, every address in `c`, alive: walked again
    // (the log was forgotten).
    let (_, g3, groups) = unsafe { capture_from::<Interpreter311>(l, code_type, c.frame(1), &mut log) };
    assert_ne!(g3, g2);
    assert_eq!(groups, 2);
    // SAFETY: no chain.
    let none = unsafe { capture_from::<Interpreter311>(l, code_type, 0, &mut log) };
    assert_eq!(none, (vec![], g3 + 1, 0));
}
