//! A process's figures in the Prometheus text format (`CUDALEAK_METRICS_DIR`):
//! one file per process, `cudaleak.<host>[.r<rank>].<pid>.prom`, which
//! node_exporter's textfile collector serves as it finds it. The library's
//! own thread rewrites it every `CUDALEAK_METRICS_INTERVAL`; this module only
//! turns figures into text and names files, so it is tested without a
//! process.
//!
//! Cardinality stays bounded whatever the program does: the call sites
//! written are the N holding the most live bytes (`CUDALEAK_METRICS_TOP`),
//! each named by the reports' group label and a short id that stays the
//! same across processes and runs while the code does (a hash of
//! [`crate::budget::site_key`] and the frames' lines).

use crate::budget::site_key;
use crate::report::render::{display_frames, label_groups, picture_frames};
use crate::report::{Group, MergedFrame, Report};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Labels every series carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    /// `CUDALEAK_JOB`, else `TORCHELASTIC_RUN_ID`, else `SLURM_JOB_ID`
    /// ([`job_of`])
    pub job: Option<String>,
    pub rank: Option<i64>,
    pub local_rank: Option<i64>,
    pub host: String,
    pub pid: i64,
}

/// The job label from the environment: `CUDALEAK_JOB`, else torchrun's
/// `TORCHELASTIC_RUN_ID` (but for `none`, its default without
/// `--rdzv-id`, which every such job shares), else SLURM's `SLURM_JOB_ID`.
pub fn job_of(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let given = |name: &str| env(name).filter(|v| !v.is_empty());
    given("CUDALEAK_JOB")
        .or_else(|| given("TORCHELASTIC_RUN_ID").filter(|v| v != "none"))
        .or_else(|| given("SLURM_JOB_ID"))
}

/// One call site's figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// the group label the reports give it (`cudaMalloc (device memory)
    /// at step train.py:12`)
    pub label: String,
    /// 12 hex digits of a hash of its symbolized stack
    pub site_id: String,
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// its bytes when the process's peak was reached
    pub peak_bytes: u64,
    /// its stack as the reports' text shows it, a frame a line, the
    /// innermost first (the live view opens it; the file leaves it out)
    pub stack: Vec<String>,
}

/// What a process holds on one device, read from its live blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceLive {
    /// the device's ordinal; `host` for pinned host memory, which no GPU
    /// holds; `unknown` for memory whose device was not known
    pub device: String,
    pub live_bytes: u64,
    pub live_blocks: u64,
}

/// What one write of the file says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub labels: Labels,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub peak_bytes: u64,
    pub failed_allocations: u64,
    pub oom_events: u64,
    /// unsuppressed leaked bytes of the exit report; only in the last write
    pub leaked_bytes: Option<u64>,
    pub sites: Vec<Site>,
    /// what each device holds, every device held on so far (0 when it
    /// holds nothing now); empty where not known (a report's figures)
    pub devices: Vec<DeviceLive>,
}

/// What makes two groups one call site here: the budgets' key (API,
/// memory, each shown frame by function and file) and the frames' lines,
/// which the budgets leave out so that an edit elsewhere in a file keeps
/// a site's budget, but which tell two calls in one function apart.
fn key(g: &Group) -> String {
    let mut key = site_key(g);
    for f in picture_frames(g, false) {
        let line = match &f {
            MergedFrame::Python(p) => p.line,
            MergedFrame::Native(n) => n.line,
        };
        let _ = write!(key, "|{}", line.unwrap_or(0));
    }
    key
}

/// The stable short id of a call site: FNV-1a of its key, 48 bits.
pub fn site_id(g: &Group) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key(g).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

/// What a call site's figures need of its symbolized group, computed once
/// per trace: its key, id and stack lines never change, and a writer that
/// runs every second keeps them instead of building them again.
#[derive(Clone, Debug)]
pub struct SiteInfo {
    pub group: Group,
    key: String,
    site_id: String,
    stack: Vec<String>,
}

impl SiteInfo {
    pub fn of(group: Group) -> SiteInfo {
        SiteInfo {
            key: key(&group),
            site_id: site_id(&group),
            stack: stack_lines(&group),
            group,
        }
    }
}

