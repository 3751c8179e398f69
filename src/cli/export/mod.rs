//! Reports in the formats of the viewers people already use:
//! pprof (`go tool pprof`, Grafana Pyroscope, OpenTelemetry profiles),
//! Chrome trace / Perfetto JSON, PyTorch's memory snapshot pickle
//! (`torch.cuda._memory_viz`, pytorch.org/memory_viz) and speedscope.
//!
//! Every exporter takes the reports of the processes shown (one report,
//! the newest dump of each process of a directory, or a merged report
//! file), never a merge of them: each process stays its own rank, host
//! and pid in the export (pprof labels, trace process tracks).
//! The strings in these files are data for another program, not text
//! for a terminal: they are written as the report holds them, each
//! format quoting them its own way.

pub mod pickle;
pub mod pprof;
pub mod speedscope;
pub mod torch_snapshot;
pub mod trace;

use cudaleak_core::report::{MergedFrame, Report};
use std::path::PathBuf;

/// One process's report and the file it came from.
pub type Process = (PathBuf, Report);

/// A frame as the viewers name it: function, file, line. A native frame
/// without a function is `module+0xOFFSET`, what addr2line takes.
pub struct FrameName {
    pub name: String,
    pub file: Option<String>,
    pub line: Option<i64>,
}

pub fn frame_name(f: &MergedFrame) -> FrameName {
    match f {
        MergedFrame::Native(n) => {
            let name = match (&n.function, &n.module, &n.offset) {
                (Some(func), _, _) => func.clone(),
                (None, Some(m), Some(off)) => format!("{}+{off}", basename(m)),
                (None, Some(m), None) => format!("{} {}", basename(m), n.address),
                (None, None, _) => n.address.clone(),
            };
            FrameName {
                name,
                file: n.file.clone(),
                line: n.line,
            }
        }
        MergedFrame::Python(p) => FrameName {
            name: p.function.clone(),
            file: Some(p.file.clone()),
            line: p.line,
        },
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A report `cudaleak merge --format json` made from several: its pid,
/// rank and host are not one process's.
pub fn is_merged(r: &Report) -> bool {
    !r.merged_from.is_empty()
}

/// How a process is named in a viewer: `rank 3 (host, pid 1234)`.
/// A process's name in an export (a track, a profile, a comment); an
/// incomplete report says so in it (CONTRACT.md, "Incomplete reports"),
/// the first thing each export shows.
pub fn process_label(r: &Report) -> String {
    let label = if is_merged(r) {
        format!("merged report of {} files", r.merged_from.len())
    } else {
        let host = r.hostname.as_deref().unwrap_or("?");
        match r.rank {
            Some(rank) => format!("rank {rank} ({host}, pid {})", r.pid),
            None => format!("{host}, pid {}", r.pid),
        }
    };
    match r.incomplete_shards {
        0 => label,
        n => format!("{label}, INCOMPLETE: {n} part(s) of the live map not read"),
    }
}

/// `--top N`: each process's N largest leak groups, the rest as one group
/// named `[K other groups]` (one frame), so that totals stay the report's,
/// as folded output does.
pub fn keep_top(processes: &mut [Process], n: usize) {
    use cudaleak_core::report::{saturating_sum, Group, NativeFrame};
    for (_, r) in processes.iter_mut() {
        if r.leaks.len() <= n {
            continue;
        }
        let rest = r.leaks.split_off(n);
        let Some(first) = rest.first() else { continue };
        let mut g = Group::new(
            saturating_sum(rest.iter().map(|g| g.blocks)),
            saturating_sum(rest.iter().map(|g| g.bytes)),
            &first.api,
            first.kind(),
            Vec::new(),
            Vec::new(),
        );
        g.merged_stack = vec![MergedFrame::Native(NativeFrame {
            address: "0x0".into(),
            function: Some(format!(
                "[{}]",
                cudaleak_core::base::units::count(rest.len() as u64, "other group")
            )),
            ..Default::default()
        })];
        r.leaks.push(g);
    }
}

/// Writes `format` of `processes` to stdout.
/// `dumps`: every dump of the processes' files, for the trace's marks.
/// `full`: every frame of each stack in pprof and speedscope
/// (`--full-stacks`), else the frames the text report shows.
pub fn print(
    format: crate::Format,
    processes: &[Process],
    dumps: &[trace::Dump],
    full: bool,
) -> super::CliResult {
    use crate::Format;
    use std::io::Write;
    let binary = matches!(format, Format::Pprof | Format::TorchSnapshot);
    // SAFETY: isatty only reads the descriptor's type.
    if binary && unsafe { libc::isatty(1) } == 1 {
        // As gzip does: binary data on a terminal is noise, and can
        // carry escape sequences.
        return Err("binary output not written to a terminal; redirect it to a file (> leaks.pb.gz)".into());
    }
    let bytes = match format {
        Format::Pprof => pprof::pprof(processes, full),
        Format::TorchSnapshot => torch_snapshot::snapshot(processes),
        Format::Trace => json_line(&trace::trace(processes, dumps))?,
        Format::Speedscope => json_line(&speedscope::speedscope(processes, full))?,
        _ => return Err("not an export format".into()),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)
        .and_then(|_| out.flush())
        .map_err(|e| format!("cannot write the export: {e}"))?;
    Ok(0)
}

fn json_line(v: &serde_json::Value) -> Result<Vec<u8>, String> {
    let mut s = serde_json::to_vec(v).map_err(|e| e.to_string())?;
    s.push(b'\n');
    Ok(s)
}
