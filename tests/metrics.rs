//! The metrics file (`CUDALEAK_METRICS_DIR`, `cudaleak run --metrics-dir`):
//! what a process under the library publishes for node_exporter's
//! textfile collector while it runs, read back as a scraper reads it, and
//! `cudaleak metrics-clean`. The subject is tests/c/metrics.c: one call
//! site that grows and one that holds steady, or thousands of call sites.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// One series of the text format: its name, labels and value.
#[derive(Debug)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The text format, as Prometheus's parser reads it: comments, then
/// `name{label="value",...} value` lines, label values with `\\`, `\"`
/// and `\n` escapes.
fn parse(text: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, rest) = line
            .split_once('{')
            .unwrap_or_else(|| panic!("no labels: {line}"));
        let mut labels = BTreeMap::new();
        let mut chars = rest.chars().peekable();
        loop {
            let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
            assert_eq!(chars.next(), Some('"'), "{line}");
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some('n') => value.push('\n'),
                        Some(c) => value.push(c),
                        None => panic!("{line}"),
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.insert(key.trim_start_matches(',').to_string(), value);
            match chars.next() {
                Some(',') => continue,
                Some('}') => break,
                other => panic!("{other:?} in {line}"),
            }
        }
        let value: String = chars.collect();
        out.push(Series {
            name: name.to_string(),
            labels,
            value: value.trim().parse().unwrap_or_else(|_| panic!("value of {line}")),
        });
    }
    out
}

fn prom_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "prom"));
    v.sort();
    v
}

/// The value of `name` whose `site` label contains `site` (any, when None).
fn value(series: &[Series], name: &str, site: Option<&str>) -> Option<f64> {
    series
        .iter()
        .find(|s| s.name == name && site.is_none_or(|w| s.labels.get("site").is_some_and(|l| l.contains(w))))
        .map(|s| s.value)
}

/// tests/c/metrics.c, paced through its stdin.
fn grower(args: &[&str], env: &[(&str, &str)]) -> PipedProgram {
    PipedProgram::start(&program("metrics"), args, env)
}

