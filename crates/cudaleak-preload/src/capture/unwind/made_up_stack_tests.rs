//! Splices of made-up stacks: words in a buffer, unwound by rules given for
//! made-up return addresses.

use super::cache::remember_rule;
use super::replay::SPLICES;
use super::rules::{Rule, KIND_RSP, RBP_SAVED};
use super::*;
use crate::capture::looks::{LogChoice, GUESSES};

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
        // SAFETY: the full walk wrote the first `m` entries.
        let full: Vec<u64> = full[..m].iter().map(|v| unsafe { v.assume_init() }).collect();
        assert_eq!(full, want, "round {round}: the full walk ({frames:?})");
        assert_eq!(
            spliced, want,
            "round {round}: the splice ({frames:?}, room {room}, stop {after})"
        );
        near_full += usize::from(shared.last().len > 150);
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
    let full =
        |mem: &[usize], first: usize, rbp: usize| capture(&mut Box::new(ReplayLog::EMPTY), mem, first, rbp);
    // Old: two frame-pointer frames with allocas, then 94 plain ones:
    // 191 reads.
    const REST: usize = 94;
    let mut shared = Box::new(ReplayLog::EMPTY);
    let mut old = vec![(5, 2), (5, 2)];
    old.extend([(5, 0); REST]);
    let rbp = lay(&mut mem, &old);
    capture(&mut shared, &mem, 5, rbp);
    assert_eq!(shared.last().len, 191);
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
        // SAFETY: the full walk wrote the first `m` entries.
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

/// Call paths taken in turn, as a training step's ops take theirs: the
/// same depth and stack pointer, six inner frames that depend on the
/// path, 20 outer ones alike. With no more paths than the thread keeps
/// logs, every path replays from its own log after the first round, and
/// again soon after the outer frames change (the program enters another
/// loop); with more, looks through the logs that find nothing stay few.
/// Every capture gives what a full walk gives.
#[test]
fn call_paths_in_turn_replay_from_their_own_logs() {
    const INNER: usize = 6;
    const OUTER: usize = 20;
    const WORDS: usize = 2 * (INNER + OUTER + 1);
    // Functions 0..12 by level and bit, 12 the outer frames', 13 and 14
    // the outermost (two callers of the loop). Addresses of this test's
    // own: the rule cache keeps the first rule given for an address.
    let site = |n: usize| 0x4000_0000_0000usize + n * 0x40 + 0x10;
    let ret = |n: usize| site(n) + 1;
    let rule = Rule {
        cfa_offset: 16,
        rbp_offset: 0,
        kind: KIND_RSP,
        ra_offset: -8,
    };
    let mut mem = vec![0usize; WORDS].into_boxed_slice();
    let base = mem.as_mut_ptr() as usize;
    let bounds = (base, base + 8 * WORDS);
    let mut fresh = Box::new(ReplayLog::EMPTY);
    // One capture of `path` under `caller`, checked against a full walk
    // and the frames laid out: whether it walked.
    let mut capture = |log: &mut ReplayLog, path: usize, caller: usize| -> bool {
        let mut frames: Vec<usize> = (0..INNER).map(|l| 2 * l + (path >> l & 1)).collect();
        frames.extend([12; OUTER]);
        frames.push(caller);
        for (k, _) in frames.iter().enumerate() {
            mem[2 * k] = 0x7777_0000 + k; // a word no rule reads
            mem[2 * k + 1] = frames.get(k + 1).map_or(0, |&g| ret(g));
        }
        // (again each time: the rule cache is shared with the tests
        // running beside this one)
        for f in 0..15 {
            remember_rule(site(f) as u64, rule);
        }
        let start = [site(frames[0]), base, 0];
        let want: Vec<u64> = frames[1..].iter().map(|&f| ret(f) as u64).collect();
        let walks = log.walks;
        let mut out = [MaybeUninit::uninit(); 64];
        let n = from_log(log, start, bounds, (0, 0), EvalStop::default(), &mut out);
        // SAFETY: the capture wrote the first `n` entries.
        let got: Vec<u64> = out[..n].iter().map(|v| unsafe { v.assume_init() }).collect();
        fresh.forget();
        let mut full = [MaybeUninit::uninit(); 64];
        let m = from_log(&mut fresh, start, bounds, (0, 0), EvalStop::default(), &mut full);
        // SAFETY: the full walk wrote the first `m` entries.
        let full: Vec<u64> = full[..m].iter().map(|v| unsafe { v.assume_init() }).collect();
        assert_eq!(full, want, "path {path}: the full walk");
        assert_eq!(got, want, "path {path} under {caller}");
        log.walks != walks
    };
    // 12 paths: a round of walks, then replays only.
    let mut log = Box::new(ReplayLog::EMPTY);
    let walked = |log: &mut ReplayLog,
                  capture: &mut dyn FnMut(&mut ReplayLog, usize, usize) -> bool,
                  caller: usize| { (0..12).filter(|&p| capture(log, p, caller)).count() };
    // (each path's generation, as its walk gave it)
    let walked_into: Vec<u64> = (0..12)
        .map(|p| {
            assert!(capture(&mut log, p, 13), "path {p}: the first capture walks");
            log.generation
        })
        .collect();
    GUESSES.with(|g| g.set((0, 0)));
    for round in 0..3 {
        for (p, &generation) in walked_into.iter().enumerate() {
            assert!(!capture(&mut log, p, 13), "round {round}, path {p}: a replay");
            assert_eq!(
                log.generation, generation,
                "round {round}, path {p}: its walk's generation"
            );
        }
    }
    // Each replays the guess, the log that followed the last one, but the
    // first after the walks (path 11's log had no follower yet).
    assert_eq!(GUESSES.with(|g| g.get()), (35, 0), "guesses replayed, not");
    // Another caller: every log is stale. A round of walks (a window
    // that finds nothing, then a short skip), and replays again soon.
    let rounds: Vec<usize> = (0..6).map(|_| walked(&mut log, &mut capture, 14)).collect();
    assert!(
        rounds[0] == 12 && rounds[3..] == [0, 0, 0],
        "walks per round: {rounds:?}"
    );
    // 40 paths, more than the logs: a path's log is often gone when it
    // comes round again. Looking through the logs must pay for itself: a
    // look that finds nothing costs about what a splice does.
    let mut log = Box::new(ReplayLog::EMPTY);
    let (mut looked, mut replayed) = (0, 0);
    for _ in 0..100 {
        for p in 0..40 {
            looked += usize::from(log.choice.looking());
            replayed += usize::from(!capture(&mut log, p, 13));
        }
    }
    // Looks pay for themselves, roughly: those in vain are not many more
    // than those that found a log (each of which saved a splice).
    let vain = looked - replayed;
    assert!(
        vain < replayed + 400,
        "of 4,000 captures, {looked} looked through the logs, {vain} in vain"
    );
    // 64 paths, twice the logs: a path's log is mostly gone when it
    // comes round again, and the thread soon looks for few captures.
    let mut log = Box::new(ReplayLog::EMPTY);
    let mut looked = 0;
    for _ in 0..64 {
        for p in 0..64 {
            looked += usize::from(log.choice.looking());
            capture(&mut log, p, 13);
        }
    }
    assert!(
        looked < 400,
        "of 4,096 captures, {looked} looked through the logs"
    );
}

