//! Snapshot tests: the text, folded and JSON renderings of fixed reports
//! (tests/snapshots/*.json), compared with the files beside them. A slip in
//! wording, a total or an order shows up as a diff. After an intended
//! change, `UPDATE_SNAPSHOTS=1 cargo test --release --test snapshots`
//! rewrites them; review the diff before committing.

mod support;

use std::time::Duration;
use support::*;

/// Output with what differs between machines and runs replaced: the
/// repository's path, and absolute addresses (offsets are short and stay).
fn normalize(text: &str) -> String {
    let repo = repo().display().to_string();
    let mut out = String::with_capacity(text.len());
    let text = text.replace(&repo, "<repo>");
    let mut rest = text.as_str();
    while let Some(at) = rest.find("0x") {
        out.push_str(&rest[..at]);
        let hex = rest[at + 2..]
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len() - at - 2);
        if hex >= 9 {
            out.push_str("0xADDRESS");
        } else {
            out.push_str(&rest[at..at + 2 + hex]);
        }
        rest = &rest[at + 2 + hex..];
    }
    out.push_str(rest);
    out
}

fn assert_snapshot(name: &str, actual: &str) {
    let path = repo().join("tests/snapshots").join(format!("{name}.snap"));
    let actual = normalize(actual);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        let new = path.with_extension("snap.new");
        std::fs::write(&new, &actual).unwrap();
        panic!(
            "{name}: output differs from {} (new output in {}; UPDATE_SNAPSHOTS=1 accepts it)\n--- expected\n{expected}\n--- actual\n{actual}",
            path.display(),
            new.display()
        );
    }
}

fn render(args: &[&str]) -> String {
    let (status, stdout, stderr) = run_command(cli_command(args, &repo()), Duration::from_secs(60));
    assert!(status.success(), "{args:?}: {stderr}");
    stdout
}

const FIXTURE: &str = "tests/snapshots/python_report.json";

#[test]
fn text_of_a_fixed_report() {
    assert_snapshot(
        "python_report.text",
        &render(&["report", "--no-symbolize", FIXTURE]),
    );
}

#[test]
fn text_with_full_stacks_and_top() {
    assert_snapshot(
        "python_report.full_top1.text",
        &render(&["report", "--no-symbolize", "--full-stacks", "--top", "1", FIXTURE]),
    );
}

#[test]
fn folded_of_a_fixed_report() {
    assert_snapshot(
        "python_report.folded",
        &render(&["report", "--no-symbolize", "--format", "folded", FIXTURE]),
    );
}

#[test]
fn json_of_a_fixed_report() {
    let out = render(&[
        "report",
        "--no-symbolize",
        "--format",
        "json",
        "--top",
        "2",
        FIXTURE,
    ]);
    validate(&serde_json::from_str(&out).unwrap());
    assert_snapshot("python_report.json", &out);
}

#[test]
fn diff_and_merge_of_fixed_reports() {
    let d = TempDir::new("snap-merge");
    let fixture = std::fs::read_to_string(repo().join(FIXTURE)).unwrap();
    for (rank, pid) in [(0, 100), (1, 101)] {
        let mut v: serde_json::Value = serde_json::from_str(&fixture).unwrap();
        v["rank"] = rank.into();
        v["pid"] = pid.into();
        if rank == 1 {
            v["leaks"].as_array_mut().unwrap().truncate(1);
        }
        let name = format!("cudaleak.h.{pid}.r{rank}.json");
        std::fs::write(d.path().join(name), v.to_string()).unwrap();
    }
    let dir = d.path().to_str().unwrap();
    let merged = render(&["merge", "--no-symbolize", dir]).replace(dir, "<dir>");
    assert_snapshot("merge.text", &merged);
    let json = render(&["merge", "--no-symbolize", "--format", "json", dir]);
    validate(&serde_json::from_str(&json).unwrap());
    let a = d.path().join("cudaleak.h.101.r1.json");
    let b = d.path().join("cudaleak.h.100.r0.json");
    let diff =
        render(&["diff", "--no-symbolize", a.to_str().unwrap(), b.to_str().unwrap()]).replace(dir, "<dir>");
    assert_snapshot("diff.text", &diff);
}

#[test]
fn text_of_a_fixed_timeline() {
    assert_snapshot(
        "timeline.text",
        &render(&["report", "tests/snapshots/timeline_fixture.timeline.json"]),
    );
}

#[test]
fn normalizing_keeps_offsets_and_hides_addresses() {
    assert_eq!(
        normalize("#1 0x7f0000001800 (libk.so+0x1800) at 0x55aa00001234"),
        "#1 0xADDRESS (libk.so+0x1800) at 0xADDRESS"
    );
}
