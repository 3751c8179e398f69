//! When a capture looks through a thread's other replay logs, and which
//! log a new walk takes.
//!
//! Both walks keep the logs of a thread's last call paths: the native
//! unwinder's (`unwind/replay_log.rs`) and the Python frame walk's
//! (`python/replay_log.rs`). A capture that does not replay the last log
//! tries the others before it walks. Where that rarely finds one (more
//! paths in turn than logs, or a fresh stack every time) the look costs
//! about what a found log saves, so the thread stops looking for a while:
//! [`Looks`] decides, the same way for both.

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

/// The least recently used log other than `keep` (`used`: when each was
/// last replayed or written): where a new walk goes.
#[inline(always)]
pub fn least_recently_used(used: &[u64], keep: usize) -> usize {
    let mut v = (keep + 1) % used.len();
    for (i, &u) in used.iter().enumerate() {
        if i != keep && u < used[v] {
            v = i;
        }
    }
    v
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
        assert_eq!(least_recently_used(&[5, 1, 7, 1], 0), 1);
        assert_eq!(least_recently_used(&[0, 9, 9, 9], 0), 1);
        assert_eq!(least_recently_used(&[3, 9, 2, 9], 2), 0);
    }
}
