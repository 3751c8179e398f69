//! When a capture looks through a thread's other replay logs, and which
//! log a new walk takes.
//!
//! Both walks keep the logs of a thread's last call paths: the native
//! unwinder's (`unwind/replay_log.rs`) and the Python frame walk's
//! (`python/replay_log.rs`). A capture that does not replay the last log
//! tries the others before it walks. Where that rarely finds one (more
//! paths in turn than logs, or a fresh stack every time) the look costs
//! about what a found log saves, so the thread stops looking for a while:
//! [`Looks`] decides, the same way for both, and [`LogChoice`] keeps
//! which log each capture used.
//!
//! A training step's ops allocate from their call paths in the same
//! order every step, so the log a capture needs is most often the one
//! that followed the last log the time before: [`LogChoice::guess`]. A
//! capture tries it first, before the last log and the look; [`Looks`]
//! decides only for the captures that replay neither.

/// When fewer than [`MIN_HITS`] of [`WINDOW`] looks through the other logs
/// replayed one, the next captures do not look, first [`FIRST_SKIP`] of
/// them, twice as many after each such window, up to [`MAX_SKIP`], and
/// half as many again after a window that finds enough: a program with
/// 1,024 call paths in turn pays for 16 looks in about 1,000 captures, not
/// for every one. A window of paths new to the logs (a program that enters
/// another loop: every log has the old caller's frames) finds nothing
/// while it writes their logs, and the short first skip lets the next
/// window find them.
pub const WINDOW: u32 = 16;
pub const MIN_HITS: u32 = 8;
pub const FIRST_SKIP: u32 = 16;
pub const MAX_SKIP: u32 = 1024;

/// The looks of one thread's logs: the current window's count, and how
/// many captures are left that do not look. All zero bits is the start
/// (a thread's buffers are allocated zeroed, and not written before use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Looks {
    /// looks in the current window of [`WINDOW`], and how many of them
    /// found a log that replayed
    looks: u32,
    hits: u32,
    /// captures left that do not look
    skip: u32,
    /// how many the next window that finds too little skips: doubled by
    /// each such window, from [`FIRST_SKIP`] to [`MAX_SKIP`], and halved
    /// by a window that finds enough
    skip_next: u32,
}

impl Looks {
    #[cfg(test)]
    pub const ZERO: Looks = Looks {
        looks: 0,
        hits: 0,
        skip: 0,
        skip_next: 0,
    };

    /// Whether this capture looks through the other logs (else it walks
    /// from the last one in place, as a thread with one log would).
    #[inline(always)]
    pub fn look_now(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// Whether the next capture would look (tests).
    #[cfg(test)]
    pub fn looking(&self) -> bool {
        self.skip == 0
    }

    /// Counts a look, and whether it found a log; `tick` (the thread's
    /// captures so far) lengthens a skip by up to 15: a skip of a fixed
    /// length can bring every window back to the same paths of a cycle,
    /// and a window to the paths the last one wrote, which then looks
    /// good.
    #[inline(always)]
    pub fn note(&mut self, hit: bool, tick: u64) {
        self.looks += 1;
        self.hits += hit as u32;
        if self.looks == WINDOW {
            let next = self.skip_next.max(FIRST_SKIP);
            if self.hits < MIN_HITS {
                self.skip = next + (tick % 16) as u32;
                self.skip_next = (next * 2).min(MAX_SKIP);
            } else {
                self.skip_next = next / 2;
            }
            (self.looks, self.hits) = (0, 0);
        }
    }
}

/// Which of a thread's `N` logs the last capture used, when each was last
/// used, and the looks: the bookkeeping of both walks' logs, apart from
/// what the logs hold. All zero bits is the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogChoice<const N: usize> {
    /// when each log was last replayed or written (`tick`): a new walk
    /// takes the place of the least recently used
    used: [u64; N],
    /// the log the last capture replayed or wrote
    current: usize,
    /// captures that did not replay the last log
    tick: u64,
    looks: Looks,
    /// for each log, the log that the last capture to leave it for
    /// another took ([`LogChoice::guess`]), as that log's number XOR its
    /// own; zero (the start, and after a wrong guess): itself
    next: [u8; N],
}

