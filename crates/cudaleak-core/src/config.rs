//! Every environment variable cudaleak reads, declared once, in one table
//! (the `flags!` invocation below, as sanitizer_common declares its flags
//! in one .inc file): name, field, type, default, the default in words,
//! parser and meaning. The [`Config`] struct, its defaults, its reader
//! ([`Config::from_env`]: one warning and the default for a bad value), the
//! list `cudaleak env` prints ([`FLAGS`]) and the names the command sets
//! ([`var`]) are all made from it (a flag's name and default were
//! written in three places here). The preload library reads them once at
//! start; `cudaleak run` sets some of them.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// One row of the table as `cudaleak env` prints it.
pub struct Flag {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

/// Makes everything a flag needs from the table's rows:
///
/// ```text
/// NAME => field: Type = default value,
///     default "the default in words" [, warning "the default as a warning names it"],
///     parse PARSER,
///     help "what it does, on one line";
/// ```
///
/// `PARSER` turns the variable's text into the field's value, or into a
/// [`Bad`] that says why not: the reader warns once and keeps the default.
/// The words of the default are what `cudaleak env` prints and what the
/// warning says is used, unless `warning` words it for the warning alone.
macro_rules! flags {
    ($(
        $var:ident => $field:ident: $ty:ty = $default:expr,
            default $default_words:literal $(, warning $warning_words:literal)?,
            parse $parse:expr,
            help $help:literal;
    )*) => {
        /// The flags as `cudaleak env` lists them, in the table's order.
        pub const FLAGS: &[Flag] = &[
            $(Flag { name: stringify!($var), default: $default_words, help: $help },)*
        ];

        /// Each flag's variable name, for the code that sets or reads one
        /// on its own (`cudaleak run`, `cudaleak dump`).
        pub mod var {
            $(pub const $var: &str = stringify!($var);)*
        }

        /// The flags' values: the table's defaults, or the environment's.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Config {
            $(
                #[doc = concat!("`", stringify!($var), "` (default ", $default_words, "): ", $help)]
                pub $field: $ty,
            )*
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $($field: $default,)* }
            }
        }

        impl Config {
            /// Reads the flags through `get`, in the table's order; each bad
            /// value produces one warning through `warn` (a line starting
            /// with "cudaleak:") and its default.
            pub fn from_env(
                get: impl Fn(&str) -> Option<String>,
                mut warn: impl FnMut(String),
            ) -> Config {
                let mut c = Config::default();
                $(
                    if let Some(v) = get(stringify!($var)) {
                        read(
                            &mut c.$field,
                            &v,
                            $parse,
                            stringify!($var),
                            first!($($warning_words)? $default_words),
                            &mut warn,
                        );
                    }
                )*
                c
            }
        }
    };
}

/// The first of one or two literals: a row's `warning` words when it has
/// them, else its `default` words.
macro_rules! first {
    ($first:literal $($rest:literal)?) => {
        $first
    };
}

