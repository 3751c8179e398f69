//! Every environment variable cudaleak reads, declared once (as
//! sanitizer_common declares its flags in one .inc file): name, default,
//! meaning, and how a bad value falls back. The preload library reads them
//! once at start; `cudaleak run` sets some of them; docs are written from
//! [`FLAGS`].

use std::path::PathBuf;
use std::time::Duration;

pub struct Flag {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

pub const FLAGS: &[Flag] = &[
    Flag {
        name: "CUDALEAK_DIR",
        default: "the working directory",
        help: "directory for report files, created if missing",
    },
    Flag {
        name: "CUDALEAK_SIGNAL",
        default: "USR1",
        help: "signal that triggers a live dump: a name (USR1, SIGUSR2) or a number; none disables",
    },
    Flag {
        name: "CUDALEAK_EXITCODE",
        default: "0",
        help: "when not 0, a process that exited 0 but whose exit report has unsuppressed leaks exits with this status",
    },
    Flag {
        name: "CUDALEAK_SUPPRESSIONS",
        default: "none",
        help: "suppressions file in LeakSanitizer's format (leak:PATTERN)",
    },
    Flag {
        name: "CUDALEAK_PYTHON",
        default: "1",
        help: "0 turns Python stack capture off",
    },
    Flag {
        name: "CUDALEAK_PYTHON_OFFSETS",
        default: "0",
        help: "1 reads CPython 3.13's frames through the layout the interpreter publishes (_Py_DebugOffsets) instead of the built-in table; 3.14 and later are always read that way",
    },
    Flag {
        name: "CUDALEAK_DEFAULT_SUPPRESSIONS",
        default: "1",
        help: "0 turns off the built-in suppressions for one-time allocations of CUDA libraries",
    },
    Flag {
        name: "CUDALEAK_STACK_DEPTH",
        default: "64",
        help: "native frames recorded per allocation (at most 128); 0 turns native stacks off",
    },
    Flag {
        name: "CUDALEAK_INTERVAL",
        default: "0",
        help: "seconds between periodic live dumps (trigger \"interval\"); 0 disables; also writes a timeline file",
    },
    Flag {
        name: "CUDALEAK_INTERVAL_KEEP",
        default: "10",
        help: "interval reports kept per process (older ones are deleted; the timeline keeps the history); 0 keeps all",
    },
    Flag {
        name: "CUDALEAK_UNWINDER",
        default: "fast",
        help: "native stack capture: fast (cached CFI rules per return address) or dwarf (the backtrace crate, slower)",
    },
    Flag {
        name: "CUDALEAK_TIMELINE",
        default: "0 (1 under `cudaleak run`)",
        help: "sample live memory by call site for the reports' timeline: 0 off, 1 every 100ms, or a period (250ms, 2s)",
    },
    Flag {
        name: "CUDALEAK_MAX_GROUPS",
        default: "1000",
        help: "leak groups (and suppressed, and growth groups) written per report, largest first; the rest are counted in totals.groups_left_out",
    },
    Flag {
        name: "CUDALEAK_MAX_STACKS",
        default: "4194303",
        help: "distinct stacks stored per process (at most 67108863); blocks from new stacks past it have none, counted in totals.stacks_dropped",
    },
    Flag {
        name: "CUDALEAK_OOM_REPORTS",
        default: "3",
        help: "out-of-memory reports (trigger \"oom\") written per process, at most 1000; failures within 1 s of a report's count in it; 0 writes none",
    },
    Flag {
        name: "CUDALEAK_TRACE",
        default: "0",
        help: "keep the last N allocation events (alloc, free, out of memory) in a ring and write them into every report's allocation_trace, at most 1048576; 0 off",
    },
    Flag {
        name: "CUDALEAK_REPORT_MODE",
        default: "0600",
        help: "permission bits of report and timeline files, in octal (0640, 0644 to let others read them); the owner always reads and writes",
    },
    Flag {
        name: "CUDALEAK_LOG",
        default: "none (stderr)",
        help: "file the library's warnings and summaries are appended to instead of stderr (created mode 0600 if missing)",
    },
    Flag {
        name: "CUDALEAK_SUMMARY",
        default: "1",
        help: "0 keeps the LeakSanitizer-style summary off stderr at exit (the report file is still written)",
    },
];

pub const MAX_STACK_DEPTH: usize = 128;

/// The longest `CUDALEAK_INTERVAL` taken (about 115 days); longer values
/// are clamped to it, with a warning. `Duration::from_secs_f64` panics past
/// u64 seconds and `Instant` overflows well before that (issue 15: 1e30
/// aborted the program before main, 9.3e18 killed the dump thread).
pub const MAX_INTERVAL_SECS: f64 = 1e7;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwinder {
    Fast,
    Dwarf,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// None: the working directory
    pub dir: Option<PathBuf>,
    /// None: live dumps by signal disabled
    pub signal: Option<i32>,
    pub exitcode: i32,
    pub suppressions: Option<PathBuf>,
    pub python: bool,
    /// CUDALEAK_PYTHON_OFFSETS: the frame layout from `_Py_DebugOffsets` on 3.13 too
    pub python_offsets: bool,
    pub default_suppressions: bool,
    pub stack_depth: usize,
    pub interval: Option<Duration>,
    pub interval_keep: usize,
    pub unwinder: Unwinder,
    pub summary: bool,
    /// None: no sampled timeline (`CUDALEAK_TIMELINE`)
    pub timeline: Option<Duration>,
    /// groups written per list of a report (CUDALEAK_MAX_GROUPS)
    pub max_groups: usize,
    /// distinct stacks stored (CUDALEAK_MAX_STACKS)
    pub max_stacks: u32,
    /// out-of-memory reports per process (CUDALEAK_OOM_REPORTS); 0: none
    pub oom_reports: u32,
    /// allocation events kept in the ring (CUDALEAK_TRACE); 0: off
    pub trace_events: usize,
    /// permission bits of report files (CUDALEAK_REPORT_MODE)
    pub report_mode: u32,
    /// file for the library's lines instead of stderr (CUDALEAK_LOG)
    pub log: Option<PathBuf>,
}

/// Reports are readable by their owner only unless `CUDALEAK_REPORT_MODE`
/// says otherwise (issue 23: a world-readable marker gave away the run id
/// a forged report needs).
pub const DEFAULT_REPORT_MODE: u32 = 0o600;

pub const DEFAULT_MAX_GROUPS: usize = 1000;
pub const DEFAULT_OOM_REPORTS: u32 = 3;
/// The most `CUDALEAK_OOM_REPORTS` takes: each report holds a copy of the
/// live map in memory until it is written (about a second).
pub const MAX_OOM_REPORTS: u32 = 1000;
/// The most `CUDALEAK_TRACE` keeps: 1 Mi events, 40 MiB of ring (40-byte slots).
pub const MAX_TRACE_EVENTS: usize = 1 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: None,
            signal: Some(libc::SIGUSR1),
            exitcode: 0,
            suppressions: None,
            python: true,
            python_offsets: false,
            default_suppressions: true,
            stack_depth: 64,
            interval: None,
            interval_keep: 10,
            unwinder: Unwinder::Fast,
            summary: true,
            timeline: None,
            max_groups: DEFAULT_MAX_GROUPS,
            max_stacks: crate::depot::DEFAULT_MAX_TRACES,
            oom_reports: DEFAULT_OOM_REPORTS,
            trace_events: 0,
            report_mode: DEFAULT_REPORT_MODE,
            log: None,
        }
    }
}

