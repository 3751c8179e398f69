//! `cudaleak`: run a command under libcudaleak.so and work with its reports.
//!
//! Exit statuses (CONTRACT.md, "Command line"): `run` exits with the
//! command's own status (128 + N when a signal N killed it), or 23 with
//! `--fail-on-leak` when the command exited 0 but left unsuppressed leaks
//! (24 when a process that used CUDA wrote no final report);
//! every subcommand exits 2 on bad input, with one line on stderr.

mod cli;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cudaleak",
    version,
    about = "Find CUDA memory that was never released, with native and Python stacks"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// LeakSanitizer-style text
    Text,
    /// a report that validates against the schema
    Json,
    /// collapsed stacks for flamegraph tools, weighted by bytes
    Folded,
    /// one self-contained HTML page: timeline, flame graph, leak table
    Html,
    /// an interactive flame graph (SVG), weighted by bytes
    Svg,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND and everything it starts under the library, then summarize their reports
    Run(cli::run::RunArgs),
    /// Render reports (files or directories); several are merged into one view
    Report {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// groups shown (text) or kept (json, folded)
        #[arg(long)]
        top: Option<usize>,
    },
    /// Growth between two reports, stack by stack (also across processes)
    Diff {
        old: PathBuf,
        new: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        #[arg(long)]
        top: Option<usize>,
    },
    /// One view over all ranks and processes of a distributed run
    Merge {
        dir: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        #[arg(long)]
        top: Option<usize>,
    },
    /// Ask a running process for a live dump and wait for its report
    Dump {
        pid: i32,
        /// the process's report directory (default: its CUDALEAK_DIR, or its working directory)
        #[arg(long)]
        dir: Option<PathBuf>,
        /// seconds to wait for the report
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
    /// Run a leaking demo program on the bundled simulated CUDA driver
    Demo {
        /// where the report goes (default: a new temporary directory)
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// List the environment variables the library reads
    Env,
    /// Print the path of libcudaleak.so, for LD_PRELOAD=$(cudaleak lib) COMMAND
    Lib,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !matches!(args.command, Command::Run(_)) {
        // Stop quietly when the reader goes away, as Unix tools do:
        // `cudaleak report --format json | head -1` panicked with "failed
        // printing to stdout: Broken pipe" and exit 101 (issue 12). `run`
        // keeps SIGPIPE ignored: it must live to pass on the command's
        // status, and writes its own lines without panicking.
        // SAFETY: setting a disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match args.command {
        Command::Run(a) => cli::run::run(a),
        Command::Report { paths, format, top } => cli::reports::report(&paths, format, top),
        Command::Diff {
            old,
            new,
            format,
            top,
        } => cli::reports::diff(&old, &new, format, top),
        Command::Merge { dir, format, top } => cli::reports::merge(&dir, format, top),
        Command::Dump { pid, dir, timeout } => cli::dump::dump(pid, dir, timeout),
        Command::Demo { dir } => cli::demo::demo(dir),
        Command::Env => cli::env(),
        Command::Lib => cli::lib(),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("cudaleak: {e}");
            ExitCode::from(2)
        }
    }
}
