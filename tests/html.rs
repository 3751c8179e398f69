//! `--format html` and `--format svg` in a real browser: the
//! pages of known reports are rendered by headless Chromium, and the DOM
//! after the page's script ran is checked: the timeline's bands, peak and
//! dump marks, the flame graph's frames, the table's rows and totals, and
//! an empty error box (the page writes script errors there) with no
//! console message. A screenshot of each page is kept under
//! target/<profile>/html-tests/.
//!
//! The tests that need Chromium are `#[ignore]`d, with the reason:
//! `cargo test` reports them as ignored, never as passed. scripts/test.sh
//! runs them (`--ignored`), and there a missing Chromium fails them
//! (scripts/install-test-deps.sh installs it).

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::{
    cli, cli_command, line_of, repo, required, run_command, run_test_python, run_traced, target_dir,
    torch_cache_program, validate, Outcome, TempDir,
};

const MIB: u64 = 1 << 20;
const T0: i64 = 1_795_000_000_000;

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CUDALEAK_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in [
            "chromium",
            "chromium-browser",
            "chromium-headless-shell",
            "google-chrome",
        ] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Headless Chromium with a fresh profile and nothing that reaches the
/// network; its stderr carries the page's console messages.
fn browser(chrome: &Path, profile: &Path, width: u32) -> Command {
    let mut cmd = Command::new(chrome);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
    ])
    .arg(format!("--window-size={width},1500"))
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

struct Rendered {
    dom: String,
    console: Vec<String>,
}

/// The DOM of `page` after its scripts ran, and a screenshot of it kept as
/// target/<profile>/html-tests/<name>.png.
fn render(chrome: &Path, page: &Path, name: &str) -> Rendered {
    render_at(chrome, page, name, 1200)
}

/// [`render`] in a window `width` pixels wide.
fn render_at(chrome: &Path, page: &Path, name: &str, width: u32) -> Rendered {
    let profile = TempDir::new(&format!("chromium-{name}"));
    let url = format!("file://{}", page.display());
    let mut cmd = browser(chrome, &profile.path().join("dom"), width);
    cmd.arg("--dump-dom").arg(&url);
    let (status, dom, stderr) = run_command(cmd, Duration::from_secs(120));
    assert!(
        status.success(),
        "chromium --dump-dom failed: {status:?}\n{stderr}"
    );
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    let shots = target_dir().join("html-tests");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&shot);
    let mut cmd = browser(chrome, &profile.path().join("shot"), width);
    cmd.arg(format!("--screenshot={}", shot.display())).arg(&url);
    let (status, _, stderr) = run_command(cmd, Duration::from_secs(120));
    assert!(
        status.success() && shot.is_file(),
        "chromium --screenshot failed: {status:?}\n{stderr}"
    );
    Rendered { dom, console }
}

/// Every start tag in `dom` that contains `needle`.
fn tags<'a>(dom: &'a str, needle: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(i) = rest.find(needle) {
        let start = rest[..i].rfind('<').unwrap_or(0);
        let end = i + rest[i..].find('>').unwrap_or(rest.len() - i);
        out.push(&rest[start..=end.min(rest.len() - 1)]);
        rest = &rest[end.min(rest.len() - 1) + 1..];
    }
    out
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    Some(&tag[i..i + tag[i..].find('"')?])
}

/// What every page must show: the script ran to the end, wrote no error,
/// logged nothing, and drew a table. A blank page fails here.
fn check_rendered(r: &Rendered) -> Result<(), String> {
    let body = tags(&r.dom, "<body")
        .into_iter()
        .next()
        .ok_or("no <body> in the DOM")?;
    let errors_start = r.dom.find("id=\"errors\"").ok_or("no error box")?;
    let errors = &r.dom[errors_start..];
    let errors = &errors[errors.find('>').unwrap() + 1..errors.find("</div>").unwrap()];
    if !errors.is_empty() {
        return Err(format!("the page reported errors: {errors}"));
    }
    if attr(body, "data-rendered") != Some("ok") {
        return Err(format!("the page's script did not finish (body: {body})"));
    }
    if !r.console.is_empty() {
        return Err(format!("console messages:\n{}", r.console.join("\n")));
    }
    if tags(&r.dom, "id=\"leaks\"").is_empty() {
        return Err("no leak table".into());
    }
    Ok(())
}

fn native(function: &str, file: &str, line: i64) -> Value {
    json!({"address": "0x401000", "function": function, "file": file, "line": line, "module": "/opt/app/train"})
}

fn group(
    bytes: u64,
    blocks: u64,
    api: &str,
    memory: &str,
    native_stack: Vec<Value>,
    python: Vec<Value>,
) -> Value {
    json!({"blocks": blocks, "bytes": bytes, "api": api, "memory": memory,
           "native_stack": native_stack, "python_stack": python})
}

fn weights(bytes: u64) -> Value {
    group(
        bytes,
        1,
        "cudaMalloc",
        "device",
        vec![
            native("load_weights", "/src/demo.c", 13),
            native("main", "/src/demo.c", 39),
        ],
        vec![],
    )
}

fn scratch(mib: u64) -> Value {
    let mut g = group(
        mib * MIB,
        mib,
        "cudaMalloc",
        "device",
        vec![
            native("make_scratch", "/src/demo.c", 19),
            native("main", "/src/demo.c", 42),
        ],
        vec![json!({"function": "train_step", "file": "/src/train.py", "line": 33})],
    );
    g["trend"] = json!("growing");
    g
}

fn activations(mib: u64) -> Value {
    group(
        mib * MIB,
        2,
        "cuMemAlloc_v2",
        "device",
        vec![
            native("alloc_activations", "/src/model.c", 7),
            native("main", "/src/demo.c", 41),
        ],
        vec![],
    )
}

fn pinned(path: &str, function: &str) -> Value {
    group(
        4 * MIB,
        1,
        "cudaMallocHost",
        "host",
        vec![native(function, path, 26), native("main", "/src/demo.c", 40)],
        vec![],
    )
}

fn report(seq: u64, trigger: &str, pid: i64, rank: Option<i64>, leaks: Vec<Value>) -> Value {
    let bytes: u64 = leaks.iter().map(|g| g["bytes"].as_u64().unwrap()).sum();
    let blocks: u64 = leaks.iter().map(|g| g["blocks"].as_u64().unwrap()).sum();
    let v = json!({
        "format": "cudaleak", "version": 1, "trigger": trigger, "sequence": seq,
        "pid": pid, "command": ["python3", "train.py"], "hostname": "testhost", "rank": rank,
        "instance": format!("{pid}-abc"), "timestamp_ms": T0 + seq as i64 * 1000,
        "totals": {"live_blocks": blocks, "live_bytes": bytes, "peak_bytes": 83 * MIB,
                   "allocations": 10, "frees": 2, "failed_allocations": 0, "invalid_frees": 0},
        "leaks": leaks, "growth": [], "suppressed": []
    });
    validate(&v);
    v
}