flags! {
    CUDALEAK_DIR => dir: Option<PathBuf> = None,
        default "the working directory",
        parse path,
        help "directory for report files, created if missing";
    CUDALEAK_SIGNAL => signal: Option<i32> = Some(libc::SIGUSR1),
        default "USR1",
        parse |v| Ok(parse_signal(v)?),
        help "signal that triggers a live dump: a name (USR1, SIGUSR2) or a number; none disables";
    CUDALEAK_EXITCODE => exitcode: i32 = 0,
        default "0",
        parse number(0..=255, "not an exit status 0-255"),
        help "when not 0, a process that exited 0 but whose exit report has unsuppressed leaks exits with this status";
    CUDALEAK_SUPPRESSIONS => suppressions: Option<PathBuf> = None,
        default "none",
        // An empty value names no file, without a warning.
        parse |v| Ok((!v.is_empty()).then(|| PathBuf::from(v))),
        help "suppressions file in LeakSanitizer's format (leak:PATTERN)";
    CUDALEAK_PYTHON => python: bool = true,
        default "1",
        parse boolean,
        help "0 turns Python stack capture off";
    CUDALEAK_PYTHON_OFFSETS => python_offsets: bool = false,
        default "0",
        parse boolean,
        help "1 reads CPython 3.13's frames through the layout the interpreter publishes (_Py_DebugOffsets) instead of the built-in table; 3.14 and later are always read that way";
    CUDALEAK_DEFAULT_SUPPRESSIONS => default_suppressions: bool = true,
        default "1",
        parse boolean,
        help "0 turns off the built-in suppressions for one-time allocations of CUDA libraries";
    CUDALEAK_STACK_DEPTH => stack_depth: usize = 64,
        default "64",
        parse number(0..=MAX_STACK_DEPTH, "expected 0 to 128"),
        help "native frames recorded per allocation (at most 128); 0 turns native stacks off";
    CUDALEAK_INTERVAL => interval: Option<Duration> = None,
        default "0", warning "0 (off)",
        parse interval,
        help "seconds between periodic live dumps (trigger \"interval\"); 0 disables; also writes a timeline file";
    CUDALEAK_INTERVAL_KEEP => interval_keep: usize = 10,
        default "10",
        parse number(0..=usize::MAX, "expected a count"),
        help "interval reports kept per process (older ones are deleted; the timeline keeps the history); 0 keeps all";
    CUDALEAK_UNWINDER => unwinder: Unwinder = Unwinder::Fast,
        default "fast",
        parse unwinder,
        help "native stack capture: fast (cached CFI rules per return address) or dwarf (the backtrace crate, slower)";
    CUDALEAK_TIMELINE => timeline: Option<Duration> = None,
        default "0 (1 under `cudaleak run`)", warning "0 (off)",
        parse |v| Ok(crate::timeline::site_timeline::parse_period(v)?),
        help "sample live memory by call site for the reports' timeline: 0 off, 1 every 100ms, or a period (250ms, 2s)";
    CUDALEAK_MAX_GROUPS => max_groups: usize = DEFAULT_MAX_GROUPS,
        default "1000",
        parse number(1..=usize::MAX, "expected a count, at least 1"),
        help "leak groups (and suppressed, and growth groups) written per report, largest first; the rest are counted in totals.groups_left_out";
    CUDALEAK_MAX_STACKS => max_stacks: u32 = crate::record::depot::DEFAULT_MAX_TRACES,
        default "4194303",
        parse number(1..=crate::record::depot::MAX_TRACES, "expected 1 to 67108863"),
        help "distinct stacks stored per process (at most 67108863); blocks from new stacks past it have none, counted in totals.stacks_dropped";
    CUDALEAK_OOM_REPORTS => oom_reports: u32 = DEFAULT_OOM_REPORTS,
        default "3",
        parse number(0..=MAX_OOM_REPORTS, "expected a count, 0 to 1000"),
        help "out-of-memory reports (trigger \"oom\") written per process, at most 1000; failures within 1 s of a report's count in it; 0 writes none";
    CUDALEAK_TRACE => trace_events: usize = 0,
        default "0",
        parse number(0..=MAX_TRACE_EVENTS, "expected a count of events, 0 to 1048576"),
        help "keep the last N allocation events (alloc, free, out of memory) in a ring and write them into every report's allocation_trace, at most 1048576; 0 off";
    CUDALEAK_REPORT_MODE => report_mode: u32 = DEFAULT_REPORT_MODE,
        default "0600",
        parse report_mode,
        help "permission bits of report and timeline files, in octal (0640, 0644 to let others read them); the owner always reads and writes";
    CUDALEAK_LOG => log: Option<PathBuf> = None,
        default "none (stderr)", warning "stderr",
        parse path,
        help "file the library's warnings and summaries are appended to instead of stderr (created mode 0600 if missing)";
    CUDALEAK_METRICS_DIR => metrics_dir: Option<PathBuf> = None,
        default "none (off)", warning "none (off)",
        parse path,
        help "directory for a Prometheus textfile per process (cudaleak.HOST[.rRANK].PID.prom), rewritten every CUDALEAK_METRICS_INTERVAL, for node_exporter's textfile collector";
    CUDALEAK_METRICS_INTERVAL => metrics_interval: Duration = Duration::from_secs(5),
        default "5",
        parse metrics_interval,
        help "seconds between rewrites of the metrics file, 0.1 to 3600";
    CUDALEAK_METRICS_TOP => metrics_top: usize = 10,
        default "10",
        parse number(0..=1000, "expected a count, 0 to 1000"),
        help "call sites in the metrics file (those holding the most live bytes)";
    CUDALEAK_JOB => job: Option<String> = None,
        default "none (TORCHELASTIC_RUN_ID, else SLURM_JOB_ID)", warning "none",
        parse |v| if v.is_empty() { Err("empty".into()) } else { Ok(Some(v.to_string())) },
        help "the job label of the metrics; without it, torchrun's TORCHELASTIC_RUN_ID or SLURM's SLURM_JOB_ID";
    CUDALEAK_SUMMARY => summary: bool = true,
        default "1",
        parse boolean,
        help "0 keeps the LeakSanitizer-style summary off stderr at exit (the report file is still written)";
}

