//! docs/architecture.md walks a `cudaMalloc` from the hook to the report
//! with `file:name` anchors. `scripts/check-architecture.py`
//! passes on this repository and fails on an anchor that no longer holds,
//! so that CI's run of it can fail.

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(doc: Option<&PathBuf>) -> Output {
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("scripts/check-architecture.py"));
    if let Some(d) = doc {
        cmd.arg("--doc").arg(d);
    }
    cmd.output().expect("python3 runs")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn every_anchor_of_the_walkthrough_is_defined() {
    let o = check(None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("anchors, all defined"), "{}", text(&o));
}

#[test]
fn a_renamed_function_or_a_moved_file_fails_the_check() {
    let original = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    for (from, to, expected) in [
        (
            "scope.rs:cudaleak_enter_runtime",
            "scope.rs:cudaleak_enter_runtime_renamed",
            "cudaleak_enter_runtime_renamed: not defined there",
        ),
        (
            "crates/cudaleak-preload/src/state/tracker/mod.rs:record_traced_allocation",
            "crates/cudaleak-preload/src/tracker/mod.rs:record_traced_allocation",
            "src/tracker/mod.rs: no such file",
        ),
    ] {
        assert!(original.contains(from), "{from}");
        let doc = std::env::temp_dir().join(format!("cudaleak-architecture-{}.md", std::process::id()));
        std::fs::write(&doc, original.replacen(from, to, 1)).unwrap();
        let o = check(Some(&doc));
        let _ = std::fs::remove_file(&doc);
        assert!(!o.status.success(), "passed with {to}");
        assert!(text(&o).contains(expected), "{}", text(&o));
    }
}