const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("PWR", libc::SIGPWR),
];

/// Signals a dump may not use: ones that cannot be caught or whose default
/// action the program relies on for faults.
const FORBIDDEN_SIGNALS: &[i32] = &[
    libc::SIGKILL,
    libc::SIGSTOP,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGTRAP,
    libc::SIGCHLD,
    libc::SIGPIPE,
];

/// `USR1`, `SIGUSR1`, `usr1`, `10`, `SIGRTMIN+2`; `Ok(None)` for `none`.
pub fn parse_signal(v: &str) -> Result<Option<i32>, String> {
    let t = v.trim();
    if t.eq_ignore_ascii_case("none") || t.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let upper = t.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    let num = if let Ok(n) = name.parse::<i32>() {
        n
    } else if let Some(off) = name.strip_prefix("RTMIN+") {
        libc::SIGRTMIN() + off.parse::<i32>().map_err(|_| format!("{t:?} is not a signal"))?
    } else if name == "RTMIN" {
        libc::SIGRTMIN()
    } else {
        SIGNALS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .ok_or_else(|| format!("{t:?} is not a signal name or number"))?
    };
    if num <= 0 || num > libc::SIGRTMAX() {
        return Err(format!("{t:?} is not a valid signal number"));
    }
    // glibc keeps the first real-time signals (32 and 33 on Linux) for its
    // threads and timers, below SIGRTMIN; a handler there does nothing
    // useful (issue 15).
    if (libc::SIGRTMAX().min(32)..libc::SIGRTMIN()).contains(&num) {
        return Err(format!(
            "signal {num} is reserved by the C library (real-time signals start at {})",
            libc::SIGRTMIN()
        ));
    }
    if FORBIDDEN_SIGNALS.contains(&num) {
        return Err(format!("signal {t:?} cannot be used for dumps"));
    }
    // A dump replaces the signal's default action: with SIGTERM, SIGHUP,
    // SIGQUIT or SIGALRM the program would survive a signal meant to end
    // it (issue 23). Only user-defined and real-time signals, and those
    // whose default action is to ignore or continue, are taken; SIGINT
    // stays, as CONTRACT.md names it (installed at the first allocation
    // call, after Python's own handler).
    let harmless = [
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGINT,
        libc::SIGURG,
        libc::SIGWINCH,
        libc::SIGCONT,
    ];
    if !harmless.contains(&num) && num < libc::SIGRTMIN() {
        return Err(format!(
            "signal {t:?} would no longer end or stop the program once it dumps; use USR1, USR2 or a real-time signal"
        ));
    }
    Ok(Some(num))
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl Config {
    /// Reads the flags through `get`; each bad value produces one warning
    /// through `warn` (a line starting with "cudaleak:") and its default.
    pub fn from_env(get: impl Fn(&str) -> Option<String>, mut warn: impl FnMut(String)) -> Config {
        let mut c = Config::default();
        let mut bad = |name: &str, value: &str, why: &str, default: &str| {
            warn(format!(
                "cudaleak: ignoring {name}={value:?} ({why}); using the default, {default}"
            ))
        };
        if let Some(v) = get("CUDALEAK_DIR") {
            if v.is_empty() {
                bad("CUDALEAK_DIR", &v, "empty", "the working directory");
            } else {
                c.dir = Some(PathBuf::from(v));
            }
        }
        if let Some(v) = get("CUDALEAK_SIGNAL") {
            match parse_signal(&v) {
                Ok(s) => c.signal = s,
                Err(e) => bad("CUDALEAK_SIGNAL", &v, &e, "USR1"),
            }
        }
        if let Some(v) = get("CUDALEAK_EXITCODE") {
            match v.trim().parse::<i32>() {
                Ok(n) if (0..=255).contains(&n) => c.exitcode = n,
                _ => bad("CUDALEAK_EXITCODE", &v, "not an exit status 0-255", "0"),
            }
        }
        if let Some(v) = get("CUDALEAK_LOG") {
            if v.is_empty() {
                bad("CUDALEAK_LOG", &v, "empty", "stderr");
            } else {
                c.log = Some(PathBuf::from(v));
            }
        }
        if let Some(v) = get("CUDALEAK_SUPPRESSIONS") {
            if !v.is_empty() {
                c.suppressions = Some(PathBuf::from(v));
            }
        }
        for (name, slot, default) in [
            ("CUDALEAK_PYTHON", &mut c.python, "1"),
            ("CUDALEAK_PYTHON_OFFSETS", &mut c.python_offsets, "0"),
            ("CUDALEAK_DEFAULT_SUPPRESSIONS", &mut c.default_suppressions, "1"),
            ("CUDALEAK_SUMMARY", &mut c.summary, "1"),
        ] {
            if let Some(v) = get(name) {
                match parse_bool(&v) {
                    Some(b) => *slot = b,
                    None => bad(name, &v, "expected 0 or 1", default),
                }
            }
        }
        if let Some(v) = get("CUDALEAK_STACK_DEPTH") {
            match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_STACK_DEPTH => c.stack_depth = n,
                _ => bad("CUDALEAK_STACK_DEPTH", &v, "expected 0 to 128", "64"),
            }
        }
        if let Some(v) = get("CUDALEAK_INTERVAL") {
            match v.trim().parse::<f64>() {
                Ok(0.0) => c.interval = None,
                Ok(s) if s.is_finite() && (0.01..=MAX_INTERVAL_SECS).contains(&s) => {
                    c.interval = Some(Duration::from_secs_f64(s))
                }
                Ok(s) if s > MAX_INTERVAL_SECS => {
                    bad(
                        "CUDALEAK_INTERVAL",
                        &v,
                        "more than 10000000 s",
                        "10000000 s (the longest)",
                    );
                    c.interval = Some(Duration::from_secs_f64(MAX_INTERVAL_SECS))
                }
                _ => bad(
                    "CUDALEAK_INTERVAL",
                    &v,
                    "expected seconds, at least 0.01, or 0",
                    "0 (off)",
                ),
            }
        }
        if let Some(v) = get("CUDALEAK_INTERVAL_KEEP") {
            match v.trim().parse::<usize>() {
                Ok(n) => c.interval_keep = n,
                _ => bad("CUDALEAK_INTERVAL_KEEP", &v, "expected a count", "10"),
            }
        }
        if let Some(v) = get("CUDALEAK_TIMELINE") {
            match crate::site_timeline::parse_period(&v) {
                Ok(p) => c.timeline = p,
                Err(e) => bad("CUDALEAK_TIMELINE", &v, &e, "0 (off)"),
            }
        }
        if let Some(v) = get("CUDALEAK_MAX_GROUPS") {
            match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => c.max_groups = n,
                _ => bad("CUDALEAK_MAX_GROUPS", &v, "expected a count, at least 1", "1000"),
            }
        }
        if let Some(v) = get("CUDALEAK_MAX_STACKS") {
            match v.trim().parse::<u32>() {
                Ok(n) if (1..=crate::depot::MAX_TRACES).contains(&n) => c.max_stacks = n,
                _ => bad("CUDALEAK_MAX_STACKS", &v, "expected 1 to 67108863", "4194303"),
            }
        }
        if let Some(v) = get("CUDALEAK_OOM_REPORTS") {
            match v.trim().parse::<u32>() {
                Ok(n) if n <= MAX_OOM_REPORTS => c.oom_reports = n,
                _ => bad("CUDALEAK_OOM_REPORTS", &v, "expected a count, 0 to 1000", "3"),
            }
        }
        if let Some(v) = get("CUDALEAK_TRACE") {
            match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_TRACE_EVENTS => c.trace_events = n,
                _ => bad(
                    "CUDALEAK_TRACE",
                    &v,
                    "expected a count of events, 0 to 1048576",
                    "0",
                ),
            }
        }
        if let Some(v) = get("CUDALEAK_REPORT_MODE") {
            match u32::from_str_radix(v.trim(), 8) {
                Ok(m) if m & !0o666 == 0 && m & 0o600 == 0o600 => c.report_mode = m,
                _ => bad(
                    "CUDALEAK_REPORT_MODE",
                    &v,
                    "expected octal permission bits with the owner's 0600, no execute bits",
                    "0600",
                ),
            }
        }
        if let Some(v) = get("CUDALEAK_UNWINDER") {
            match v.trim() {
                "fast" => c.unwinder = Unwinder::Fast,
                "dwarf" => c.unwinder = Unwinder::Dwarf,
                _ => bad("CUDALEAK_UNWINDER", &v, "expected fast or dwarf", "fast"),
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut warnings = Vec::new();
        let c = Config::from_env(|k| env.get(k).cloned(), |w| warnings.push(w));
        (c, warnings)
    }

    #[test]
    fn defaults_without_environment() {
        let (c, w) = parse(&[]);
        assert_eq!(c, Config::default());
        assert!(w.is_empty());
    }

    #[test]
    fn signals_by_name_number_and_none() {
        assert_eq!(parse_signal("USR2"), Ok(Some(libc::SIGUSR2)));
        assert_eq!(parse_signal("SIGUSR1"), Ok(Some(libc::SIGUSR1)));
        assert_eq!(parse_signal("sigusr1"), Ok(Some(libc::SIGUSR1)));
        assert_eq!(parse_signal("12"), Ok(Some(12)));
        assert_eq!(parse_signal("none"), Ok(None));
        assert_eq!(parse_signal("RTMIN+1"), Ok(Some(libc::SIGRTMIN() + 1)));
        assert!(parse_signal("SEGV").is_err());
        assert!(parse_signal("KILL").is_err());
        assert!(parse_signal("bogus").is_err());
        assert!(parse_signal("999").is_err());
        // glibc's reserved real-time signals (issue 15).
        for reserved in ["32", "33", "SIG32", "RTMIN+-1"] {
            let e = parse_signal(reserved).unwrap_err();
            assert!(e.contains("reserved") || e.contains("not a"), "{reserved}: {e}");
        }
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("-1").is_err());
        assert!(parse_signal("65").is_err());
        assert_eq!(parse_signal("34"), Ok(Some(34)));
        // Signals whose default action ends or stops the program (issue 23).
        for fatal in ["TERM", "HUP", "QUIT", "ALRM", "XCPU", "TTIN", "PROF", "15"] {
            let e = parse_signal(fatal).unwrap_err();
            assert!(e.contains("would no longer end"), "{fatal}: {e}");
        }
        for ok in ["INT", "URG", "WINCH", "RTMIN+3"] {
            assert!(parse_signal(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn huge_intervals_are_clamped_not_a_panic() {
        for v in ["1e30", "9.3e18", "inf", "1e7", "nan", "1e308"] {
            let (c, w) = parse(&[("CUDALEAK_INTERVAL", v)]);
            match v {
                "1e7" => assert!(w.is_empty()),
                _ => assert_eq!(w.len(), 1, "{v}: {w:?}"),
            }
            if let Some(i) = c.interval {
                assert!(i.as_secs_f64() <= MAX_INTERVAL_SECS);
                assert!(std::time::Instant::now().checked_add(i).is_some());
            }
        }
        let (c, _) = parse(&[("CUDALEAK_INTERVAL", "1e30")]);
        assert_eq!(c.interval, Some(Duration::from_secs_f64(MAX_INTERVAL_SECS)));
    }

    #[test]
    fn each_bad_value_warns_once_and_keeps_the_default() {
        let (c, w) = parse(&[
            ("CUDALEAK_SIGNAL", "NOPE"),
            ("CUDALEAK_EXITCODE", "abc"),
            ("CUDALEAK_PYTHON", "maybe"),
            ("CUDALEAK_STACK_DEPTH", "1000"),
            ("CUDALEAK_INTERVAL", "-3"),
            ("CUDALEAK_UNWINDER", "gdb"),
            ("CUDALEAK_OOM_REPORTS", "1001"),
        ]);
        assert_eq!(c, Config::default());
        assert_eq!(w.len(), 7, "{w:#?}");
        assert!(w.iter().all(|l| l.starts_with("cudaleak: ")));
    }

    #[test]
    fn good_values_are_taken() {
        let (c, w) = parse(&[
            ("CUDALEAK_DIR", "/tmp/r"),
            ("CUDALEAK_SIGNAL", "none"),
            ("CUDALEAK_EXITCODE", "23"),
            ("CUDALEAK_PYTHON", "0"),
            ("CUDALEAK_STACK_DEPTH", "0"),
            ("CUDALEAK_INTERVAL", "0.5"),
            ("CUDALEAK_OOM_REPORTS", "0"),
        ]);
        assert!(w.is_empty());
        assert_eq!(c.oom_reports, 0);
        assert_eq!(c.dir, Some(PathBuf::from("/tmp/r")));
        assert_eq!(c.signal, None);
        assert_eq!(c.exitcode, 23);
        assert!(!c.python);
        assert_eq!(c.stack_depth, 0);
        assert_eq!(c.interval, Some(Duration::from_millis(500)));
    }

    /// One bad value of each flag and its warning, word for word: the
    /// texts users and tests match on (issue 27: the table that generates
    /// the parser must keep them).
    #[test]
    fn every_flag_warns_in_its_own_words() {
        let cases: &[(&str, &str, &str)] = &[
            ("CUDALEAK_DIR", "", "(empty); using the default, the working directory"),
            ("CUDALEAK_SIGNAL", "9", "(signal \"9\" cannot be used for dumps); using the default, USR1"),
            ("CUDALEAK_EXITCODE", "256", "(not an exit status 0-255); using the default, 0"),
            ("CUDALEAK_PYTHON", "maybe", "(expected 0 or 1); using the default, 1"),
            ("CUDALEAK_PYTHON_OFFSETS", "2", "(expected 0 or 1); using the default, 0"),
            ("CUDALEAK_DEFAULT_SUPPRESSIONS", "x", "(expected 0 or 1); using the default, 1"),
            ("CUDALEAK_STACK_DEPTH", "129", "(expected 0 to 128); using the default, 64"),
            ("CUDALEAK_INTERVAL", "0.001", "(expected seconds, at least 0.01, or 0); using the default, 0 (off)"),
            ("CUDALEAK_INTERVAL", "2e7", "(more than 10000000 s); using the default, 10000000 s (the longest)"),
            ("CUDALEAK_INTERVAL_KEEP", "-1", "(expected a count); using the default, 10"),
            ("CUDALEAK_UNWINDER", "gdb", "(expected fast or dwarf); using the default, fast"),
            ("CUDALEAK_TIMELINE", "fast", "(expected 0, 1, or a period like 250ms or 2s); using the default, 0 (off)"),
            ("CUDALEAK_MAX_GROUPS", "0", "(expected a count, at least 1); using the default, 1000"),
            ("CUDALEAK_MAX_STACKS", "67108864", "(expected 1 to 67108863); using the default, 4194303"),
            ("CUDALEAK_OOM_REPORTS", "lots", "(expected a count, 0 to 1000); using the default, 3"),
            ("CUDALEAK_TRACE", "1048577", "(expected a count of events, 0 to 1048576); using the default, 0"),
            ("CUDALEAK_REPORT_MODE", "0700", "(expected octal permission bits with the owner's 0600, no execute bits); using the default, 0600"),
            ("CUDALEAK_LOG", "", "(empty); using the default, stderr"),
            ("CUDALEAK_SUMMARY", "no way", "(expected 0 or 1); using the default, 1"),
        ];
        for (name, value, tail) in cases {
            let (_, w) = parse(&[(name, value)]);
            assert_eq!(
                w,
                [format!("cudaleak: ignoring {name}={value:?} {tail}")],
                "{name}"
            );
        }
        // Every flag that can be wrong has its case; CUDALEAK_SUPPRESSIONS
        // takes any path (an empty one: none).
        for f in FLAGS {
            assert!(
                f.name == "CUDALEAK_SUPPRESSIONS" || cases.iter().any(|(n, _, _)| *n == f.name),
                "{} has no case",
                f.name
            );
        }
        let (c, w) = parse(&[("CUDALEAK_SUPPRESSIONS", "")]);
        assert!(w.is_empty() && c.suppressions.is_none());
    }

    #[test]
    fn every_flag_is_parsed_by_from_env() {
        // Only from_env's body: from its signature to the end of its impl,
        // before the tests, whose own literals would match (issue 23).
        let src = include_str!("config.rs");
        let start = src.find("pub fn from_env").unwrap();
        let end = start + src[start..].find("#[cfg(test)]").unwrap();
        let body = &src[start..end];
        // Read means asked of the environment: `get("NAME")`, or a row
        // of the table of booleans read in one loop. A warning that names
        // it does not count.
        for f in FLAGS {
            let read = body.contains(&format!("get(\"{}\")", f.name))
                || body.contains(&format!("(\"{}\", &mut c.", f.name));
            assert!(read, "{} not read", f.name);
        }
    }
}
