//! Snapshot tests (insta): the text, folded and JSON renderings of fixed
//! reports (tests/snapshots/*.json), compared with the `.snap` files beside
//! them. A slip in wording, a total or an order shows up as a diff.
//!
//! After an intended change: `cargo insta review` (from `cargo install
//! cargo-insta`) shows each difference and accepts or rejects it; without
//! it, `INSTA_UPDATE=always cargo test --release --test snapshots` rewrites
//! the files, and `git diff tests/snapshots` is the review. In CI (`CI`
//! set) a difference fails the test and no file is written.
//!
//! What differs between machines and runs is redacted (JSON) or filtered
//! (text): absolute addresses (offsets are short and stay), the
//! repository's path and a test's temporary directory.

mod support;

use insta::internals::{Content, ContentPath, Redaction};
use insta::{assert_json_snapshot, assert_snapshot};
use std::path::Path;
use std::time::Duration;
use support::*;

/// A regular expression that matches `text` literally.
fn literally(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The snapshots' settings: files named as the snapshot (no module
/// prefix), and text filtered of what varies. `dir`: a temporary directory
/// the output may name, shown as `<dir>`.
fn settings(dir: Option<&Path>) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    if let Some(dir) = dir {
        s.add_filter(&literally(&dir.display().to_string()), "<dir>");
    }
    s.add_filter(&literally(&repo().display().to_string()), "<repo>");
    // Absolute addresses (9 hex digits or more); offsets in a module stay.
    s.add_filter(r"0x[0-9a-fA-F]{9,}", "0xADDRESS");
    s
}

/// A redaction of paths in `dir` (a test's temporary directory): the
/// directory reads `<dir>`, the file's name stays.
fn paths_in(dir: &str) -> Redaction {
    let dir = dir.to_string();
    insta::dynamic_redaction(move |value: Content, _: ContentPath<'_>| match value.as_str() {
        Some(path) => Content::from(path.replace(&dir, "<dir>")),
        None => value,
    })
}

fn render(args: &[&str]) -> String {
    let (status, stdout, stderr) = run_command(cli_command(args, &repo()), Duration::from_secs(60));
    assert!(status.success(), "{args:?}: {stderr}");
    stdout
}

fn json(text: &str) -> serde_json::Value {
    let v = serde_json::from_str(text).unwrap();
    validate(&v);
    v
}

const FIXTURE: &str = "tests/snapshots/python_report.json";

#[test]
fn text_of_a_fixed_report() {
    let text = render(&["report", "--no-symbolize", FIXTURE]);
    settings(None).bind(|| assert_snapshot!("python_report.text", text));
}

#[test]
fn text_with_full_stacks_and_top() {
    let text = render(&["report", "--no-symbolize", "--full-stacks", "--top", "1", FIXTURE]);
    settings(None).bind(|| assert_snapshot!("python_report.full_top1.text", text));
}

#[test]
fn folded_of_a_fixed_report() {
    let text = render(&["report", "--no-symbolize", "--format", "folded", FIXTURE]);
    settings(None).bind(|| assert_snapshot!("python_report.folded", text));
}

#[test]
fn json_of_a_fixed_report() {
    let out = json(&render(&[
        "report",
        "--no-symbolize",
        "--format",
        "json",
        "--top",
        "2",
        FIXTURE,
    ]));
    settings(None).bind(|| {
        assert_json_snapshot!("python_report.json", out, {
            ".**.address" => "0xADDRESS",
        })
    });
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
    let settings = settings(Some(d.path()));
    let merged = render(&["merge", "--no-symbolize", dir]);
    settings.bind(|| assert_snapshot!("merge.text", merged));
    let merged = json(&render(&["merge", "--no-symbolize", "--format", "json", dir]));
    settings.bind(|| {
        assert_json_snapshot!("merge.json", merged, {
            ".**.address" => "0xADDRESS",
            ".merged_from[]" => paths_in(dir),
            ".ranks[].file" => paths_in(dir),
        })
    });
    let a = d.path().join("cudaleak.h.101.r1.json");
    let b = d.path().join("cudaleak.h.100.r0.json");
    let diff = render(&["diff", "--no-symbolize", a.to_str().unwrap(), b.to_str().unwrap()]);
    settings.bind(|| assert_snapshot!("diff.text", diff));
}

#[test]
fn text_of_a_fixed_timeline() {
    let text = render(&["report", "tests/snapshots/timeline_fixture.timeline.json"]);
    settings(None).bind(|| assert_snapshot!("timeline.text", text));
}

#[test]
fn filters_keep_offsets_and_hide_addresses_and_paths() {
    let line = format!(
        "#1 0x7f0000001800 (libk.so+0x1800) at 0x55aa00001234 in {}/x.c",
        repo().display()
    );
    settings(None)
        .bind(|| assert_snapshot!(line, @"#1 0xADDRESS (libk.so+0x1800) at 0xADDRESS in <repo>/x.c"));
}