/// The empty logs are all zero bits: a thread's buffers are allocated
/// zeroed and the logs are not written before use (`capture/mod.rs`).
#[test]
fn empty_logs_are_all_zero_bits() {
    let log = Box::new(ReplayLog::EMPTY);
    // SAFETY: a plain allocation of the type's layout.
    let zeroed =
        unsafe { std::alloc::alloc_zeroed(std::alloc::Layout::new::<ReplayLog>()) }.cast::<ReplayLog>();
    assert!(!zeroed.is_null());
    // SAFETY: the fields are integers, bools and arrays of them, for
    // which all-zero bits are valid values (read below as the constant's).
    let z = unsafe { &*zeroed };
    assert_eq!((z.walks, z.generation), (log.walks, log.generation));
    assert_eq!((z.choice, log.choice), (LogChoice::ZERO, LogChoice::ZERO));
    assert_eq!(z.generations, log.generations);
    for (a, b) in z
        .logs
        .iter()
        .chain([&z.scratch])
        .zip(log.logs.iter().chain([&log.scratch]))
    {
        assert_eq!(
            (
                a.len,
                a.outputs,
                a.steps,
                a.room,
                a.stop_after,
                a.fp_used,
                a.capped,
                a.start
            ),
            (
                b.len,
                b.outputs,
                b.steps,
                b.room,
                b.stop_after,
                b.fp_used,
                b.capped,
                b.start
            )
        );
    }
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(zeroed.cast(), std::alloc::Layout::new::<ReplayLog>()) };
}