/// The `n` sites with the most live bytes among `groups` (each with its
/// live bytes, live blocks and bytes at the peak, symbolized as in a
/// report), labelled among themselves. Groups whose key is the same (two
/// stacks that symbolize alike) are added together first.
pub fn top_sites(groups: Vec<(Group, u64, u64, u64)>, n: usize) -> Vec<Site> {
    let infos: Vec<(SiteInfo, u64, u64, u64)> = groups
        .into_iter()
        .map(|(g, live, blocks, peak)| (SiteInfo::of(g), live, blocks, peak))
        .collect();
    top_sites_of(infos.iter().map(|(i, l, b, p)| (i, *l, *b, *p)).collect(), n)
}

/// [`top_sites`] of sites whose [`SiteInfo`] is already known.
pub fn top_sites_of(sites: Vec<(&SiteInfo, u64, u64, u64)>, n: usize) -> Vec<Site> {
    let mut by_key: Vec<(&SiteInfo, u64, u64, u64)> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (info, live, blocks, peak) in sites {
        match index.get(info.key.as_str()) {
            Some(&i) => {
                let e = &mut by_key[i];
                e.1 += live;
                e.2 += blocks;
                e.3 += peak;
            }
            None => {
                index.insert(info.key.as_str(), by_key.len());
                by_key.push((info, live, blocks, peak));
            }
        }
    }
    // Most live bytes first, then most at the peak; the key breaks ties so
    // that the same figures give the same file.
    by_key.sort_by(|a, b| b.1.cmp(&a.1).then(b.3.cmp(&a.3)).then(a.0.key.cmp(&b.0.key)));
    by_key.truncate(n);
    let groups: Vec<&Group> = by_key.iter().map(|e| &e.0.group).collect();
    let labels = label_groups(&groups);
    by_key
        .iter()
        .zip(labels)
        .map(|((info, live, blocks, peak), label)| Site {
            label: label.to_string(),
            site_id: info.site_id.clone(),
            live_bytes: *live,
            live_blocks: *blocks,
            peak_bytes: *peak,
            stack: info.stack.clone(),
        })
        .collect()
}

/// The frames a site's stack shows, as the text report shows them
/// (noise left out, Python as a traceback), at most 64 native lines.
fn stack_lines(g: &Group) -> Vec<String> {
    display_frames(g, 64)
        .into_iter()
        .map(|l| l.trim_start().to_string())
        .collect()
}

/// A process's final figures from its exit report, for a Pushgateway
/// (`cudaleak run --pushgateway`): its totals, the unsuppressed leaks as
/// `leaked_bytes`, and as sites the `top` leaked groups with their bytes
/// at the peak.
pub fn sample_of_report(r: &Report, job: Option<String>, top: usize) -> Sample {
    let mut groups: Vec<(Group, u64, u64, u64)> = r
        .leaks
        .iter()
        .map(|g| (g.clone(), g.bytes, g.blocks, 0))
        .collect();
    let leaked_keys: std::collections::HashSet<String> = groups.iter().map(|g| key(&g.0)).collect();
    if let Some(p) = &r.peak {
        groups.extend(
            p.groups
                .iter()
                .filter(|g| leaked_keys.contains(&key(g)))
                .map(|g| (g.clone(), 0, 0, g.bytes)),
        );
    }
    Sample {
        labels: Labels {
            job,
            rank: r.rank,
            local_rank: None,
            host: r.hostname.clone().unwrap_or_else(|| "unknown".into()),
            pid: r.pid,
        },
        live_bytes: r.totals.live_bytes,
        live_blocks: r.totals.live_blocks,
        peak_bytes: r.totals.peak_bytes,
        failed_allocations: r.totals.failed_allocations,
        oom_events: r.oom_events.len() as u64,
        leaked_bytes: Some(
            r.leaks
                .iter()
                .filter(|g| g.kind().counts_in_live_bytes())
                .map(|g| g.bytes)
                .sum(),
        ),
        sites: top_sites(groups, top),
        devices: Vec::new(),
    }
}