/// The file of `pid` in `dir` once it says what `ready` accepts (the
/// writer runs every 0.2 s here).
fn read_when(dir: &Path, pid: u32, ready: impl Fn(&[Series]) -> bool) -> Vec<Series> {
    let start = Instant::now();
    loop {
        for f in prom_files(dir) {
            if f.to_string_lossy().ends_with(&format!(".{pid}.prom")) {
                let s = parse(&std::fs::read_to_string(&f).unwrap_or_default());
                if ready(&s) {
                    return s;
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no metrics file for {pid} in {} that is ready: {:?}",
            dir.display(),
            prom_files(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

const GROWING: &str = "at growing_site metrics.c:";
const STEADY: &str = "at steady_site metrics.c:";
const MIB: f64 = 1048576.0;

/// Two ranks, each growing one site while another holds steady: each has
/// its file with the labels a cluster needs, the growing site's bytes
/// rise between two reads and the steady one's do not, and the file is
/// gone when the process has ended.
#[test]
fn two_ranks_publish_their_sites_while_they_run() {
    let dir = TempDir::new("metrics-ranks");
    let metrics = dir.path().join("metrics");
    let mdir = metrics.to_str().unwrap();
    let mut ranks = Vec::new();
    for rank in ["0", "1"] {
        let env = [
            ("CUDALEAK_METRICS_DIR", mdir),
            ("CUDALEAK_METRICS_INTERVAL", "0.2"),
            ("RANK", rank),
            ("LOCAL_RANK", rank),
            ("TORCHELASTIC_RUN_ID", "job-42"),
        ];
        ranks.push(grower(&["grow", "8", "20", "pause", "wait"], &env));
    }
    // Halfway, each rank waits until its file has said so.
    for g in &mut ranks {
        g.wait_line("paused");
    }
    let pids: Vec<u32> = ranks.iter().map(|g| g.child.id()).collect();
    let early: Vec<f64> = pids
        .iter()
        .map(|&p| {
            let s = read_when(&metrics, p, |s| {
                value(s, "cudaleak_site_live_bytes", Some(GROWING)) == Some(4.0 * MIB)
            });
            value(&s, "cudaleak_site_live_bytes", Some(GROWING)).unwrap()
        })
        .collect();
    for g in &mut ranks {
        g.go_on();
        g.wait_line("step 8");
    }
    for (i, &pid) in pids.iter().enumerate() {
        let s = read_when(&metrics, pid, |s| {
            value(s, "cudaleak_site_live_bytes", Some(GROWING)) == Some(8.0 * MIB)
        });
        let grown = value(&s, "cudaleak_site_live_bytes", Some(GROWING)).unwrap();
        assert!(grown > early[i], "rank {i}: {early:?} then {grown}");
        assert_eq!(value(&s, "cudaleak_site_live_bytes", Some(STEADY)), Some(MIB));
        assert_eq!(value(&s, "cudaleak_site_live_blocks", Some(GROWING)), Some(8.0));
        assert_eq!(value(&s, "cudaleak_live_bytes", None), Some(9.0 * MIB));
        assert_eq!(value(&s, "cudaleak_live_blocks", None), Some(9.0));
        assert_eq!(value(&s, "cudaleak_peak_bytes", None), Some(9.0 * MIB));
        assert_eq!(
            value(&s, "cudaleak_site_peak_bytes", Some(GROWING)),
            Some(8.0 * MIB)
        );
        assert_eq!(value(&s, "cudaleak_failed_allocations_total", None), Some(0.0));
        assert_eq!(value(&s, "cudaleak_oom_events_total", None), Some(0.0));
        assert_eq!(value(&s, "cudaleak_leaked_bytes", None), None);
        for series in &s {
            let l = &series.labels;
            assert_eq!(l["job"], "job-42", "{series:?}");
            assert_eq!(l["rank"], i.to_string(), "{series:?}");
            assert_eq!(l["local_rank"], i.to_string(), "{series:?}");
            assert_eq!(l["pid"], pid.to_string(), "{series:?}");
            assert!(!l["host"].is_empty());
        }
        let site = s
            .iter()
            .find(|x| x.name == "cudaleak_site_live_bytes" && x.labels["site"].contains(GROWING))
            .unwrap();
        let line = line_of("tests/c/metrics.c", "SITE growing");
        assert_eq!(
            site.labels["site"],
            format!("cudaMalloc (device memory) {GROWING}{line}")
        );
        assert_eq!(site.labels["site_id"].len(), 12);
    }
    // The same call site has the same id in both processes.
    let ids: Vec<String> = pids
        .iter()
        .map(|&p| {
            let s = read_when(&metrics, p, |_| true);
            let site = s
                .iter()
                .find(|x| x.labels.get("site").is_some_and(|l| l.contains(GROWING)))
                .unwrap();
            site.labels["site_id"].clone()
        })
        .collect();
    assert_eq!(ids[0], ids[1]);
    for g in ranks {
        assert!(g.finish().success());
    }
    assert_eq!(
        prom_files(&metrics),
        Vec::<PathBuf>::new(),
        "files left after exit"
    );
}

/// The series of `name` whose `device` label is `device`.
fn on_device(series: &[Series], name: &str, device: &str) -> Option<f64> {
    series
        .iter()
        .find(|s| s.name == name && s.labels.get("device").is_some_and(|d| d == device))
        .map(|s| s.value)
}

/// Memory on two devices and pinned host memory: live bytes and blocks
/// by device, a device that holds nothing any more kept at 0, and the
/// peak the process's.
#[test]
fn live_memory_is_published_by_device() {
    let dir = TempDir::new("metrics-devices");
    let metrics = dir.path().join("metrics");
    let env = [
        ("CUDALEAK_METRICS_DIR", metrics.to_str().unwrap()),
        ("CUDALEAK_METRICS_INTERVAL", "0.2"),
        ("SIMCUDA_DEVICES", "2"),
    ];
    let mut g = grower(&["devices"], &env);
    g.wait_line("devices held");
    let pid = g.child.id();
    let s = read_when(&metrics, pid, |s| {
        on_device(s, "cudaleak_live_bytes", "host") == Some(3.0 * MIB)
    });
    assert_eq!(on_device(&s, "cudaleak_live_bytes", "0"), Some(MIB));
    assert_eq!(on_device(&s, "cudaleak_live_bytes", "1"), Some(2.0 * MIB));
    assert_eq!(on_device(&s, "cudaleak_live_blocks", "1"), Some(1.0));
    let live: Vec<&Series> = s.iter().filter(|x| x.name == "cudaleak_live_bytes").collect();
    assert_eq!(live.len(), 3, "{live:?}");
    assert_eq!(value(&s, "cudaleak_peak_bytes", None), Some(6.0 * MIB));
    assert!(
        s.iter()
            .filter(|x| x.name == "cudaleak_peak_bytes")
            .all(|x| !x.labels.contains_key("device")),
        "{s:?}"
    );
    g.go_on();
    g.wait_line("freed");
    let s = read_when(&metrics, pid, |s| {
        on_device(s, "cudaleak_live_bytes", "1") == Some(0.0)
    });
    assert_eq!(on_device(&s, "cudaleak_live_blocks", "1"), Some(0.0));
    assert_eq!(on_device(&s, "cudaleak_live_bytes", "0"), Some(MIB));
    g.go_on();
    assert!(g.finish().success());
}

/// Ten thousand call sites: the file names only the top N, and stays
/// small.
#[test]
fn many_call_sites_stay_bounded() {
    let dir = TempDir::new("metrics-many");
    let metrics = dir.path().join("metrics");
    let env = [
        ("CUDALEAK_METRICS_DIR", metrics.to_str().unwrap()),
        ("CUDALEAK_METRICS_INTERVAL", "0.2"),
        ("CUDALEAK_METRICS_TOP", "10"),
    ];
    let mut g = grower(&["many", "10000", "wait"], &env);
    g.wait_line("many done");
    let pid = g.child.id();
    let s = read_when(&metrics, pid, |s| {
        value(s, "cudaleak_live_blocks", None) == Some(10000.0)
    });
    let sites = s.iter().filter(|x| x.name == "cudaleak_site_live_bytes").count();
    assert_eq!(sites, 10);
    assert_eq!(value(&s, "cudaleak_live_bytes", None), Some(2560000.0));
    let size = std::fs::metadata(&prom_files(&metrics)[0]).unwrap().len();
    assert!(size < 16 * 1024, "{size} bytes");
    assert!(g.finish().success());
}

/// `cudaleak run --metrics-dir` publishes the files of the processes it
/// runs.
#[test]
fn run_metrics_dir_publishes_the_files() {
    let dir = TempDir::new("metrics-run");
    let metrics = dir.path().join("m");
    let mut cmd = cli_command(
        &[
            "run",
            "--dir",
            "reports",
            "--metrics-dir",
            "m",
            "--",
            program("metrics").to_str().unwrap(),
            "grow",
            "6",
            "10",
            "pause",
        ],
        dir.path(),
    );
    // The program stays halfway until the file has been seen.
    cmd.env("CUDALEAK_METRICS_INTERVAL", "0.2")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let mut seen = None;
    while seen.is_none() && start.elapsed() < Duration::from_secs(20) {
        seen = prom_files(&metrics).into_iter().next();
        std::thread::sleep(Duration::from_millis(50));
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let seen = seen.expect("no metrics file during the run");
    assert!(seen
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("cudaleak."));
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(prom_files(&metrics), Vec::<PathBuf>::new());
}

/// A file whose process is gone (killed before its last write) is removed
/// by `cudaleak metrics-clean`; a live process's and another host's stay.
#[test]
fn metrics_clean_removes_what_dead_processes_left() {
    let dir = TempDir::new("metrics-clean");
    let host = cudaleak_core::base::hostname();
    let gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    let mut gone = gone;
    gone.wait().unwrap();
    let me = std::process::id();
    let dead = dir
        .path()
        .join(cudaleak_core::metrics::file_name(&host, Some(3), gone_pid as i64));
    let alive = dir
        .path()
        .join(cudaleak_core::metrics::file_name(&host, None, me as i64));
    let other = dir.path().join(cudaleak_core::metrics::file_name(
        "another-host",
        None,
        gone_pid as i64,
    ));
    for f in [&dead, &alive, &other] {
        std::fs::write(f, "cudaleak_live_bytes{pid=\"1\"} 0\n").unwrap();
    }
    let out = cli_command(&["metrics-clean", dir.path().to_str().unwrap()], dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dead.exists());
    assert!(alive.exists() && other.exists());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("removed {}\n", dead.display())
    );
    let bad = cli_command(&["metrics-clean", "/nonexistent/dir"], dir.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// A free port on the loopback interface (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on 127.0.0.1:port: (status code, body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// A server process killed when the test ends, however it ends.
struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    });
    required(
        found,
        &format!("{name} (Debian's package of that name; scripts/install-test-deps.sh)"),
    )
}

/// `program ARGS` on a free loopback port (`--web.listen-address`), its
/// output dropped: (the server, its port).
fn serve(program: &str, args: &[String]) -> (Server, u16) {
    let port = free_port();
    let server = Server(
        std::process::Command::new(tool(program))
            .args(args)
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (server, port)
}

/// node_exporter serving the textfiles of `dir`, and nothing else.
fn start_node_exporter(dir: &Path) -> (Server, u16) {
    serve(
        "prometheus-node-exporter",
        &[
            "--collector.disable-defaults".into(),
            "--collector.textfile".into(),
            format!("--collector.textfile.directory={}", dir.display()),
        ],
    )
}

/// A Pushgateway, once it is ready.
fn start_pushgateway() -> (Server, u16) {
    let (server, port) = serve("prometheus-pushgateway", &[]);
    wait_ready(port, "the Pushgateway");
    (server, port)
}

/// Prometheus scraping 127.0.0.1:`target` every second, with
/// `honor_labels` (the job's own `job` label kept), its data in `dir`;
/// returns once it is ready, with its port.
fn start_prometheus(dir: &Path, targets: &[u16]) -> (Server, u16) {
    let targets: Vec<String> = targets.iter().map(|t| format!("'127.0.0.1:{t}'")).collect();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: node\n    honor_labels: true\n    \
             static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let (server, port) = serve(
        "prometheus",
        &[
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
        ],
    );
    wait_ready(port, "Prometheus");
    (server, port)
}

fn wait_ready(port: u16, what: &str) {
    let start = Instant::now();
    while http_get(port, "/-/ready").map(|r| r.0) != Some(200) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} did not get ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// How many series `query` has over the last `seconds`, step 1 s, as a
/// dashboard's time series panel asks.
fn range_series(port: u16, query: &str, seconds: u64) -> usize {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let path = format!(
        "/api/v1/query_range?query={}&start={}&end={now}&step=1",
        url_encode(query),
        now - seconds
    );
    let Some((200, body)) = http_get(port, &path) else {
        return 0;
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().map_or(0, |a| a.len())
}

/// `query` over Prometheus's HTTP API: each result's labels and value.
fn query(port: u16, query: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let enc = url_encode(query);
    let Some((200, body)) = http_get(port, &format!("/api/v1/query?query={enc}")) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    let labels = r["metric"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                        .collect();
                    (labels, r["value"][1].as_str().unwrap().parse().unwrap())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The real engine: node_exporter serves the two ranks' files through its
/// textfile collector, Prometheus scrapes it every second, and a query
/// over Prometheus's HTTP API returns the growing site of both ranks, its
/// bytes rising between two scrapes.
#[test]
#[ignore = "needs prometheus and prometheus-node-exporter (Debian); scripts/test.sh runs it (--ignored)"]
fn prometheus_scrapes_both_ranks_through_node_exporter() {
    let dir = TempDir::new("metrics-prometheus");
    let metrics = dir.path().join("textfiles");
    std::fs::create_dir_all(&metrics).unwrap();
    let (_node, np) = start_node_exporter(&metrics);
    let (_prom, pp) = start_prometheus(dir.path(), &[np]);
    let mdir = metrics.to_str().unwrap();
    let mut ranks: Vec<PipedProgram> = ["0", "1"]
        .iter()
        .map(|rank| {
            let env = [
                ("CUDALEAK_METRICS_DIR", mdir),
                ("CUDALEAK_METRICS_INTERVAL", "0.2"),
                ("RANK", *rank),
                ("CUDALEAK_JOB", "prom-test"),
            ];
            grower(&["grow", "8", "100", "pause", "wait"], &env)
        })
        .collect();
    for g in &mut ranks {
        g.wait_line("paused");
    }
    // The growing site of each rank, as Prometheus has it now.
    let growing = || -> BTreeMap<String, f64> {
        query(pp, "cudaleak_site_live_bytes{job=\"prom-test\"}")
            .into_iter()
            .filter(|(l, _)| l.get("site").is_some_and(|s| s.contains(GROWING)))
            .map(|(l, v)| (l["rank"].clone(), v))
            .collect()
    };
    let wait_for = |what: &str, ok: &dyn Fn(&BTreeMap<String, f64>) -> bool| -> BTreeMap<String, f64> {
        let start = Instant::now();
        loop {
            let g = growing();
            if ok(&g) {
                return g;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{what}: {g:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let first = wait_for("both ranks scraped, halfway", &|g| {
        g.len() == 2 && g.values().all(|&v| v == 4.0 * MIB)
    });
    for g in &mut ranks {
        g.go_on();
    }
    let later = wait_for("the growing site rising on both ranks", &|g| {
        g.len() == 2 && g.iter().all(|(r, v)| *v > first[r])
    });
    assert_eq!(later.keys().collect::<Vec<_>>(), ["0", "1"]);
    let steady = query(pp, "cudaleak_site_live_bytes{job=\"prom-test\"}");
    assert!(
        steady
            .iter()
            .filter(|(l, _)| l["site"].contains(STEADY))
            .all(|(_, v)| *v == MIB),
        "{steady:?}"
    );
    // The dashboard's kind of question: the job's sites, summed over ranks.
    let by_site = query(pp, "sum by (site) (cudaleak_site_live_bytes{job=\"prom-test\"})");
    assert_eq!(by_site.len(), 2, "{by_site:?}");
    for g in ranks.drain(..) {
        assert!(g.finish().success());
    }
}

fn run_pushing(dir: &Path, url: &str, command: &[&str]) -> std::process::Output {
    let mut args = vec![
        "run",
        "--fail-on-leak",
        "--dir",
        "reports",
        "--pushgateway",
        url,
        "--",
    ];
    args.extend_from_slice(command);
    let mut cmd = cli_command(&args, dir);
    cmd.env("CUDALEAK_JOB", "ci-7");
    cmd.output().unwrap()
}

/// A CI run's final figures reach the Pushgateway, grouped by job, and
/// Prometheus scraping it returns the planted leak's bytes; the gate's
/// verdict is the leak's (23), not the push's.
#[test]
#[ignore = "needs prometheus and prometheus-pushgateway (Debian); scripts/test.sh runs it (--ignored)"]
fn the_pushgateway_receives_the_final_figures() {
    let dir = TempDir::new("metrics-push");
    let (_gateway, gp) = start_pushgateway();
    let prog = program("metrics");
    let out = run_pushing(
        dir.path(),
        &format!("http://127.0.0.1:{gp}"),
        &[prog.to_str().unwrap(), "grow", "2", "10"],
    );
    assert_eq!(
        out.status.code(),
        Some(23),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("could not push"));
    let (_, body) = http_get(gp, "/metrics").unwrap();
    let ours: String = body
        .lines()
        .filter(|l| l.starts_with("cudaleak_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let pushed = parse(&ours);
    let leaked: Vec<&Series> = pushed
        .iter()
        .filter(|s| s.name == "cudaleak_leaked_bytes")
        .collect();
    assert_eq!(leaked.len(), 1, "{body}");
    assert_eq!(leaked[0].value, MIB);
    assert_eq!(leaked[0].labels["job"], "ci-7");
    let site = pushed
        .iter()
        .find(|s| s.name == "cudaleak_site_live_bytes")
        .unwrap_or_else(|| panic!("{body}"));
    assert!(site.labels["site"].contains(STEADY), "{site:?}");
    assert_eq!(site.value, MIB);
    // Prometheus scraping the Pushgateway has the figure too.
    let (_prom, pp) = start_prometheus(dir.path(), &[gp]);
    let start = Instant::now();
    loop {
        let r = query(pp, "cudaleak_leaked_bytes{job=\"ci-7\"}");
        if let Some((_, v)) = r.first() {
            assert_eq!(*v, MIB);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "Prometheus never had cudaleak_leaked_bytes"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A Pushgateway nobody listens at: one warning for the run's two
/// processes, and the exit status stays the gate's.
#[test]
fn an_unreachable_pushgateway_warns_once() {
    let dir = TempDir::new("metrics-push-down");
    let prog = program("metrics");
    let p = prog.to_str().unwrap();
    let twice = format!("{p} grow 1 1 && {p} grow 1 1");
    let out = run_pushing(
        dir.path(),
        &format!("http://127.0.0.1:{}", free_port()),
        &["sh", "-c", &twice],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(23), "{stderr}");
    assert_eq!(
        stderr.matches("could not push to the Pushgateway").count(),
        1,
        "{stderr}"
    );
    let bad = cli_command(&["run", "--pushgateway", "https://gw", "--", "true"], dir.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("https is not supported"));
}

/// The Grafana dashboard (dashboards/grafana-cudaleak.json): every query
/// of every panel, and its job variable's, returns data from Prometheus
/// after a two-rank run that published its metrics files through
/// node_exporter and pushed its final figures to a Pushgateway.
#[test]
#[ignore = "needs prometheus, prometheus-node-exporter and prometheus-pushgateway (Debian); scripts/test.sh runs it (--ignored)"]
fn every_dashboard_query_returns_data() {
    let text = std::fs::read_to_string(repo().join("dashboards/grafana-cudaleak.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().unwrap().to_string();
            // A legend names labels as {{label}}, each one the query keeps:
            // one its `by (...)` lists, or any when it aggregates none away.
            let legend = t["legendFormat"].as_str().unwrap_or("");
            let mut rest = legend;
            while let Some(i) = rest.find('{') {
                let inner = &rest[i..];
                assert!(inner.starts_with("{{"), "a lone brace in legend {legend:?}");
                let end = inner
                    .find("}}")
                    .unwrap_or_else(|| panic!("unclosed braces in legend {legend:?}"));
                let label = &inner[2..end];
                assert!(
                    label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{legend:?}"
                );
                if let Some(by) = expr.split("by (").nth(1) {
                    let kept = by.split(')').next().unwrap();
                    assert!(
                        kept.split(',').any(|l| l.trim() == label),
                        "{legend:?} names {label}, lost by {expr}"
                    );
                }
                rest = &inner[end + 2..];
            }
            exprs.push((p["title"].as_str().unwrap().to_string(), expr));
        }
    }
    assert!(exprs.len() >= 7);
    let dir = TempDir::new("metrics-dashboard");
    let textfiles = dir.path().join("textfiles");
    std::fs::create_dir_all(&textfiles).unwrap();
    let (_node, np) = start_node_exporter(&textfiles);
    let (_gateway, gp) = start_pushgateway();
    let (_prom, pp) = start_prometheus(dir.path(), &[np, gp]);
    let started = Instant::now();
    let prog = program("metrics");
    let p = prog.to_str().unwrap();
    let ranks = format!("RANK=0 {p} grow 12 300 & RANK=1 {p} grow 12 300 & wait");
    let mut cmd = cli_command(
        &[
            "run",
            "--dir",
            "reports",
            "--metrics-dir",
            textfiles.to_str().unwrap(),
            "--pushgateway",
            &format!("http://127.0.0.1:{gp}"),
            "--",
            "sh",
            "-c",
            &ranks,
        ],
        dir.path(),
    );
    cmd.env("CUDALEAK_JOB", "dash")
        .env("CUDALEAK_METRICS_INTERVAL", "0.2");
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let start = Instant::now();
    loop {
        // The job variable's values (Grafana's label_values()).
        let jobs = http_get(pp, "/api/v1/label/job/values?match[]=cudaleak_live_bytes").map(|r| r.1);
        let window = started.elapsed().as_secs() + 5;
        let empty: Vec<&(String, String)> = exprs
            .iter()
            .filter(|(_, e)| range_series(pp, &e.replace("$job", "dash"), window) == 0)
            .collect();
        let job_found = jobs.as_deref().is_some_and(|b| b.contains("\"dash\""));
        if empty.is_empty() && job_found {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "queries without data: {empty:?}; the job variable's values: {jobs:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
