//! The modules of every crate form floors (issue 16): `scripts/check-floors.py`
//! passes on this repository, and fails on the faults it exists to catch, so
//! that CI's run of it can fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(dirs: &[&Path]) -> Output {
    Command::new("python3")
        .arg(repo().join("scripts/check-floors.py"))
        .args(dirs)
        .output()
        .expect("python3 runs")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A crate's src/ with the given files, in a fresh directory.
fn fake_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cudaleak-floors-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, body) in files {
        std::fs::write(dir.join(file), body).unwrap();
    }
    dir
}

#[test]
fn this_repository_has_floors() {
    let out = check(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("3 crate(s), no circle"), "{}", text(&out));
}

#[test]
fn the_preload_crate_declares_every_module_on_a_floor() {
    // Without the list in lib.rs the floor check would be skipped: a
    // module missing from it must fail, so the list is read.
    let src = repo().join("crates/cudaleak-preload/src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let copy = fake_crate(
        "declared",
        &[
            ("lib.rs", &lib.replace("`tracker`", "`tracked`")),
            ("tracker.rs", "use crate::capture::Stack;\n"),
            ("capture.rs", "pub struct Stack;\n"),
        ],
    );
    let out = check(&[&copy]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("module `tracker` is on no floor"), "{said}");
    assert!(
        said.contains("the floors name `tracked`, which is no module"),
        "{said}"
    );
}

#[test]
fn a_circle_fails_with_the_names_that_tie_it() {
    let dir = fake_crate(
        "circle",
        &[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::Thing;\n"),
            ("b.rs", "pub struct Thing;\npub fn f() { crate::c::g() }\n"),
            // A comment naming crate::a is no use.
            ("c.rs", "// crate::a::nothing\npub fn g() { crate::a::h() }\n"),
        ],
    );
    let out = check(&[&dir]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("circle of 3: a, b, c"), "{said}");
    assert!(said.contains("a -> b: Thing"), "{said}");
    assert!(said.contains("c -> a: h"), "{said}");

    let fixed = fake_crate(
        "no-circle",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::Thing;\n"),
            ("b.rs", "// crate::a::h would close a circle\npub struct Thing;\n"),
        ],
    );
    let out = check(&[&fixed]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_module_reaching_up_a_floor_fails() {
    let lib = "//! Floors:\n//!\n//! 1. bottom: `low`\n//! 2. top: `high`, `side`\n\nmod high;\nmod low;\nmod side;\n";
    let dir = fake_crate(
        "up",
        &[
            ("lib.rs", lib),
            ("low.rs", "pub fn f() { crate::high::g() }\n"),
            ("high.rs", "pub fn g() {}\npub fn h() { crate::side::k() }\n"),
            ("side.rs", "pub fn k() {}\n"),
        ],
    );
    let out = check(&[&dir]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("`low` (floor 1) reaches up to `high` (floor 2): g"),
        "{said}"
    );
    // One floor may use a module beside it.
    assert!(!said.contains("`high` (floor 2) reaches"), "{said}");
}