/// URL-safe base64 without padding, as the Pushgateway reads a grouping
/// key's value after `@base64` (any value then fits in a path segment).
fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The Pushgateway path of a process's group: by job and rank, or by job
/// and `instance` (`HOST:PID`) when it has no rank; a PUT there replaces
/// what the same process of an earlier run pushed.
pub fn push_path(job: &str, rank: Option<i64>, host: &str, pid: i64) -> String {
    let job = format!("/metrics/job@base64/{}", base64url(job.as_bytes()));
    match rank {
        Some(r) => format!("{job}/rank/{r}"),
        None => format!(
            "{job}/instance@base64/{}",
            base64url(format!("{host}:{pid}").as_bytes())
        ),
    }
}

/// A label value as the text format wants it: backslash, double quote
/// and line feed escaped; other control characters (which a scraper
/// would take as they are, into a terminal) as `\xNN` text.
fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {
                let _ = write!(out, "\\\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn common_labels(l: &Labels) -> String {
    let mut s = String::new();
    if let Some(job) = &l.job {
        let _ = write!(s, "job=\"{}\",", label_value(job));
    }
    if let Some(r) = l.rank {
        let _ = write!(s, "rank=\"{r}\",");
    }
    if let Some(r) = l.local_rank {
        let _ = write!(s, "local_rank=\"{r}\",");
    }
    let _ = write!(s, "host=\"{}\",pid=\"{}\"", label_value(&l.host), l.pid);
    s
}

/// The file's text: HELP and TYPE once per metric, then its series.
pub fn render(s: &Sample) -> String {
    let common = common_labels(&s.labels);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, series: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (extra, v) in series {
            let _ = writeln!(out, "{name}{{{common}{extra}}} {v}");
        }
    };
    let one = |v: u64| vec![(String::new(), v)];
    // By device where the devices are known; a report's figures (pushed
    // at exit) have only the process's totals.
    let by_device = |f: fn(&DeviceLive) -> u64, total: u64| -> Vec<(String, u64)> {
        if s.devices.is_empty() {
            return one(total);
        }
        s.devices
            .iter()
            .map(|d| (format!(",device=\"{}\"", label_value(&d.device)), f(d)))
            .collect()
    };
    metric(
        "cudaleak_live_bytes",
        "gauge",
        "GPU memory the process holds now on the device (device, managed and physical allocations; pinned host memory as device \"host\"), in bytes.",
        &by_device(|d| d.live_bytes, s.live_bytes),
    );
    metric(
        "cudaleak_live_blocks",
        "gauge",
        "Blocks the process holds now on the device.",
        &by_device(|d| d.live_blocks, s.live_blocks),
    );
    metric(
        "cudaleak_peak_bytes",
        "gauge",
        "The most the process has held at once, all its devices together, in bytes.",
        &one(s.peak_bytes),
    );
    metric(
        "cudaleak_failed_allocations_total",
        "counter",
        "Allocation calls that failed.",
        &one(s.failed_allocations),
    );
    metric(
        "cudaleak_oom_events_total",
        "counter",
        "Out-of-memory episodes (failed allocation calls within 1 s count as one).",
        &one(s.oom_events),
    );
    let site = |f: fn(&Site) -> u64| -> Vec<(String, u64)> {
        s.sites
            .iter()
            .map(|x| {
                (
                    format!(",site_id=\"{}\",site=\"{}\"", x.site_id, label_value(&x.label)),
                    f(x),
                )
            })
            .collect()
    };
    metric(
        "cudaleak_site_live_bytes",
        "gauge",
        "Bytes held now by one of the call sites holding the most, labelled as the reports label it.",
        &site(|x| x.live_bytes),
    );
    metric(
        "cudaleak_site_live_blocks",
        "gauge",
        "Blocks held now by one of the call sites holding the most.",
        &site(|x| x.live_blocks),
    );
    metric(
        "cudaleak_site_peak_bytes",
        "gauge",
        "Bytes the call site held when the process reached its peak.",
        &site(|x| x.peak_bytes),
    );
    if let Some(leaked) = s.leaked_bytes {
        metric(
            "cudaleak_leaked_bytes",
            "gauge",
            "Bytes the exit report lists as leaked (suppressed groups left out).",
            &one(leaked),
        );
    }
    out
}