pub const MAX_STACK_DEPTH: usize = 128;

/// The longest `CUDALEAK_INTERVAL` taken (about 115 days); longer values
/// are clamped to it, with a warning. `Duration::from_secs_f64` panics past
/// u64 seconds and `Instant` overflows well before that (1e30
/// aborted the program before main, 9.3e18 killed the dump thread).
pub const MAX_INTERVAL_SECS: f64 = 1e7;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwinder {
    Fast,
    Dwarf,
}

/// Reports are readable by their owner only unless `CUDALEAK_REPORT_MODE`
/// says otherwise (a world-readable marker gave away the run id
/// a forged report needs).
pub const DEFAULT_REPORT_MODE: u32 = 0o600;

pub const DEFAULT_MAX_GROUPS: usize = 1000;
pub const DEFAULT_OOM_REPORTS: u32 = 3;
/// The most `CUDALEAK_OOM_REPORTS` takes: each report holds a copy of the
/// live map in memory until it is written (about a second).
pub const MAX_OOM_REPORTS: u32 = 1000;
/// The most `CUDALEAK_TRACE` keeps: 1 Mi events, 40 MiB of ring (40-byte slots).
pub const MAX_TRACE_EVENTS: usize = 1 << 20;

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
    // useful.
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
    // it. Only user-defined and real-time signals, and those
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

/// Why a flag's value was refused, and what is used instead: the default,
/// or a value of its own with its words (an interval past the longest is
/// clamped to it).
struct Bad<T> {
    why: String,
    instead: Option<(T, &'static str)>,
}

impl<T> From<String> for Bad<T> {
    fn from(why: String) -> Self {
        Bad { why, instead: None }
    }
}

impl<T> From<&str> for Bad<T> {
    fn from(why: &str) -> Self {
        why.to_string().into()
    }
}

/// One flag's value into its field, or one warning.
fn read<T>(
    field: &mut T,
    value: &str,
    parse: impl Fn(&str) -> Result<T, Bad<T>>,
    name: &str,
    default_words: &str,
    warn: &mut impl FnMut(String),
) {
    match parse(value) {
        Ok(v) => *field = v,
        Err(Bad { why, instead }) => {
            let used = instead.as_ref().map_or(default_words, |(_, words)| words);
            warn(format!(
                "cudaleak: ignoring {name}={value:?} ({why}); using the default, {used}"
            ));
            if let Some((v, _)) = instead {
                *field = v;
            }
        }
    }
}

/// A path; an empty one is refused.
fn path(v: &str) -> Result<Option<PathBuf>, Bad<Option<PathBuf>>> {
    if v.is_empty() {
        Err("empty".into())
    } else {
        Ok(Some(PathBuf::from(v)))
    }
}

fn boolean(v: &str) -> Result<bool, Bad<bool>> {
    parse_bool(v).ok_or_else(|| "expected 0 or 1".into())
}

/// A decimal number within `range`; else `why`.
fn number<T: FromStr + PartialOrd>(
    range: RangeInclusive<T>,
    why: &'static str,
) -> impl Fn(&str) -> Result<T, Bad<T>> {
    move |v| {
        v.trim()
            .parse::<T>()
            .ok()
            .filter(|n| range.contains(n))
            .ok_or_else(|| why.into())
    }
}

/// Seconds, at least 0.01, or 0 (off); past [`MAX_INTERVAL_SECS`] clamped
/// to it, with a warning.
fn interval(v: &str) -> Result<Option<Duration>, Bad<Option<Duration>>> {
    match v.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(s) if s.is_finite() && (0.01..=MAX_INTERVAL_SECS).contains(&s) => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Ok(s) if s > MAX_INTERVAL_SECS => Err(Bad {
            why: "more than 10000000 s".into(),
            instead: Some((
                Some(Duration::from_secs_f64(MAX_INTERVAL_SECS)),
                "10000000 s (the longest)",
            )),
        }),
        _ => Err("expected seconds, at least 0.01, or 0".into()),
    }
}

