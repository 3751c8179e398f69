//! `cudaleak`: run a command under libcudaleak.so and work with its reports.
//!
//! Exit statuses (CONTRACT.md, "Command line"): `run` exits with the
//! command's own status (128 + N when a signal N killed it), or 23 with
//! `--fail-on-leak` when the command exited 0 but left unsuppressed leaks
//! (24 when a process that used CUDA wrote no final report), or 25 when a
//! process's peak is over its budget (`--max-peak`, `--peak-baseline`);
//! every subcommand exits 2 on bad input, with one line on stderr.
//!
//! A library with a thin `main` (src/main.rs), so that the command's own
//! unit tests run with `cargo test` and clippy reads them.

pub mod cli;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cudaleak",
    version,
    about = "Find CUDA memory that was never released, with native and Python stacks"
)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// LeakSanitizer-style text
    Text,
    /// JSON: a report that validates against schema/report.schema.json
    Json,
    /// collapsed stacks for flamegraph tools, weighted by bytes
    Folded,
    /// one self-contained HTML page: timeline, flame graph, leak table
    Html,
    /// an interactive flame graph (SVG), weighted by bytes
    Svg,
    /// pprof (gzip-compressed profile.proto) for `go tool pprof`, Pyroscope, OpenTelemetry:
    /// leaked bytes and blocks (and the peak) per stack, labelled by rank, host, pid, memory kind
    Pprof,
    /// Chrome trace / Perfetto JSON: live bytes per call site as counter tracks, dumps, the
    /// peak and out-of-memory moments as instant events, one process track per rank
    Trace,
    /// PyTorch memory snapshot (pickle) for `python -m torch.cuda._memory_viz` and
    /// pytorch.org/memory_viz: leaked device blocks with their frames
    TorchSnapshot,
    /// speedscope JSON: the leaks flame graph as a sampled profile weighted by bytes
    Speedscope,
}

impl Format {
    /// The formats that `cudaleak::cli::export` writes.
    pub fn is_export(self) -> bool {
        matches!(
            self,
            Format::Pprof | Format::Trace | Format::TorchSnapshot | Format::Speedscope
        )
    }
}

/// The formats `diff` renders: not the exports, which describe one
/// report each (its `--help` listed them, and it refused them).
fn diff_formats() -> impl clap::builder::TypedValueParser<Value = Format> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        Format::value_variants()
            .iter()
            .filter(|f| !f.is_export())
            .filter_map(ValueEnum::to_possible_value),
    )
    .map(|name| {
        Format::from_str(&name, false)
            .ok()
            .filter(|f| !f.is_export())
            .unwrap_or(Format::Text)
    })
}

/// How reports are read and rendered: shared by report, diff and merge.
#[derive(clap::Args, Clone)]
pub struct ViewArgs {
    /// Output format
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Show the N largest groups (text, folded: the rest in one line; json: `omitted`);
    /// totals always cover every group
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Show every frame, including program start, the Python interpreter's own frames, foreign-call
    /// machinery (libffi, ctypes) and the test runner's frames (pytest, pluggy), which text, the
    /// pictures, pprof and speedscope hide by default (JSON keeps them all)
    #[arg(long)]
    pub full_stacks: bool,
    /// Symbolize every frame again from its module offset and build-id (by default only frames
    /// without a function name are), from the module on disk when its build-id matches or from a
    /// debug file found by build-id
    #[arg(long, conflicts_with = "no_symbolize")]
    pub symbolize: bool,
    /// Do not symbolize frames after the fact; show them as recorded
    #[arg(long)]
    pub no_symbolize: bool,
    /// Root of a build-id debug tree (DIR/.build-id/xx/yyyy.debug); may be repeated;
    /// default /usr/lib/debug
    #[arg(long, value_name = "DIR")]
    pub debug_root: Vec<PathBuf>,
    /// A directory holding several runs (different run ids): merge them all instead of showing the
    /// latest run only
    #[arg(long)]
    pub all_runs: bool,
}

const EXIT_0_2: &str = "Exit status: 0 when rendered; 2 on bad input (a missing, unreadable, truncated, foreign or newer-version file), with one line `cudaleak: ...` on stderr.";
const DIFF_AFTER_HELP: &str = "The exports (pprof, trace, torch-snapshot, speedscope) describe one report each: export both sides with `cudaleak report --format FORMAT` (pprof compares them: `go tool pprof -diff_base OLD.pb.gz NEW.pb.gz`).

Exit status: 0 when rendered; 25 with --peak and --peak-tolerance when a peak grew beyond the tolerance; 2 on bad input (a missing, unreadable, truncated, foreign or newer-version file), with one line `cudaleak: ...` on stderr.";