fn write(dir: &Path, v: &Value) -> PathBuf {
    let rank = v["rank"].as_i64().map(|r| format!(".r{r}")).unwrap_or_default();
    let p = dir.join(format!(
        "cudaleak.testhost{rank}.{}.{}-abc.{}.{}.json",
        v["pid"],
        v["pid"],
        v["sequence"],
        v["trigger"].as_str().unwrap()
    ));
    std::fs::write(&p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    p
}

/// Four dumps of one process: three live ones (interval, interval,
/// signal) and the exit report. Live bytes peak at the signal dump
/// (64 + 3 + 16 MiB); the activations are freed before exit.
fn training_run(dir: &Path) {
    write(
        dir,
        &report(1, "interval", 4242, None, vec![weights(64 * MIB), scratch(1)]),
    );
    write(
        dir,
        &report(
            2,
            "interval",
            4242,
            None,
            vec![weights(64 * MIB), activations(8), scratch(2)],
        ),
    );
    write(
        dir,
        &report(
            3,
            "signal",
            4242,
            None,
            vec![weights(64 * MIB), activations(16), scratch(3)],
        ),
    );
    write(
        dir,
        &report(
            4,
            "exit",
            4242,
            None,
            vec![
                weights(64 * MIB),
                scratch(4),
                pinned("/src/demo.c", "pinned_staging"),
            ],
        ),
    );
}

fn cli_page(args: &[&str], dir: &Path, out: &str) -> PathBuf {
    let (status, stdout, stderr) = run_command(cli_command(args, dir), Duration::from_secs(60));
    assert!(status.success(), "cudaleak {args:?}: {status:?}\n{stderr}");
    let page = dir.join(out);
    std::fs::write(&page, stdout).unwrap();
    page
}

fn names_in_flame(dom: &str) -> Vec<String> {
    tags(dom, "class=\"frame")
        .into_iter()
        .filter_map(|t| attr(t, "data-name").map(str::to_string))
        .collect()
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn report_page_draws_the_timeline_the_flame_graph_and_the_table() {
    let dir = TempDir::new("html-report");
    training_run(dir.path());
    let page = cli_page(&["report", "--format", "html", "."], dir.path(), "report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("http://") || !html.contains("src=\"http"),
        "no network references"
    );
    assert!(
        !html.contains("<script src") && !html.contains("<link"),
        "self-contained"
    );
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let r = render(&chrome, &page, "report");
    check_rendered(&r).unwrap();
    let dom = &r.dom;

    // The timeline: one band per call site (four sites, nothing else
    // live), the peak at the signal dump, a mark for each dump.
    let series: Vec<&str> = tags(dom, "class=\"series\"")
        .into_iter()
        .filter_map(|t| attr(t, "data-label"))
        .collect();
    assert_eq!(series.len(), 4, "{series:?}");
    // Labelled as every view labels groups.
    assert_eq!(series[0], "cudaMalloc (device memory) at load_weights demo.c:13");
    assert!(
        series.contains(&"cudaMalloc (device memory) at train_step train.py:33"),
        "{series:?}"
    );
    let peak = tags(dom, "class=\"peak-marker\"");
    assert_eq!(peak.len(), 1);
    assert_eq!(attr(peak[0], "data-bytes"), Some((83 * MIB).to_string().as_str()));
    let marks: Vec<&str> = tags(dom, "class=\"dump-marker")
        .into_iter()
        .filter_map(|t| attr(t, "data-trigger"))
        .collect();
    assert_eq!(marks, ["interval", "interval", "signal", "exit"]);

    // The flame graph of the exit report's leaks, merged Python + native.
    let names = names_in_flame(dom);
    for f in [
        "all",
        "main",
        "load_weights",
        "make_scratch",
        "train_step",
        "pinned_staging",
        "cudaMallocHost (host)",
    ] {
        assert!(names.iter().any(|n| n == f), "no {f} frame in {names:?}");
    }
    assert!(
        !names.iter().any(|n| n == "alloc_activations"),
        "freed before exit: {names:?}"
    );

    // The table: three rows, largest first, and their totals.
    let rows = tags(dom, "class=\"leak-row");
    assert_eq!(rows.len(), 3);
    let sums: Vec<(&str, &str)> = tags(dom, "data-sum=")
        .into_iter()
        .map(|t| (attr(t, "data-key").unwrap(), attr(t, "data-sum").unwrap()))
        .collect();
    assert_eq!(
        sums,
        [("bytes", (72 * MIB).to_string().as_str()), ("blocks", "6")]
    );
    assert!(
        dom.contains(">64.0 MiB<") && dom.contains(">growing<"),
        "size and trend shown"
    );
    assert!(dom.contains(">3 groups<"), "groups counted in words");
    assert!(
        dom.contains("cudaleak: 72.0 MiB (75497472 bytes) leaked in 6 blocks"),
        "the header's summary reads as the text report does"
    );
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn names_from_the_report_cannot_break_out_of_the_page() {
    let dir = TempDir::new("html-escape");
    let path = "/src/</script><script>document.title='pwned'</script><!--\u{2028}x&amp;.c";
    let function = "stage</SCRIPT><img src=x onerror=alert(1)>\u{2029}";
    write(
        dir.path(),
        &report(1, "exit", 7, None, vec![pinned(path, function)]),
    );
    let page = cli_page(&["report", "--format", "html", "."], dir.path(), "escape.html");
    let html = std::fs::read_to_string(&page).unwrap();
    // The template's two script elements end; nothing from the data does.
    assert_eq!(html.to_ascii_lowercase().matches("</script").count(), 2);
    assert!(!html.contains('\u{2028}') && !html.contains('\u{2029}'));
    assert!(!html.contains("<img"));
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let r = render(&chrome, &page, "escape");
    check_rendered(&r).unwrap();
    assert!(
        !r.dom.contains("pwned</title>") && !r.dom.contains("<img"),
        "markup from the report ran"
    );
    // The names arrive intact, as text.
    let names = names_in_flame(&r.dom);
    assert!(
        names.iter().any(|n| n.starts_with("stage&lt;/SCRIPT&gt;&lt;img")),
        "{names:?}"
    );
    // The table's call site: the group's label, the file by its name
    // (after the path's last '/'), as text.
    let site = r.dom.split("<tr class=\"leak-row").nth(1).unwrap();
    let site = &site[..site.find("</tr>").unwrap()];
    assert!(
        site.contains("stage&lt;/SCRIPT&gt;&lt;img src=x onerror=alert(1)&gt;")
            && site.contains(" script&gt;&lt;!--"),
        "{site}"
    );
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn a_page_that_does_not_draw_fails_the_check() {
    let dir = TempDir::new("html-blank");
    training_run(dir.path());
    let page = cli_page(&["report", "--format", "html", "."], dir.path(), "report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    // The same page without its script, and with data that does not parse.
    let script_start = html.find("<script>").unwrap();
    let blank = format!("{}</body></html>", &html[..script_start]);
    std::fs::write(dir.path().join("blank.html"), blank).unwrap();
    let data_start = html.find("id=\"cudaleak-data\">").unwrap() + "id=\"cudaleak-data\">".len();
    let broken = format!("{}{{not json{}", &html[..data_start], &html[data_start + 1..]);
    std::fs::write(dir.path().join("broken.html"), broken).unwrap();
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let blank = render(&chrome, &dir.path().join("blank.html"), "blank");
    let e = check_rendered(&blank).unwrap_err();
    assert!(e.contains("did not finish"), "{e}");
    let broken = render(&chrome, &dir.path().join("broken.html"), "broken");
    let e = check_rendered(&broken).unwrap_err();
    assert!(e.contains("cannot draw this report"), "{e}");
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn diff_page_shows_growth_stack_by_stack() {
    let dir = TempDir::new("html-diff");
    training_run(dir.path());
    let files: Vec<String> = {
        let mut f: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        f.sort();
        f
    };
    let first = files.iter().find(|f| f.ends_with(".1.interval.json")).unwrap();
    let last = files.iter().find(|f| f.ends_with(".4.exit.json")).unwrap();
    let page = cli_page(
        &["diff", "--format", "html", first, last],
        dir.path(),
        "diff.html",
    );
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let r = render(&chrome, &page, "diff");
    check_rendered(&r).unwrap();
    assert_eq!(
        tags(&r.dom, "class=\"leak-row").len(),
        2,
        "scratch grew, pinned is new"
    );
    assert!(r.dom.contains("class=\"badge grew\"") && r.dom.contains("class=\"badge new\""));
    let names = names_in_flame(&r.dom);
    assert!(names.iter().any(|n| n == "make_scratch") && names.iter().any(|n| n == "pinned_staging"));
    assert!(
        !names.iter().any(|n| n == "load_weights"),
        "unchanged: not in the growth graph"
    );
    let sums: Vec<(&str, &str)> = tags(&r.dom, "data-sum=")
        .into_iter()
        .map(|t| (attr(t, "data-key").unwrap(), attr(t, "data-sum").unwrap()))
        .collect();
    assert_eq!(sums[0], ("bytes_delta", (7 * MIB).to_string().as_str()));
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn merge_page_puts_ranks_side_by_side_and_marks_the_odd_one() {
    let dir = TempDir::new("html-merge");
    for rank in 0..4 {
        let mut leaks = vec![weights(64 * MIB)];
        if rank == 2 {
            leaks.push(scratch(512));
        }
        write(dir.path(), &report(1, "exit", 100 + rank, Some(rank), leaks));
    }
    let page = cli_page(&["merge", "--format", "html", "."], dir.path(), "merge.html");
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let r = render(&chrome, &page, "merge");
    check_rendered(&r).unwrap();
    let ranks: Vec<&str> = tags(&r.dom, "data-label=\"rank ")
        .into_iter()
        .filter(|t| t.starts_with("<div"))
        .collect();
    assert_eq!(ranks.len(), 4, "{ranks:?}");
    let odd: Vec<&str> = ranks
        .iter()
        .filter(|t| t.contains("outlier"))
        .filter_map(|t| attr(t, "data-label"))
        .collect();
    assert_eq!(odd, ["rank 2"]);
    assert!(r.dom.contains(">odd one out<"));
    assert!(
        r.dom.contains("only rank 2"),
        "the group on one rank only is marked"
    );
    assert_eq!(tags(&r.dom, "class=\"leak-row").len(), 2);
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn svg_flame_graph_is_weighted_by_bytes() {
    let dir = TempDir::new("html-svg");
    training_run(dir.path());
    let page = cli_page(&["report", "--format", "svg", "."], dir.path(), "report.svg");
    let svg = std::fs::read_to_string(&page).unwrap();
    assert!(svg.contains("<svg") && svg.contains("</svg>"));
    for f in ["load_weights", "make_scratch", "pinned_staging", "train_step"] {
        assert!(svg.contains(f), "no {f} in the SVG");
    }
    // 64 MiB of the 72 MiB leaked, as inferno writes it in the title.
    assert!(
        svg.contains("load_weights (67,108,864 bytes, 88.89%)"),
        "weight in bytes"
    );
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let r = render(&chrome, &page, "svg");
    assert!(r.console.is_empty(), "{:?}", r.console);
}

/// A big report stays near the ~2 MB goal: 3000 groups of 40 frames, the
/// outer 30 shared (as stacks of one program are), give a page of at most
/// 1000 groups in which each distinct frame is stored once.
#[test]
fn a_large_report_makes_a_page_of_at_most_two_megabytes() {
    let dir = TempDir::new("html-size");
    let shared: Vec<Value> = (0..30)
        .map(|i| {
            native(
                &format!("torch::autograd::engine::frame_{i}"),
                "/src/torch/csrc/engine.cpp",
                i,
            )
        })
        .collect();
    let leaks: Vec<Value> = (0..3000u64)
        .map(|g| {
            let mut stack: Vec<Value> = (0..10)
                .map(|i| {
                    native(
                        &format!("at::native::kernel_{g}_{i}"),
                        "/src/aten/native/cuda/Kernel.cu",
                        i,
                    )
                })
                .collect();
            stack.extend(shared.iter().cloned());
            group(1000 + g, 1, "cudaMalloc", "device", stack, vec![])
        })
        .collect();
    write(dir.path(), &report(1, "exit", 9, None, leaks));
    let page = cli_page(&["report", "--format", "html", "."], dir.path(), "big.html");
    let size = std::fs::metadata(&page).unwrap().len();
    assert!(size <= 2 << 20, "{size} bytes");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("\"groups_cut\":2000"), "the rest are counted");
}

/// The start tag of the element with `id`.
fn by_id<'a>(dom: &'a str, id: &str) -> &'a str {
    tags(dom, &format!("id=\"{id}\""))
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no #{id}"))
}

/// The text of the element with `id` (its first text, up to its first
/// child's end: enough for a one-line element).
fn text_of(dom: &str, id: &str) -> String {
    let start = dom.find(&format!("id=\"{id}\"")).unwrap();
    let rest = &dom[start..];
    let rest = &rest[rest.find('>').unwrap() + 1..];
    let mut out = String::new();
    let mut in_tag = false;
    let mut depth = 0i32;
    let mut i = 0;
    let b = rest.as_bytes();
    while i < b.len() {
        if b[i] == b'<' {
            in_tag = true;
            if rest[i..].starts_with("</") {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            } else {
                depth += 1;
            }
        } else if b[i] == b'>' {
            in_tag = false;
            if i > 0 && b[i - 1] == b'/' {
                depth -= 1;
            }
        } else if !in_tag {
            out.push(b[i] as char);
        }
        i += 1;
    }
    out.replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
}

/// tests/python/oom.py under the library on a device of 64 MiB (as
/// tests/oom.rs runs it): 32 MiB of weights and 4 x 6 MiB of cache held,
/// then a request of 40 MiB fails twice.
fn python_oom_run() -> (Outcome, PathBuf) {
    let script = repo().join("tests/python/oom.py");
    let out = run_test_python(
        "oom.py",
        &[
            ("SIMCUDA_DEVICE_BYTES", "67108864"),
            ("CUDALEAK_TIMELINE", "10ms"),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    (out, script)
}

fn report_file(dir: &Path, trigger: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(&format!(".{trigger}.json")))
        .unwrap_or_else(|| panic!("no {trigger} report in {}", dir.display()))
}

/// The page of an `oom` report shows the failed request first
/// (API, size, free/total, its stack), marks the out-of-memory moment and
/// the peak on the timeline, and draws the peak's flame graph beside the
/// leaks'. The exit report's page marks the same moment.
#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn oom_page_shows_the_failed_request_first_and_marks_it_and_the_peak() {
    let (out, script) = python_oom_run();
    let dir = out.dir.path();
    let oom_file = report_file(dir, "oom");
    let exit_file = report_file(dir, "exit");
    let oom = cudaleak_core::report::Report::read(&oom_file).unwrap();
    let exit = cudaleak_core::report::Report::read(&exit_file).unwrap();
    let page = cli_page(
        &["report", "--format", "html", oom_file.to_str().unwrap()],
        dir,
        "oom.html",
    );
    let exit_page = cli_page(
        &["report", "--format", "html", exit_file.to_str().unwrap()],
        dir,
        "exit.html",
    );
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let r = render(&chrome, &page, "oom");
    check_rendered(&r).unwrap();
    let dom = &r.dom;
    // First: before the timeline, the flame graphs and the table.
    let section = by_id(dom, "oom-section");
    assert!(
        attr(section, "hidden").is_none() && !section.contains(" hidden"),
        "{section}"
    );
    let at = |id: &str| dom.find(&format!("id=\"{id}\"")).unwrap();
    assert!(at("oom-section") < at("timeline-section"));
    assert!(at("oom-section") < at("flame-section"));
    assert!(at("oom-section") < at("table-section"));
    let request = text_of(dom, "oom-request");
    assert!(
        request.starts_with("cudaMalloc of 40.0 MiB (41943040 bytes) failed (device 0: free 8.00 MiB of 64.0 MiB); 2 failed calls within 1 s"),
        "{request}"
    );
    // Its stack, Python-first: the request's line, then its callers.
    let stack = text_of(dom, "oom-stack");
    let line = line_of("tests/python/oom.py", "# OOM request");
    let request_at = format!("request [python]  {}:{line}", script.display());
    assert!(stack.contains(&request_at), "{stack}");
    assert!(
        stack.contains("step [python]") && stack.contains("<module> [python]"),
        "{stack}"
    );
    assert!(
        !stack.contains("_PyEval_EvalFrame"),
        "interpreter frames folded: {stack}"
    );
    // The timeline marks the out-of-memory moment and the peak.
    let marks = tags(dom, "class=\"oom-marker\"");
    assert_eq!(marks.len(), 1, "{marks:?}");
    let o = oom.oom.as_ref().unwrap();
    assert_eq!(
        attr(marks[0], "data-t-ms"),
        Some(o.timestamp_ms.to_string().as_str())
    );
    assert_eq!(attr(marks[0], "data-bytes"), Some("41943040"));
    let peak = oom.peak.as_ref().unwrap();
    let peaks = tags(dom, "class=\"process-peak\"");
    assert_eq!(peaks.len(), 1, "{peaks:?}");
    assert_eq!(
        attr(peaks[0], "data-bytes"),
        Some(peak.bytes.to_string().as_str())
    );
    assert_eq!(
        attr(peaks[0], "data-t-ms"),
        Some(peak.timestamp_ms.to_string().as_str())
    );
    assert_eq!(peak.bytes, 56 * MIB, "weights and cache");
    // The peak's flame graph beside the leaks': weights and cache.
    let peak_section = by_id(dom, "peak-flame-section");
    assert!(!peak_section.contains(" hidden"), "{peak_section}");
    assert!(by_id(dom, "flames").contains("class=\"two\""));
    let peak_dom = &dom[at("peak-flame")..at("table-section")];
    let names = names_in_flame(peak_dom);
    for f in ["all", "main", "load_weights", "fill_cache"] {
        assert!(
            names.iter().any(|n| n == f),
            "no {f} in the peak's flame graph: {names:?}"
        );
    }
    assert!(
        text_of(dom, "peak-flame-title").contains("56.0 MiB live"),
        "{}",
        text_of(dom, "peak-flame-title")
    );

    // The exit report's page: the same moment marked, no request section.
    let r = render(&chrome, &exit_page, "oom-exit");
    check_rendered(&r).unwrap();
    assert!(by_id(&r.dom, "oom-section").contains(" hidden"));
    let marks = tags(&r.dom, "class=\"oom-marker\"");
    assert_eq!(marks.len(), exit.oom_events.len());
    assert_eq!(marks.len(), 1);
    assert_eq!(
        attr(marks[0], "data-t-ms"),
        Some(exit.oom_events[0].timestamp_ms.to_string().as_str())
    );
    assert_eq!(tags(&r.dom, "class=\"process-peak\"").len(), 1);
}

/// A PyTorch cache segment is labelled as such in the table
/// and the flame graph, with the text report's hint about `--pytorch`.
#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn pytorch_cache_segments_are_labelled_on_the_page() {
    let exe = torch_cache_program();
    let out = run_traced(&exe, &[], &[]);
    out.assert_success();
    let file = report_file(out.dir.path(), "exit");
    let page = cli_page(
        &["report", "--format", "html", file.to_str().unwrap()],
        out.dir.path(),
        "torch.html",
    );
    // The text report's words, on the page too.
    let text = String::from_utf8(
        Command::new(cli())
            .arg("report")
            .arg(&file)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(text.contains("hint: groups marked \"PyTorch cache segment\""));
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let r = render(&chrome, &page, "torch-cache");
    check_rendered(&r).unwrap();
    let dom = &r.dom;
    let badges = tags(dom, "class=\"badge cache-segment\"");
    assert_eq!(
        badges.len(),
        1,
        "one group of 20 MiB is a cache segment: {badges:?}"
    );
    assert!(attr(badges[0], "title")
        .unwrap()
        .starts_with("(PyTorch cache segment: memory the caching allocator reserved"));
    let rows = tags(dom, "class=\"leak-row");
    assert!(rows.len() >= 2);
    let hint = by_id(dom, "pytorch-hint");
    assert!(!hint.contains(" hidden"));
    let hint = text_of(dom, "pytorch-hint");
    assert!(
        hint.starts_with("hint: groups marked \"PyTorch cache segment\""),
        "{hint}"
    );
    assert!(hint.contains("cudaleak run --pytorch"), "{hint}");
    // One leaf in the leaks' flame graph and one in the peak's.
    let cache_frames = tags(dom, "class=\"frame cache-segment\"");
    assert_eq!(cache_frames.len(), 2);
    let split = dom.find("id=\"peak-flame\"").unwrap();
    assert_eq!(tags(&dom[..split], "class=\"frame cache-segment\"").len(), 1);
    assert!(attr(cache_frames[0], "data-name")
        .unwrap()
        .ends_with("PyTorch cache segment"));
}

/// A script appended to a copy of a page, run after the page's own: it
/// measures what only a browser knows and writes it as JSON into
/// `<pre id="measure">`, which `--dump-dom` then carries.
const MEASURE: &str = r##"<script>
(function () {
  var out = { overlaps: [], labels: 0, legend: [], frames: [], mismatches: [], keyed: {}, keys: {}, tips: [], sites: [] };
  function visible(t) {
    if (t.closest("[display=none]") || t.getAttribute("display") === "none") return false;
    var r = t.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && t.textContent.length > 0;
  }
  ["timeline", "flame", "peak-flame"].forEach(function (id) {
    var box = document.getElementById(id);
    if (!box) return;
    var texts = Array.prototype.filter.call(box.querySelectorAll("svg text"), visible);
    out.labels += texts.length;
    var rects = texts.map(function (t) { return t.getBoundingClientRect(); });
    for (var i = 0; i < rects.length; i++) for (var j = i + 1; j < rects.length; j++) {
      var a = rects[i], b = rects[j];
      if (a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5)
        out.overlaps.push(id + ": " + JSON.stringify(texts[i].textContent) + " meets " + JSON.stringify(texts[j].textContent));
    }
    // A label inside a flame graph's box stays inside it.
    Array.prototype.forEach.call(box.querySelectorAll("g.frame"), function (g) {
      var t = g.querySelector("text"), r = g.querySelector("rect");
      if (!t || !visible(t)) return;
      var tb = t.getBoundingClientRect(), rb = r.getBoundingClientRect();
      if (tb.right > rb.right + 0.5) out.overlaps.push(id + ": " + JSON.stringify(t.textContent) + " leaves its box");
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll("#timeline-legend .legend-item"), function (it) {
    var fig = it.querySelector(".legend-bytes");
    var g = it.getAttribute("data-group");
    var row = g === null ? null : document.querySelector("#leaks tr.leak-row[data-index='" + g + "']");
    var cell = row ? row.querySelector("td").textContent : null;
    var peak = it.querySelector(".legend-peak");
    out.legend.push({ label: it.getAttribute("data-label"), group: g === null ? null : Number(g),
      bytes: fig ? Number(fig.getAttribute("data-bytes")) : null, shown: fig ? fig.textContent : null, table: cell,
      at_peak: peak ? Number(peak.getAttribute("data-bytes")) : null, text: it.textContent });
  });
  // Frames numbered for the key under a flame graph, with their label
  // as shown, and the key's lines.
  ["flame", "peak-flame"].forEach(function (id) {
    out.keyed[id] = [];
    out.keys[id] = [];
    Array.prototype.forEach.call(document.querySelectorAll("#" + id + " g.frame[data-key]"), function (g) {
      var t = g.querySelector("text");
      out.keyed[id].push({ key: g.getAttribute("data-key"), name: g.getAttribute("data-name"),
        text: t ? t.textContent : "", visible: !!t && visible(t) });
    });
    Array.prototype.forEach.call(document.querySelectorAll("#" + id + " .flame-key li"), function (li) {
      out.keys[id].push({ key: li.getAttribute("data-key"), name: li.getAttribute("data-name"), text: li.textContent,
        bytes: Number(li.getAttribute("data-bytes")) });
    });
  });
  // The tooltips of the leaks' flame graph's leaves (the API's boxes).
  Array.prototype.forEach.call(document.querySelectorAll("#flame g.frame"), function (g) {
    if (g.querySelector("rect").getAttribute("fill") !== "#e8a33d") return;
    var r = g.querySelector("rect").getBoundingClientRect();
    g.dispatchEvent(new MouseEvent("mousemove", { clientX: r.left + 1, clientY: r.top + 1, bubbles: true }));
    out.tips.push(document.getElementById("tooltip").textContent);
  });
  Array.prototype.forEach.call(document.querySelectorAll("#leaks tr.leak-row"), function (tr) {
    var cells = tr.querySelectorAll("td");
    out.sites.push({ bytes: cells[0].getAttribute("title"), site: cells[cells.length - 1].textContent });
  });
  ["flame", "peak-flame"].forEach(function (id) {
    Array.prototype.forEach.call(document.querySelectorAll("#" + id + " g.frame"), function (g) {
      out.frames.push(g.getAttribute("data-name"));
    });
  });
  var pre = document.createElement("pre");
  pre.id = "measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"##;

/// The page of `page` with [`MEASURE`] appended, rendered; what it measured.
fn measure(chrome: &Path, page: &Path, name: &str) -> (Rendered, Value) {
    measure_at(chrome, page, name, 1200)
}

/// [`measure`] in a window `width` pixels wide.
fn measure_at(chrome: &Path, page: &Path, name: &str, width: u32) -> (Rendered, Value) {
    let html = std::fs::read_to_string(page).unwrap();
    let measured = page.with_extension("measure.html");
    let at = html.rfind("</body>").unwrap();
    std::fs::write(&measured, format!("{}{MEASURE}{}", &html[..at], &html[at..])).unwrap();
    let r = render_at(chrome, &measured, name, width);
    let start = r
        .dom
        .find("<pre id=\"measure\">")
        .expect("the measuring script ran")
        + "<pre id=\"measure\">".len();
    let end = start + r.dom[start..].find("</pre>").unwrap();
    let text = r.dom[start..end]
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let v: Value = serde_json::from_str(&text).unwrap();
    (r, v)
}

/// Frames the text report folds away: their names, as the core's rule
/// (`render::is_noise`) sees them.
fn is_machinery(name: &str) -> bool {
    let f = cudaleak_core::report::NativeFrame {
        address: "0x0".into(),
        function: Some(name.into()),
        file: None,
        line: None,
        module: None,
        offset: None,
        build_id: None,
    };
    cudaleak_core::report::render::is_noise(&f)
}

/// The page of a Python program with 60 leaking call sites,
/// 3,600 allocations and 2,445 leaked blocks stays readable. The legend's
/// figures are the table's, the sites that grow late and the peak's are
/// drawn (not lost to "other"), no two labels meet, no interpreter frame
/// shows by default, and ticks read as round numbers.
#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn a_page_of_sixty_call_sites_stays_readable() {
    let out = run_test_python("sixty_sites.py", &[("CUDALEAK_TIMELINE", "10ms")]);
    assert_eq!(out.stdout, "held 2445 blocks\n", "{}", out.stderr);
    let r = out.report();
    assert_eq!(r.totals.allocations, 3600);
    assert_eq!(r.leaked_blocks(), 2445);
    assert_eq!(r.leaks.len(), 60);
    let page = cli_page(&["report", "--format", "html", "."], out.dir.path(), "sixty.html");
    let svg = cli_page(&["report", "--format", "svg", "."], out.dir.path(), "sixty.svg");
    let full_svg = cli_page(
        &["report", "--format", "svg", "--full-stacks", "."],
        out.dir.path(),
        "sixty-full.svg",
    );
    // Kept for the docs' screenshot (docs/images/).
    let shots = target_dir().join("html-tests");
    std::fs::create_dir_all(&shots).unwrap();
    std::fs::copy(&page, shots.join("sixty.html")).unwrap();
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let (rendered, m) = measure(&chrome, &page, "sixty");
    check_rendered(&rendered).unwrap();
    let dom = &rendered.dom;

    // No two labels meet, and there are labels to meet.
    assert!(m["labels"].as_u64().unwrap() >= 15, "{m}");
    assert_eq!(m["overlaps"], json!([]), "labels meet");

    // The legend's figures are the table's, for every site shown.
    let legend = m["legend"].as_array().unwrap();
    let sites: Vec<&Value> = legend.iter().filter(|l| l["label"] != "other").collect();
    assert_eq!(sites.len(), 12, "{legend:?}");
    for l in &sites {
        let g = l["group"]
            .as_u64()
            .unwrap_or_else(|| panic!("not linked to the table: {l}")) as usize;
        assert_eq!(l["bytes"].as_u64(), Some(r.leaks[g].bytes), "{l}");
        assert_eq!(l["shown"], l["table"], "{l}");
    }
    // The largest at the end are there (the sites that grew late, 30 MiB
    // each: not lost to "other").
    let drawn: Vec<u64> = sites.iter().map(|l| l["group"].as_u64().unwrap()).collect();
    for g in 0..6u64 {
        assert!(drawn.contains(&g), "row {g} of the table is not drawn: {drawn:?}");
    }
    let label_of = |g: usize| {
        r.leaks[g]
            .python_stack
            .first()
            .map(|f| f.function.clone())
            .unwrap_or_default()
    };
    let shown: Vec<String> = sites
        .iter()
        .map(|l| label_of(l["group"].as_u64().unwrap() as usize))
        .collect();
    for late in ["layer20_attn_backward", "layer25_norm_backward"] {
        assert!(shown.iter().any(|s| s == late), "{late} not drawn: {shown:?}");
    }
    // One of the peak's burst sites (1 MiB blocks at steps 36-47).
    assert!(
        shown
            .iter()
            .any(|s| s.starts_with("layer1") && s.ends_with("_backward") && {
                let n: usize = s[5..7].parse().unwrap();
                (10..20).contains(&n)
            }),
        "no site of the peak's burst drawn: {shown:?}"
    );
    // Each drawn site says why it is drawn; the peak's burst as such.
    let whys: Vec<&str> = tags(dom, "data-why=")
        .into_iter()
        .filter_map(|t| attr(t, "data-why"))
        .collect();
    assert_eq!(whys.len(), 12, "{whys:?}");
    assert!(whys.iter().any(|w| w.contains("largest at the peak")), "{whys:?}");
    assert!(whys.iter().any(|w| w.contains("fastest growing")), "{whys:?}");
    // "other" is the smaller part at the end.
    let other = tags(dom, "data-label=\"other\"");
    assert!(!other.is_empty());

    // No interpreter, ctypes or libffi frame shows by default; Python
    // frames and the CUDA call do.
    let frames: Vec<String> = m["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert!(frames.iter().any(|f| f == "<module>"), "{frames:?}");
    assert!(frames.iter().any(|f| f == "layer00_conv_forward"), "{frames:?}");
    let machinery: Vec<&String> = frames.iter().filter(|f| is_machinery(f)).collect();
    assert!(machinery.is_empty(), "machinery shown: {machinery:?}");
    assert!(
        !frames
            .iter()
            .any(|f| f.starts_with("libffi") || f.starts_with("_ctypes")),
        "{frames:?}"
    );
    // The toggle that shows them is there.
    assert!(!by_id(dom, "frames-toggle").contains(" hidden"));

    // Ticks: round numbers in the unit shown.
    let tl = &dom[dom.find("id=\"timeline\"").unwrap()..dom.find("id=\"timeline-legend\"").unwrap()];
    let mut ticks = Vec::new();
    let mut rest = tl;
    while let Some(i) = rest.find("class=\"tick\"") {
        let t = &rest[i..];
        let text = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
        ticks.push(text.to_string());
        rest = &t[1..];
    }
    let bytes_ticks: Vec<&String> = ticks
        .iter()
        .filter(|t| t.ends_with("iB") || t.ends_with(" B"))
        .collect();
    assert!(bytes_ticks.len() >= 3, "{ticks:?}");
    // One unit, evenly spaced by a step of 1, 2, 2.5 or 5 times a power
    // of ten, every tick a whole multiple of it.
    let unit = bytes_ticks[0].split(' ').nth(1).unwrap();
    assert!(bytes_ticks.iter().all(|t| t.ends_with(unit)), "{ticks:?}");
    let v: Vec<f64> = bytes_ticks
        .iter()
        .map(|t| t.split(' ').next().unwrap().parse().unwrap())
        .collect();
    let step = v[1] - v[0];
    let mantissa = step / 10f64.powf(step.log10().floor());
    assert!(
        [1.0, 2.0, 2.5, 5.0].iter().any(|m| (m - mantissa).abs() < 1e-9),
        "step {step}: {ticks:?}"
    );
    for x in &v {
        let k = x / step;
        assert!(
            (k - k.round()).abs() < 1e-9,
            "{x} is not a multiple of {step}: {ticks:?}"
        );
    }

    // `--full-stacks` opens the page with every frame shown.
    let full_page = cli_page(
        &["report", "--format", "html", "--full-stacks", "."],
        out.dir.path(),
        "sixty-full.html",
    );
    let full = render(&chrome, &full_page, "sixty-full");
    check_rendered(&full).unwrap();
    let names = names_in_flame(&full.dom);
    assert!(names.iter().any(|n| is_machinery(n)), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("_PyEval_EvalFrame")),
        "{names:?}"
    );

    // The SVG: the same Python-first view (no interpreter, ctypes or
    // libffi frame; `--full-stacks` shows them), and labels that show the
    // most telling part, never a stub cut to ".." + its last letters.
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    let full_text = std::fs::read_to_string(&full_svg).unwrap();
    for name in [
        "_PyEval_EvalFrame",
        "ffi_call",
        "_ctypes_callproc",
        "PyCFuncPtr_call",
    ] {
        assert!(!svg_text.contains(name), "{name} in the SVG");
        assert!(full_text.contains(name), "{name} not in the --full-stacks SVG");
    }
    // The native stacks end at the outermost eval loop: the
    // interpreter's start-up is not in either.
    assert!(
        !full_text.contains("Py_BytesMain"),
        "start-up frames in the --full-stacks SVG"
    );
    assert!(svg_text.contains("layer00_conv_forward [sixty_sites.py:"));
    // The labels written in the file itself (what an <img> shows, with no
    // script) follow the same rule.
    let written: Vec<&str> = svg_text
        .split("<g><title>")
        .skip(1)
        .filter_map(|g| {
            let t = &g[g.find("<text ")?..];
            Some(&t[t.find('>')? + 1..t.find("</text>")?])
        })
        .collect();
    assert!(written.len() > 60, "{}", written.len());
    assert!(
        written.iter().any(|l| l.starts_with("train [sixty_sites.py:")),
        "{written:?}"
    );
    assert!(
        !written.iter().any(|l| l.ends_with("..") || l.starts_with("..")),
        "{written:?}"
    );
    let r = render(&chrome, &svg, "sixty-svg");
    assert!(r.console.is_empty(), "{:?}", r.console);
    let labels: Vec<&str> = r
        .dom
        .split("<text ")
        .skip(1)
        .filter_map(|t| Some(&t[t.find('>')? + 1..t.find("</text>")?]))
        .collect();
    assert!(
        labels.iter().any(|l| l.starts_with("train [sixty_sites.py:")),
        "{labels:?}"
    );
    assert!(
        !labels.iter().any(|l| l.starts_with("..") || l.ends_with("..")),
        "{labels:?}"
    );
}

/// A report whose timeline has no per-site series (written
/// before they were kept) draws its sites from the samples' largest 8
/// only, and the legend says that such a series is partial.
#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn a_series_from_the_samples_largest_only_says_it_is_partial() {
    let dir = TempDir::new("html-partial");
    let mut v = report(1, "exit", 77, None, vec![weights(64 * MIB), scratch(4)]);
    let mut w = weights(64 * MIB);
    w["blocks"] = json!(0);
    let mut s = scratch(4);
    s["blocks"] = json!(0);
    let sample = |k: i64, sites: Value, other: u64| {
        json!({"timestamp_ms": T0 + k * 100, "live_bytes": 68 * MIB, "live_blocks": 5,
               "peak_bytes": 83 * MIB, "sites": sites, "other_bytes": other})
    };
    v["timeline"] = json!({
        "period_ms": 100, "samples_taken": 3, "sites": [w, s],
        "samples": [
            sample(0, json!([[0, 64 * MIB]]), 4 * MIB),
            sample(1, json!([[0, 64 * MIB]]), 4 * MIB),
            sample(2, json!([[0, 64 * MIB], [1, 4 * MIB]]), 0),
        ]
    });
    validate(&v);
    write(dir.path(), &v);
    let page = cli_page(&["report", "--format", "html", "."], dir.path(), "partial.html");
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let (r, m) = measure(&chrome, &page, "partial");
    check_rendered(&r).unwrap();
    let legend = m["legend"].as_array().unwrap();
    let scratch_item = legend
        .iter()
        .find(|l| l["label"].as_str().unwrap().contains("train_step"))
        .unwrap_or_else(|| panic!("{legend:?}"));
    assert_eq!(scratch_item["bytes"].as_u64(), Some(4 * MIB));
    assert_eq!(scratch_item["shown"], scratch_item["table"]);
    let items = tags(&r.dom, "class=\"partial\"");
    // The weights are listed at every sample: whole.
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(r
        .dom
        .contains("partial: only where it was among the 8 largest at a sample"));

    // Dumps that listed only some of their groups (CUDALEAK_MAX_GROUPS):
    // a site absent from such a dump may only have been left out.
    let dir = TempDir::new("html-partial-dumps");
    let mut first = report(1, "interval", 78, None, vec![weights(64 * MIB)]);
    first["totals"]["groups_left_out"] = json!({"groups": 1, "blocks": 3, "bytes": 3 * MIB});
    first["totals"]["live_bytes"] = json!(67 * MIB);
    validate(&first);
    write(dir.path(), &first);
    write(
        dir.path(),
        &report(2, "exit", 78, None, vec![weights(64 * MIB), scratch(4)]),
    );
    let page = cli_page(
        &["report", "--format", "html", "."],
        dir.path(),
        "partial-dumps.html",
    );
    let r = render(&chrome, &page, "partial-dumps");
    check_rendered(&r).unwrap();
    assert_eq!(tags(&r.dom, "class=\"partial\"").len(), 1);
    assert!(r.dom.contains("partial: not listed at every dump"));
}

/// The lines of tests/c/sixty_helper.c that define its sites, in order
/// (the lines that start with `SITE(`).
fn c_site_lines() -> Vec<i64> {
    let text = std::fs::read_to_string(repo().join("tests/c/sixty_helper.c")).unwrap();
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("SITE("))
        .map(|(i, _)| i as i64 + 1)
        .collect()
}

/// A program whose 60 call sites all allocate through one helper, `raw`
/// (tests/python/sixty_helper.py, tests/c/sixty_helper.c): every view
/// tells the sites apart, with the labels of the text report. The table's
/// "call site" is the run of frames that no other site shares (`raw
/// sixty_helper.py:25 < augment_7 sixty_helper.py:61`), the leaves'
/// tooltips name their sites, the legend names the exact figure at the
/// peak beside the sampled maximum, and at 1,280 pixels the ten sites that
/// hold the most carry a label in both flame graphs: a number, with their
/// names in the key under the graph.
fn sixty_sites_through_one_helper(
    out: &Outcome,
    file: &str,
    helper_line: i64,
    site_lines: &[i64],
    name: &str,
) {
    let r = out.report();
    assert_eq!(r.leaks.len(), 60, "{}", out.stderr);
    assert_eq!(r.leaked_bytes(), 1830 * 65536);
    let page = cli_page(
        &["report", "--format", "html", "."],
        out.dir.path(),
        &format!("{name}.html"),
    );
    let chrome = required(
        chromium(),
        "Chromium (apt-get install chromium, or set CUDALEAK_CHROMIUM)",
    );
    let (rendered, m) = measure_at(&chrome, &page, name, 1280);
    check_rendered(&rendered).unwrap();
    assert_eq!(m["overlaps"], json!([]), "labels meet");
    let label = |i: usize| format!("raw {file}:{helper_line} < augment_{i} {file}:{}", site_lines[i]);

    // The table: each row its own site, the one that allocated its bytes.
    let rows = m["sites"].as_array().unwrap();
    assert_eq!(rows.len(), 60, "{rows:?}");
    for row in rows {
        let bytes: u64 = row["bytes"]
            .as_str()
            .unwrap()
            .trim_end_matches(" bytes")
            .parse()
            .unwrap();
        let i = (bytes / 65536 - 1) as usize;
        assert_eq!(row["site"], label(i), "{row}");
    }

    // The leaves' tooltips name their sites.
    let tips = m["tips"].as_array().unwrap();
    assert_eq!(tips.len(), 60, "{tips:?}");
    for i in [0, 7, 59] {
        let want = format!("call site: {}", label(i));
        assert!(
            tips.iter().any(|t| t.as_str().unwrap().contains(&want)),
            "no tooltip says {want:?}: {tips:?}"
        );
    }

    // The ten largest sites are numbered in both flame graphs, the largest
    // first, and the key names them with their bytes.
    for id in ["flame", "peak-flame"] {
        let keyed = m["keyed"][id].as_array().unwrap();
        let keys = m["keys"][id].as_array().unwrap();
        assert_eq!(keyed.len(), 10, "{id}: {keyed:?}");
        assert_eq!(keys.len(), 10, "{id}: {keys:?}");
        for (k, site) in (50..60).rev().enumerate() {
            let num = (k + 1).to_string();
            let frame = keyed
                .iter()
                .find(|f| f["key"] == json!(num))
                .unwrap_or_else(|| panic!("{id}: no frame numbered {num}: {keyed:?}"));
            assert_eq!(frame["name"], format!("augment_{site}"), "{id}: {frame}");
            assert_eq!(frame["visible"], true, "{id}: {frame}");
            assert!(frame["text"].as_str().unwrap().starts_with(&num), "{id}: {frame}");
            let line = &keys[k];
            assert_eq!(line["key"], json!(num), "{id}: {line}");
            assert_eq!(line["name"], format!("augment_{site}"), "{id}: {line}");
            assert_eq!(line["bytes"], (site as u64 + 1) * 65536, "{id}: {line}");
            let text = line["text"].as_str().unwrap();
            assert!(
                text.contains(&format!("augment_{site} ")) && text.contains("sixty_helper."),
                "{id}: {line}"
            );
        }
    }

    // The SVG numbers the same ten, in the file itself and after its
    // script ran in a browser, and its key names them.
    let svg = cli_page(
        &["report", "--format", "svg", "."],
        out.dir.path(),
        &format!("{name}.svg"),
    );
    let written = std::fs::read_to_string(&svg).unwrap();
    let shown = render(&chrome, &svg, &format!("{name}-svg"));
    assert!(shown.console.is_empty(), "{:?}", shown.console);
    for (what, dom) in [("file", written.as_str()), ("browser", shown.dom.as_str())] {
        for (k, site) in (50..60).rev().enumerate() {
            let num = k + 1;
            let g = dom
                .split(&format!("<g data-key=\"{num}\">"))
                .nth(1)
                .unwrap_or_else(|| panic!("{what}: no frame numbered {num}"));
            let g = &g[..g.find("</g>").unwrap()];
            assert!(g.starts_with(&format!("<title>augment_{site} ")), "{what}: {g}");
            let text = &g[g.find("<text ").unwrap()..];
            let text = &text[text.find('>').unwrap() + 1..text.find("</text>").unwrap()];
            assert!(
                text == num.to_string() || text.starts_with(&format!("{num} ")),
                "{what}: {g}"
            );
            let line = dom
                .split("class=\"key-line\"")
                .skip(1)
                .map(|l| &l[..l.find("</text>").unwrap()])
                .find(|l| l.contains(&format!("data-key=\"{num}\">")))
                .unwrap_or_else(|| panic!("{what}: no key line {num}"));
            let line = &line[line.find('>').unwrap() + 1..];
            // Python frames carry their place, as every picture's do.
            let place = match file.ends_with(".py") {
                true => format!(" [{file}:{}]", site_lines[site]),
                false => String::new(),
            };
            let bytes = (site as u64 + 1) * 65536;
            let pct = bytes as f64 * 100.0 / (1830.0 * 65536.0);
            let want = format!(
                "{num}  augment_{site}{place} ({} bytes, {pct:.2}%)",
                grouped(bytes)
            );
            assert_eq!(line, want, "{what}");
        }
        assert!(!dom.contains("<g data-key=\"11\">"), "{what}");
        // A leaf's tooltip (its title) names its call site.
        let leaf = format!("<title>cudaMalloc [at {}] (", label(59).replace('<', "&lt;"));
        assert!(dom.contains(&leaf), "{what}: no {leaf}");
    }

    // The legend of the sampled timeline: the exact figure at the peak,
    // named as such, where the samples may have missed it.
    let legend = m["legend"].as_array().unwrap();
    let sites: Vec<&Value> = legend.iter().filter(|l| l["label"] != "other").collect();
    assert!(!sites.is_empty(), "{legend:?}");
    for l in &sites {
        let g = l["group"].as_u64().unwrap() as usize;
        assert_eq!(l["at_peak"].as_u64(), Some(r.leaks[g].bytes), "{l}");
        assert!(l["text"].as_str().unwrap().contains(", at the peak "), "{l}");
        assert!(
            !l["text"].as_str().unwrap().contains(" max ")
                || l["text"].as_str().unwrap().contains("sampled max"),
            "{l}"
        );
    }
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn sixty_python_sites_through_one_helper_are_told_apart_on_the_page() {
    let out = run_test_python("sixty_helper.py", &[("CUDALEAK_TIMELINE", "10ms")]);
    out.assert_success();
    let file = "tests/python/sixty_helper.py";
    sixty_sites_through_one_helper(
        &out,
        "sixty_helper.py",
        line_of(file, "nbytes)  # HELPER"),
        &support::lines_of(file, "UNIT))  # SITE "),
        "sixty-helper-py",
    );
}

#[test]
#[ignore = "needs Chromium; scripts/test.sh runs it (cargo test --test html -- --ignored)"]
fn sixty_c_sites_through_one_helper_are_told_apart_on_the_page() {
    let out = run_traced(
        &support::program("sixty_helper"),
        &[],
        &[("CUDALEAK_TIMELINE", "10ms")],
    );
    out.assert_success();
    sixty_sites_through_one_helper(
        &out,
        "sixty_helper.c",
        line_of("tests/c/sixty_helper.c", "/* HELPER */"),
        &c_site_lines(),
        "sixty-helper-c",
    );
}

/// `n` with a comma between thousands, as inferno writes counts.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