impl<const N: usize> LogChoice<N> {
    #[cfg(test)]
    pub const ZERO: LogChoice<N> = LogChoice {
        used: [0; N],
        current: 0,
        tick: 0,
        looks: Looks::ZERO,
        next: [0; N],
    };

    /// Log numbers fit the `next` bytes.
    const FITS: () = assert!(N <= 256);

    /// The log the last capture replayed or wrote (the modulo lets the
    /// compiler drop the bounds checks of its uses).
    #[inline(always)]
    pub fn last(&self) -> usize {
        self.current % N
    }

    /// A capture that did not replay the last log: counted, and the last
    /// log's use noted (a replay of it notes nothing: its use is noted
    /// when another takes its place). Returns the last log.
    #[inline(always)]
    pub fn missed(&mut self) -> usize {
        let last = self.last();
        self.tick += 1;
        self.used[last] = self.tick;
        last
    }

    /// Whether this capture looks through the other logs ([`Looks`]).
    #[inline(always)]
    pub fn look_now(&mut self) -> bool {
        self.looks.look_now()
    }

    /// The look found log `i`, which the capture replays.
    #[inline(always)]
    pub fn found(&mut self, i: usize) {
        self.take(i);
        self.looks.note(true, self.tick);
    }

    /// The look found none; `all_kept`: no log was empty (while logs
    /// are still empty, the thread's paths are being learnt, and a look
    /// that finds nothing does not count yet).
    #[inline(always)]
    pub fn found_none(&mut self, all_kept: bool) {
        if all_kept {
            self.looks.note(false, self.tick);
        }
    }

    /// The capture walks into log `i`, or replays it: the log that
    /// follows the last one, for the next guess.
    #[inline(always)]
    pub fn take(&mut self, i: usize) {
        let () = Self::FITS;
        self.next[self.last()] = ((i % N) ^ self.last()) as u8;
        self.current = i % N;
        self.used[i % N] = self.tick;
    }

    /// The log that the last capture to leave the last log for another
    /// took: in a cycle of call paths (a training step's ops), the one
    /// this capture most likely replays. The last log itself before any
    /// capture left it, and after a wrong guess. A repeat of the last log
    /// does not change it (that would cost the repeating path a store), so
    /// a path taken twice in a row within a cycle (A, A, B) guesses B
    /// after its first A, wrongly, once a cycle: one failed replay. And
    /// with more paths in a cycle than logs, most guesses fail (the log
    /// guessed was taken by another path meanwhile), each at a replay's
    /// first check that fails.
    #[inline(always)]
    pub fn guess(&self) -> usize {
        (self.next[self.last()] as usize ^ self.last()) % N
    }

    /// Whether the guess is another log than the last.
    #[inline(always)]
    pub fn guessing(&self) -> bool {
        self.next[self.last()] != 0
    }

    /// The capture replayed the guess, another log than the last.
    #[inline(always)]
    pub fn followed(&mut self, guess: usize) {
        self.missed();
        self.take(guess);
    }

    /// The guess (another log than the last) did not replay: the next
    /// capture after this log guesses the last log again, unless this
    /// one takes another.
    #[inline(always)]
    pub fn guessed_wrong(&mut self) {
        self.next[self.last()] = 0;
    }

    /// The least recently used log other than the last: where a new walk
    /// goes.
    #[inline(always)]
    pub fn victim(&self) -> usize {
        let keep = self.last();
        let mut v = (keep + 1) % N;
        for (i, &u) in self.used.iter().enumerate() {
            if i != keep && u < self.used[v] {
                v = i;
            }
        }
        v
    }

    /// Whether the next capture would look (tests).
    #[cfg(test)]
    pub fn looking(&self) -> bool {
        self.looks.looking()
    }
}