#[derive(Subcommand)]
pub enum Command {
    /// Run COMMAND and everything it starts under the library, then summarize their reports
    #[command(
        after_help = "Exit status: COMMAND's own status (128+N when signal N killed it). With --fail-on-leak, \
when COMMAND exited 0: 24 when a process that made CUDA calls wrote no final report, else 23 when an exit \
report has unsuppressed leaks, else 0. With --max-peak or --peak-baseline, when COMMAND exited 0: 24 when a \
process wrote no final report, else 23 (with --fail-on-leak) for leaks, else 25 when a process's peak is over \
its budget. 2 on bad input (an unreadable suppressions file or baseline, a bad size, no library found, a \
command that cannot be run)."
    )]
    Run(Box<cli::run::RunArgs>),
    /// Render reports (files or directories), or a timeline (*.timeline.json); several processes are merged
    #[command(after_help = EXIT_0_2)]
    Report {
        /// Report files (cudaleak.*.json), timeline files (*.timeline.json), or directories searched for
        /// reports; a directory with several runs shows the latest run unless --all-runs
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Growth between two reports, stack by stack (also across processes)
    #[command(after_help = DIFF_AFTER_HELP, mut_arg("format", |a| a.value_parser(diff_formats())))]
    Diff {
        /// The older report (a file or a directory of reports)
        old: PathBuf,
        /// The newer report (a file or a directory of reports)
        new: PathBuf,
        /// Compare peaks instead of leaks: each process's peak before and after (matched by rank, else by
        /// command line) and the call sites whose bytes at the peak changed most (text or json)
        #[arg(long)]
        peak: bool,
        /// With --peak: exit 25 when a peak grew beyond this (5%, 64MiB; repeat the flag for both, the
        /// larger allowance wins); without it diff --peak exits 0
        #[arg(long, value_name = "TOLERANCE", requires = "peak")]
        peak_tolerance: Vec<String>,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// One view over all ranks and processes of a distributed run
    #[command(after_help = EXIT_0_2)]
    Merge {
        /// Directory holding the reports of every rank (searched recursively)
        dir: PathBuf,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Ask a running process for a live dump and wait for its report
    #[command(
        after_help = "Exit status: 0 when the report arrived and was printed; 2 when the process does not \
exist or cannot be read, its report directory is unsafe, a request file cannot be made, or no report \
came before the timeout."
    )]
    Dump {
        /// Process id of a process running under the library
        pid: i32,
        /// The process's report directory (default: its CUDALEAK_DIR, or its working directory)
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Seconds to wait for the report (`inf` waits up to a year)
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
    /// A running process's GPU memory by call site, refreshed every second (without PID: the processes
    /// of this user that run under cudaleak). In a terminal: q quits, arrows select a call site, Enter
    /// opens its stack, s or 1-6 sort, r reverses, d writes a live report now
    #[command(
        after_help = "Exit status: 0 when the view was shown (or the processes listed); 2 when the process \
does not exist, is another user's, does not run the library, or published no view before the timeout."
    )]
    Top {
        /// Process id of a process running under the library
        pid: Option<i32>,
        /// Print one view and exit (the changes are over the last second)
        #[arg(long)]
        once: bool,
        /// With --once: text or json
        #[arg(long, value_parser = ["text", "json"], default_value = "text")]
        format: String,
        /// Seconds to wait for a view
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
        /// Seconds between reads of the view (the library publishes once a second)
        #[arg(long, default_value_t = 1.0)]
        refresh: f64,
    },
    /// Run a leaking demo program on the bundled simulated CUDA driver
    #[command(after_help = "Exit status: 0 when the demo ran; 2 when it could not be set up.")]
    Demo {
        /// Where the report goes (default: a new temporary directory)
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// List the environment variables the library reads
    #[command(after_help = "Exit status: 0.")]
    Env,
    /// Print the path of libcudaleak.so, for LD_PRELOAD=$(cudaleak lib) COMMAND
    Lib,
    /// Remove the metrics files (CUDALEAK_METRICS_DIR) of this host's processes that are gone: what a
    /// process killed before its last write left behind
    #[command(after_help = "Exit status: 0; 2 when DIR cannot be read.")]
    MetricsClean {
        /// The metrics directory
        dir: PathBuf,
    },
}

/// The command: parses the arguments and runs the subcommand.
pub fn main() -> ExitCode {
    let args = Args::parse();
    if !matches!(args.command, Command::Run(_)) {
        // Stop quietly when the reader goes away, as Unix tools do:
        // `cudaleak report --format json | head -1` panicked with "failed
        // printing to stdout: Broken pipe" and exit 101. `run`
        // keeps SIGPIPE ignored: it must live to pass on the command's
        // status, and writes its own lines without panicking.
        // SAFETY: setting a disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match args.command {
        Command::Run(a) => cli::run::run(*a),
        Command::Report { paths, view } => cli::reports::report(&paths, &view),
        Command::Diff {
            old,
            new,
            peak: true,
            peak_tolerance,
            view,
        } => match view.format {
            Format::Text | Format::Json => {
                cli::budgets::diff_peaks(&old, &new, &peak_tolerance, view.format == Format::Json)
            }
            _ => Err("diff --peak: --format text or json".into()),
        },
        Command::Diff { old, new, view, .. } => cli::reports::diff(&old, &new, &view),
        Command::Merge { dir, view } => cli::reports::merge(&dir, &view),
        Command::Dump { pid, dir, timeout } => cli::dump::dump(pid, dir, timeout),
        Command::Demo { dir } => cli::demo::demo(dir),
        Command::Env => cli::env(),
        Command::Lib => cli::lib(),
        Command::MetricsClean { dir } => cli::metrics_clean(&dir),
        Command::Top {
            pid,
            once,
            format,
            timeout,
            refresh,
        } => cli::top::top(pid, once, format == "json", timeout, refresh),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("cudaleak: {e}");
            ExitCode::from(2)
        }
    }
}
