//! The modules of every crate form floors: `scripts/check-floors.py`
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

/// A crate's src/ with the given files (paths may have folders), in a
/// fresh directory.
fn fake_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cudaleak-floors-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, body) in files {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }
    dir
}

/// Whether the check fails on `files` with a line containing `expected`.
fn fails_with(name: &str, files: &[(&str, &str)], expected: &str) {
    let dir = fake_crate(name, files);
    let out = check(&[&dir]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{name}: {said}");
    assert!(said.contains(expected), "{name}: {said}");
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
    assert!(lib.contains("`state`"), "lib.rs lists the floor `state`");
    let copy = fake_crate(
        "declared",
        &[
            ("lib.rs", &lib.replace("`state`", "`stated`")),
            ("state/mod.rs", "//! 1. all: `tracker`\npub mod tracker;\n"),
            ("state/tracker.rs", "use crate::capture::Stack;\n"),
            ("capture/mod.rs", "pub struct Stack;\n"),
        ],
    );
    let out = check(&[&copy]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("module `state` is on no floor"), "{said}");
    assert!(
        said.contains("the floors name `stated`, which is no module"),
        "{said}"
    );
}

/// A copy of one of this repository's crates' src/, with `edits` applied
/// (file, text appended).
fn copy_of_crate(name: &str, krate: &str, edits: &[(&str, &str)]) -> PathBuf {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = std::env::temp_dir().join(format!("cudaleak-floors-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&repo().join("crates").join(krate).join("src"), &dir);
    for (file, line) in edits {
        let path = dir.join(file);
        let mut body = std::fs::read_to_string(&path).unwrap();
        body.push_str(line);
        std::fs::write(path, body).unwrap();
    }
    dir
}

/// The floors are the folders: in a copy of the real crates, a
/// folder that reaches up to a higher folder fails, and so does a file
/// that reaches up a floor its folder's mod.rs declares.
#[test]
fn the_folders_of_the_real_crates_are_floors() {
    for (krate, file, planted, expected) in [
        (
            "cudaleak-preload",
            "capture/unwind/mod.rs",
            "fn planted() { crate::state::tracker::nothing() }\n",
            "`capture` (floor 3) reaches up to `state` (floor 4): tracker",
        ),
        (
            "cudaleak-preload",
            "state/event_ring.rs",
            "fn planted() { super::oom::nothing() }\n",
            "`event_ring` (floor 1) reaches up to `oom` (floor 3): nothing",
        ),
        (
            "cudaleak-core",
            "record/live_map/mod.rs",
            "fn planted() { crate::report::render::nothing() }\n",
            "`record` (floor 2) reaches up to `report` (floor 3): render",
        ),
        (
            "cudaleak-core",
            "record/linetable.rs",
            "fn planted() { crate::record::depot::nothing() }\n",
            "`linetable` (floor 1) reaches up to `depot` (floor 4): nothing",
        ),
    ] {
        let clean = copy_of_crate("clean", krate, &[]);
        let out = check(&[&clean]);
        assert!(out.status.success(), "{krate}: {}", text(&out));
        let dir = copy_of_crate("planted", krate, &[(file, planted)]);
        let out = check(&[&dir]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{krate} {file}: {said}");
        assert!(said.contains(expected), "{krate} {file}: {said}");
    }
}

/// In a crate that declares floors, a folder of modules must declare its
/// own: the order of its files is part of the map.
#[test]
fn a_folder_without_floors_fails_in_a_crate_with_floors() {
    let lib = "//! 1. bottom: `low`\n//! 2. top: `high`\n\nmod high;\nmod low;\n";
    fails_with(
        "folder-floors",
        &[
            ("lib.rs", lib),
            ("high.rs", "pub fn g() { crate::low::one::f() }\n"),
            ("low/mod.rs", "//! The low floor.\npub mod one;\npub mod two;\n"),
            ("low/one.rs", "pub fn f() {}\n"),
            ("low/two.rs", "pub fn h() {}\n"),
        ],
        "a folder of 2 modules lists no floors in its mod.rs",
    );
    let declared = fake_crate(
        "folder-floors-declared",
        &[
            ("lib.rs", lib),
            ("high.rs", "pub fn g() { crate::low::one::f() }\n"),
            (
                "low/mod.rs",
                "//! 1. one: `one`\n//! 2. two: `two`\npub mod one;\npub mod two;\n",
            ),
            ("low/one.rs", "pub fn f() {}\n"),
            ("low/two.rs", "pub fn h() { super::one::f() }\n"),
        ],
    );
    let out = check(&[&declared]);
    assert!(out.status.success(), "{}", text(&out));
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

/// The uses the first version of the check (and the shared map) did not
/// see: files in a module's folder, a `//` inside a string hiding the rest
/// of its line, `super::super::` from a nested test module, and circles
/// among the files of a folder module.
#[test]
fn uses_hidden_in_folders_strings_and_nested_modules_are_seen() {
    fails_with(
        "folder-file",
        &[
            ("lib.rs", "mod high;\nmod low;\n"),
            ("high.rs", "pub fn g() { crate::low::f() }\n"),
            ("low.rs", "mod inner;\npub fn f() {}\n"),
            ("low/inner.rs", "pub fn h() { crate::high::g() }\n"),
        ],
        "circle of 2: high, low",
    );
    fails_with(
        "string",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub fn f() { crate::b::g() }\n"),
            ("b.rs", "pub fn g() { let _ = (\"//\", crate::a::f()); }\n"),
        ],
        "b -> a: f",
    );
    fails_with(
        "super-super",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub fn f() { crate::b::g() }\n"),
            (
                "b.rs",
                "pub fn g() {}\nmod tests {\n    fn t() { super::super::a::f() }\n}\n",
            ),
        ],
        "b -> a: f",
    );
    fails_with(
        "folder-module",
        &[
            ("lib.rs", "mod cli;\n"),
            ("cli/mod.rs", "mod one;\nmod two;\n"),
            ("cli/one.rs", "pub fn f() { super::two::g() }\n"),
            ("cli/two.rs", "pub fn g() { crate::cli::one::f() }\n"),
        ],
        "circle of 2: one, two",
    );
    // A path in a string or a comment is no use.
    let quiet = fake_crate(
        "quoted",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub fn f() { crate::b::g() }\n"),
            (
                "b.rs",
                "pub fn g() { let _ = \"crate::a::f\"; /* crate::a::f */ }\n",
            ),
        ],
    );
    let out = check(&[&quiet]);
    assert!(out.status.success(), "{}", text(&out));
}