fn metrics_interval(v: &str) -> Result<Duration, Bad<Duration>> {
    match v.trim().parse::<f64>() {
        Ok(s) if (0.1..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err("expected seconds, 0.1 to 3600".into()),
    }
}

fn unwinder(v: &str) -> Result<Unwinder, Bad<Unwinder>> {
    match v.trim() {
        "fast" => Ok(Unwinder::Fast),
        "dwarf" => Ok(Unwinder::Dwarf),
        _ => Err("expected fast or dwarf".into()),
    }
}

/// Octal permission bits that keep the owner's 0600 and give no execute
/// bit.
fn report_mode(v: &str) -> Result<u32, Bad<u32>> {
    match u32::from_str_radix(v.trim(), 8) {
        Ok(m) if m & !0o666 == 0 && m & 0o600 == 0o600 => Ok(m),
        _ => Err("expected octal permission bits with the owner's 0600, no execute bits".into()),
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
        // glibc's reserved real-time signals.
        for reserved in ["32", "33", "SIG32", "RTMIN+-1"] {
            let e = parse_signal(reserved).unwrap_err();
            assert!(e.contains("reserved") || e.contains("not a"), "{reserved}: {e}");
        }
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("-1").is_err());
        assert!(parse_signal("65").is_err());
        assert_eq!(parse_signal("34"), Ok(Some(34)));
        // Signals whose default action ends or stops the program.
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
    /// texts users and tests match on (the table that generates
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
            ("CUDALEAK_METRICS_DIR", "", "(empty); using the default, none (off)"),
            ("CUDALEAK_METRICS_INTERVAL", "0", "(expected seconds, 0.1 to 3600); using the default, 5"),
            ("CUDALEAK_METRICS_TOP", "1001", "(expected a count, 0 to 1000); using the default, 10"),
            ("CUDALEAK_JOB", "", "(empty); using the default, none"),
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

    /// The first word of a default as written: "0" of "`0` (off)", "none"
    /// of "none: stderr".
    fn first_word(words: &str) -> String {
        words
            .trim_start_matches('`')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect()
    }

    /// CONTRACT.md's table of variables and the flags' table name the same
    /// variables, with the same defaults (the flags are declared
    /// once; the contract must not drift from them).
    #[test]
    fn the_contract_lists_every_flag_and_no_other() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../CONTRACT.md");
        let contract = std::fs::read_to_string(path).unwrap();
        let section = contract
            .split("\n## ")
            .find(|s| s.starts_with("Environment"))
            .expect("CONTRACT.md has an Environment section");
        let rows: Vec<(String, String)> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `CUDALEAK_"))
            .map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                let name = format!("CUDALEAK_{}", cells[0].trim_end_matches('`'));
                let default = cells.last().unwrap().trim_end_matches(" |").to_string();
                (name, default)
            })
            .collect();
        assert!(rows.len() >= 10, "{rows:?}");
        for (name, default) in &rows {
            let flag = FLAGS.iter().find(|f| f.name == name);
            let flag =
                flag.unwrap_or_else(|| panic!("CONTRACT.md documents {name}, the table has no such flag"));
            assert_eq!(
                first_word(default),
                first_word(flag.default),
                "{name}: CONTRACT.md says the default is {default:?}, the table {:?}",
                flag.default
            );
        }
        for f in FLAGS {
            assert!(
                rows.iter().any(|(n, _)| n == f.name),
                "{} is a flag that CONTRACT.md's Environment table does not document",
                f.name
            );
        }
    }

    /// The default in words, given as the value, is the default value: the
    /// words `cudaleak env` prints cannot drift from the value the table
    /// sets. (The flags whose default is to be unset have none to give.)
    #[test]
    fn the_default_words_read_as_the_default_value() {
        for f in FLAGS {
            if [
                var::CUDALEAK_DIR,
                var::CUDALEAK_SUPPRESSIONS,
                var::CUDALEAK_LOG,
                var::CUDALEAK_METRICS_DIR,
                var::CUDALEAK_JOB,
            ]
            .contains(&f.name)
            {
                continue;
            }
            let word = first_word(f.default);
            let (c, w) = parse(&[(f.name, word.as_str())]);
            assert!(w.is_empty(), "{}: {w:?}", f.name);
            assert_eq!(c, Config::default(), "{}={word}", f.name);
        }
    }
}