/// The file of a process: `cudaleak.<host>[.r<rank>].<pid>.prom`, the host
/// made safe for a file name as report names make it.
pub fn file_name(host: &str, rank: Option<i64>, pid: i64) -> String {
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match rank {
        Some(r) => format!("cudaleak.{host}.r{r}.{pid}.prom"),
        None => format!("cudaleak.{host}.{pid}.prom"),
    }
}

/// The pid a metrics file of `host` names, or None for another host's
/// file or another name.
pub fn pid_of(name: &str, host: &str) -> Option<i64> {
    let host = file_name(host, None, 0);
    let prefix = host.strip_suffix("0.prom")?;
    let rest = name.strip_prefix(prefix)?.strip_suffix(".prom")?;
    let pid = match rest.split_once('.') {
        Some((rank, pid)) if rank.starts_with('r') && rank[1..].parse::<i64>().is_ok() => pid,
        Some(_) => return None,
        None => rest,
    };
    pid.parse().ok().filter(|&p| p > 0)
}

/// The metrics files in `dir` of `host` whose process is gone
/// (`is_alive(pid)` false): what a process killed without its last write
/// left.
pub fn stale_files(dir: &Path, host: &str, is_alive: impl Fn(i64) -> bool) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid = pid_of(&name, host)?;
            (!is_alive(pid)).then(|| e.path())
        })
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::python::PythonFrame;
    use crate::record::MemoryKind;

    fn group(api: &str, function: &str, line: i64) -> Group {
        Group::new(
            1,
            0,
            api,
            MemoryKind::Device,
            vec![],
            vec![PythonFrame {
                function: function.into(),
                file: "/job/train.py".into(),
                line: Some(line),
            }],
        )
    }

    fn sample() -> Sample {
        Sample {
            labels: Labels {
                job: Some("run-7".into()),
                rank: Some(1),
                local_rank: Some(1),
                host: "node\"3\n".into(),
                pid: 4242,
            },
            live_bytes: 3 << 20,
            live_blocks: 3,
            peak_bytes: 5 << 20,
            failed_allocations: 2,
            oom_events: 1,
            leaked_bytes: None,
            sites: top_sites(
                vec![
                    (group("cudaMalloc", "steady", 10), 1 << 20, 1, 1 << 20),
                    (group("cudaMalloc", "grow", 20), 2 << 20, 2, 4 << 20),
                ],
                10,
            ),
            devices: Vec::new(),
        }
    }

    #[test]
    fn the_text_format_with_labels_escaped() {
        let text = render(&sample());
        let common = r#"job="run-7",rank="1",local_rank="1",host="node\"3\n",pid="4242""#;
        assert!(
            text.contains(&format!("cudaleak_live_bytes{{{common}}} 3145728\n")),
            "{text}"
        );
        assert!(text.contains("# TYPE cudaleak_failed_allocations_total counter\n"));
        assert!(text.contains(&format!("cudaleak_oom_events_total{{{common}}} 1\n")));
        let grow = text
            .lines()
            .find(|l| l.starts_with("cudaleak_site_live_bytes") && l.contains("grow"))
            .unwrap();
        assert!(
            grow.contains(r#"site="cudaMalloc (device memory) at grow train.py:20""#),
            "{grow}"
        );
        assert!(grow.ends_with(" 2097152"), "{grow}");
        // The largest site first.
        let first = text
            .lines()
            .find(|l| l.starts_with("cudaleak_site_live_bytes"))
            .unwrap();
        assert!(first.contains("grow"), "{text}");
        assert!(!text.contains("cudaleak_leaked_bytes"));
        let mut last = sample();
        last.leaked_bytes = Some(7);
        assert!(render(&last).contains(&format!("cudaleak_leaked_bytes{{{common}}} 7\n")));
        // Every line is a comment or `name{labels} value`.
        for l in text.lines() {
            assert!(
                l.starts_with("# ") || l.split_once("} ").is_some_and(|(_, v)| v.parse::<u64>().is_ok()),
                "{l}"
            );
        }
        // The stacks are the view's, not the file's.
        assert_eq!(last.sites[0].stack, vec!["#0 in grow /job/train.py:20 [python]"]);
        assert!(!text.contains("[python]"), "{text}");
    }

    #[test]
    fn live_memory_by_device_when_the_devices_are_known() {
        let mut s = sample();
        s.devices = vec![
            DeviceLive {
                device: "0".into(),
                live_bytes: 1 << 20,
                live_blocks: 1,
            },
            DeviceLive {
                device: "host".into(),
                live_bytes: 2 << 20,
                live_blocks: 2,
            },
        ];
        let text = render(&s);
        let common = r#"job="run-7",rank="1",local_rank="1",host="node\"3\n",pid="4242""#;
        for line in [
            format!("cudaleak_live_bytes{{{common},device=\"0\"}} 1048576\n"),
            format!("cudaleak_live_bytes{{{common},device=\"host\"}} 2097152\n"),
            format!("cudaleak_live_blocks{{{common},device=\"host\"}} 2\n"),
            // The peak is the process's, over its devices together.
            format!("cudaleak_peak_bytes{{{common}}} 5242880\n"),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            !text.contains(&format!("cudaleak_live_bytes{{{common}}}")),
            "{text}"
        );
        for l in text.lines() {
            assert!(
                l.starts_with("# ") || l.split_once("} ").is_some_and(|(_, v)| v.parse::<u64>().is_ok()),
                "{l}"
            );
        }
    }

    #[test]
    fn top_sites_are_bounded_merged_and_stable() {
        let many: Vec<_> = (0..1000)
            .map(|i| (group("cudaMalloc", &format!("f{i}"), i), i as u64, 1, 0))
            .collect();
        let top = top_sites(many, 10);
        assert_eq!(top.len(), 10);
        assert_eq!(top[0].live_bytes, 999);
        assert_eq!(top[9].live_bytes, 990);
        // Two stacks that symbolize alike are one site.
        let twice = top_sites(
            vec![
                (group("cudaMalloc", "a", 1), 5, 1, 0),
                (group("cudaMalloc", "a", 1), 6, 2, 1),
            ],
            10,
        );
        assert_eq!(
            (twice.len(), twice[0].live_bytes, twice[0].live_blocks),
            (1, 11, 3)
        );
        // The id depends on the site only.
        assert_eq!(
            site_id(&group("cudaMalloc", "a", 1)),
            site_id(&group("cudaMalloc", "a", 1))
        );
        assert_ne!(
            site_id(&group("cudaMalloc", "a", 1)),
            site_id(&group("cudaMalloc", "a", 2))
        );
        assert_eq!(site_id(&group("cudaMalloc", "a", 1)).len(), 12);
    }

    #[test]
    fn push_paths_encode_any_value() {
        assert_eq!(base64url(b"job-42"), "am9iLTQy");
        assert_eq!(base64url(b"a/b"), "YS9i");
        assert_eq!(base64url(b"ab"), "YWI");
        assert_eq!(
            push_path("job-42", Some(1), "h", 7),
            "/metrics/job@base64/am9iLTQy/rank/1"
        );
        assert_eq!(
            push_path("a/b", None, "h", 7),
            "/metrics/job@base64/YS9i/instance@base64/aDo3"
        );
    }

    #[test]
    fn names_and_stale_files() {
        assert_eq!(
            file_name("gpu-node/1", Some(3), 77),
            "cudaleak.gpu-node_1.r3.77.prom"
        );
        assert_eq!(file_name("n", None, 77), "cudaleak.n.77.prom");
        assert_eq!(pid_of("cudaleak.n.r3.77.prom", "n"), Some(77));
        assert_eq!(pid_of("cudaleak.n.77.prom", "n"), Some(77));
        assert_eq!(pid_of("cudaleak.m.77.prom", "n"), None);
        assert_eq!(pid_of("cudaleak.n.x.77.prom", "n"), None);
        assert_eq!(pid_of("cudaleak.n.77.prom.tmp", "n"), None);
        let dir = std::env::temp_dir().join(format!("cudaleak-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for n in [
            "cudaleak.n.10.prom",
            "cudaleak.n.r1.11.prom",
            "cudaleak.m.12.prom",
            "other.prom",
        ] {
            std::fs::write(dir.join(n), "x").unwrap();
        }
        let stale = stale_files(&dir, "n", |pid| pid == 10).unwrap();
        assert_eq!(stale, vec![dir.join("cudaleak.n.r1.11.prom")]);
        assert!(stale_files(&dir.join("missing"), "n", |_| true).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