#[cfg(test)]
thread_local! {
    /// Replays of the guess on this thread, and guesses that did not
    /// replay, by either walk (tests: that cycles of paths replay their
    /// guesses).
    pub static GUESSES: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Counts a guess that replayed or not (tests).
#[inline(always)]
pub fn count_guess(_replayed: bool) {
    #[cfg(test)]
    GUESSES.with(|g| {
        let (hits, misses) = g.get();
        g.set((hits + usize::from(_replayed), misses + usize::from(!_replayed)));
    });
}

/// Log `from` and log `into` (another) of `logs` at once: a new walk
/// starts from a copy of the last log.
#[inline(always)]
pub fn pair_mut<T>(logs: &mut [T], from: usize, into: usize) -> (&T, &mut T) {
    if from < into {
        let (a, b) = logs.split_at_mut(into);
        (&a[from], &mut b[0])
    } else {
        let (a, b) = logs.split_at_mut(from);
        (&b[0], &mut a[into])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_that_finds_little_skips_longer_each_time_and_one_that_finds_enough_halves_it() {
        let mut l = Looks::ZERO;
        let window = |l: &mut Looks, hits: u32, tick: u64| {
            for i in 0..WINDOW {
                assert!(l.look_now());
                l.note(i < hits, tick);
            }
        };
        let skipped = |l: &mut Looks| {
            let mut n = 0;
            while !l.look_now() {
                n += 1;
            }
            n
        };
        window(&mut l, MIN_HITS - 1, 0);
        assert_eq!(skipped(&mut l), FIRST_SKIP);
        // (the one look `skipped` took counts in the next window)
        l.note(false, 0);
        for i in 1..WINDOW {
            l.note(i < 1, 3);
        }
        assert_eq!(skipped(&mut l), 2 * FIRST_SKIP + 3);
        for _ in 0..10 {
            l.note(false, 0);
            for _ in 1..WINDOW {
                l.note(false, 0);
            }
            let s = skipped(&mut l);
            assert!(s <= MAX_SKIP, "{s}");
        }
        // A window that finds enough looks on, and halves the next skip.
        l.note(true, 0);
        for _ in 1..WINDOW {
            l.note(true, 0);
        }
        assert!(l.looking());
        l.note(false, 0);
        for _ in 1..WINDOW {
            l.note(false, 0);
        }
        assert_eq!(skipped(&mut l), MAX_SKIP / 2);
    }

    #[test]
    fn the_least_recently_used_log_is_never_the_one_kept() {
        let choice = |used: [u64; 4], current: usize| LogChoice {
            used,
            current,
            tick: 0,
            looks: Looks::ZERO,
            next: [0; 4],
        };
        assert_eq!(choice([5, 1, 7, 1], 0).victim(), 1);
        assert_eq!(choice([0, 9, 9, 9], 0).victim(), 1);
        assert_eq!(choice([3, 9, 2, 9], 2).victim(), 0);
    }

    #[test]
    fn the_guess_is_the_log_that_followed_the_last_one_the_time_before() {
        let mut c = LogChoice::<4>::ZERO;
        assert_eq!(c.guess(), 0, "a path that repeats: the last log");
        // Paths in a cycle: 0, 2, 3, then 0 again.
        for i in [2, 3, 0] {
            c.missed();
            c.take(i);
        }
        assert_eq!(c.guess(), 2);
        c.followed(2);
        assert_eq!((c.last(), c.guess()), (2, 3));
        // A wrong guess: the last log is guessed next, until another follows it.
        c.guessed_wrong();
        assert_eq!(c.guess(), 2);
        c.missed();
        c.take(1);
        assert_eq!(c.guess(), 1, "a log no capture left yet: itself");
        assert!(!c.guessing());
        c.missed();
        c.take(3);
        assert_eq!(c.last(), 3);
        c.missed();
        c.take(1);
        assert_eq!((c.guess(), c.guessing()), (3, true));
        c.missed();
        c.take(2);
        assert_eq!(
            (c.last(), c.guess()),
            (2, 1),
            "the guess after 2 is now 1 (the cycle's second turn)"
        );
    }
}
