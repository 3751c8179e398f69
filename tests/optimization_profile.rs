//! The build backend's use of the optimization profile
//! (build_backend/cudaleak_build.py, `pgo`): applied to the library's
//! crate only, checked against what rustc says of it, and left out with a
//! note (or, with pgo=strict, a failed build) when it cannot be applied.
//!
//! The backend's `_build_library` runs against a stand-in for cargo that
//! logs its arguments and answers as cargo does with JSON messages: the
//! profile's staleness warnings and failures come from its environment.
//! The real build is scripts/build-wheel.sh's (pgo=strict), which
//! scripts/test.sh runs.

mod support;

use std::path::Path;
use std::process::Command;
use support::TempDir;

/// Stands in for cargo (and cargo-zigbuild): `metadata`, `build`, and
/// `rustc`, which fails or warns of changed functions when given the
/// profile, as its environment says.
const FAKE_CARGO: &str = r#"#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
target = os.environ["FAKE_TARGET"]
if args[0] == "metadata":
    print(json.dumps({"target_directory": target}))
    sys.exit(0)
if args[0] == "build":
    sys.exit(0)
def say(level, text):
    print(json.dumps({"reason": "compiler-message", "message": {"level": level, "rendered": text}}))
if os.environ.get("FAKE_WARNING"):
    say("warning", "warning: %s\n" % os.environ["FAKE_WARNING"])
if os.environ.get("FAKE_COMPILE_ERROR"):
    say("error", "error[E0425]: cannot find value `x` in this scope\n")
    sys.exit(101)
if any(a.startswith("-Cprofile-use=") for a in args):
    if os.environ.get("FAKE_UNREADABLE"):
        say("error", "error: failed to read profile data: unsupported version\n")
        sys.exit(101)
    for name in filter(None, os.environ.get("FAKE_STALE", "").split(",")):
        text = ("warning: cudaleak.x-cgu.0: function control flow change detected "
                "(hash mismatch) %s Hash = 1 up to 2 count discarded\n" % name)
        print(json.dumps({"reason": "compiler-message", "message": {"rendered": text}}))
    if "-Cllvm-args=-pgo-warn-missing-function" in args:
        for name in filter(None, os.environ.get("FAKE_MISSING", "").split(",")):
            text = ("warning: cudaleak.x-cgu.0: no profile data available for function "
                    "%s Hash = 1 up to 0 count discarded\n" % name)
            print(json.dumps({"reason": "compiler-message", "message": {"rendered": text}}))
so = os.path.join(target, "libcudaleak.so")
open(so, "wb").close()
print(json.dumps({"reason": "compiler-artifact", "target": {"kind": ["cdylib"]}, "filenames": [so]}))
"#;

/// Stands in for rustc -V.
const FAKE_RUSTC: &str = r#"#!/usr/bin/env python3
import os
print(os.environ.get("FAKE_RUSTC_VERSION", "rustc 9.99.0 (0123456789 2026-01-01)"))
"#;

/// What the stand-in rustc says by default, and the tree's profile says it
/// was made with.
const MADE_WITH: &str = "rustc 9.99.0 (0123456789 2026-01-01)";

/// Runs `_build_library` in `dir` (a source tree as far as the backend
/// looks): argv is the pgo mode and "zig" or "plain".
const DRIVER: &str = r#"
import os, sys
sys.path.insert(0, sys.argv[1])
import cudaleak_build as b
b._maturin_config = lambda: {"compatibility": "manylinux_2_28"}
# (the machine the profile is for, on any machine the tests run on)
b.platform.machine = lambda: os.environ.get("FAKE_MACHINE", "x86_64")
mode, linking, cargo = sys.argv[2], sys.argv[3], sys.argv[4]
zig = b._Zig(cargo, {}) if linking == "zig" else None
b._build_library(cargo, zig, "wheel", b._pgo_mode({"pgo": mode}))
"#;

struct Outcome {
    /// stdout and stderr
    output: String,
    ok: bool,
    notes: Vec<String>,
    /// each cargo run's arguments
    runs: Vec<Vec<String>>,
}

impl Outcome {
    fn profile_uses(&self) -> Vec<String> {
        self.runs
            .iter()
            .flatten()
            .filter_map(|a| a.strip_prefix("-Cprofile-use=").map(str::to_string))
            .collect()
    }

    fn library_builds(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| r.contains(&"--lib".to_string()))
            .count()
    }

    fn says(&self, text: &str) -> bool {
        self.notes.iter().any(|n| n.contains(text))
    }
}

struct Tree {
    dir: TempDir,
}

impl Tree {
    /// A source tree with the profile (when `profile` is Some: its bytes
    /// before compression) and the list of the functions it counts.
    fn new(tag: &str, profile: Option<&[u8]>, profiled: &[&str]) -> Tree {
        let dir = TempDir::new(tag);
        let pgo = dir.0.join("crates/cudaleak-preload/pgo");
        std::fs::create_dir_all(&pgo).unwrap();
        std::fs::create_dir_all(dir.0.join("target")).unwrap();
        if let Some(bytes) = profile {
            let raw = dir.0.join("profile.raw");
            std::fs::write(&raw, bytes).unwrap();
            // (compressed as scripts/pgo-profile.sh's xz does, by the
            // module the backend reads it with)
            let compress = "import lzma, sys\n\
                open(sys.argv[2], 'wb').write(lzma.compress(open(sys.argv[1], 'rb').read()))";
            let status = Command::new("python3")
                .args(["-c", compress])
                .arg(&raw)
                .arg(pgo.join("libcudaleak.profdata.xz"))
                .status()
                .expect("python3");
            assert!(status.success());
        }
        let list: String = profiled.iter().map(|f| format!("{f}\n")).collect();
        std::fs::write(pgo.join("profiled-functions.txt"), list).unwrap();
        std::fs::write(pgo.join("rustc-version.txt"), format!("{MADE_WITH}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        for (name, text) in [("fake-cargo", FAKE_CARGO), ("fake-rustc", FAKE_RUSTC)] {
            let path = dir.0.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Tree { dir }
    }

    fn build(&self, mode: &str, linking: &str, env: &[(&str, &str)]) -> Outcome {
        let log = self.dir.0.join("cargo.log");
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new("python3");
        cmd.current_dir(&self.dir.0)
            .args(["-c", DRIVER])
            .arg(support::repo().join("build_backend"))
            .args([mode, linking])
            .arg(self.dir.0.join("fake-cargo"))
            .env("FAKE_LOG", &log)
            .env("FAKE_TARGET", self.dir.0.join("target"))
            .env("RUSTC", self.dir.0.join("fake-rustc"))
            .env_remove("CUDALEAK_BUILD_PGO")
            .env_remove("FAKE_STALE")
            .env_remove("FAKE_MISSING")
            .env_remove("FAKE_WARNING")
            .env_remove("FAKE_COMPILE_ERROR")
            .env_remove("FAKE_RUSTC_VERSION")
            .env_remove("FAKE_MACHINE")
            .env_remove("FAKE_UNREADABLE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("python3");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let runs = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Vec<String>>(l).unwrap())
            .collect();
        assert!(
            !text.contains("no profile data available"),
            "a function the profile does not count is not worth a line: {text}"
        );
        Outcome {
            output: text.clone(),
            ok: out.status.success(),
            notes: text
                .lines()
                .filter(|l| l.starts_with("cudaleak: "))
                .map(str::to_string)
                .collect(),
            runs,
        }
    }
}

const PROFILE: &[u8] = b"a stand-in for an indexed profile";

#[test]
fn the_profile_goes_to_the_zig_linked_library_crate_by_its_content_and_nowhere_else() {
    let tree = Tree::new("pgo-applied", Some(PROFILE), &["hot"]);
    let o = tree.build("auto", "zig", &[]);
    assert!(o.ok, "{:?}", o.notes);
    assert!(
        o.says("libcudaleak.so is optimized with the profile of the benchmark shapes"),
        "{:?}",
        o.notes
    );
    let uses = o.profile_uses();
    assert_eq!(uses.len(), 1, "{:?}", o.runs);
    // Decompressed, and named by its content, so that a new profile is a
    // new flag (cargo rebuilds on a changed flag, not on a changed file).
    assert_eq!(std::fs::read(&uses[0]).unwrap(), PROFILE);
    let name = Path::new(&uses[0])
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("libcudaleak-") && name.ends_with(".profdata") && name.len() == 37,
        "{name}"
    );
    // Only for `rustc -p cudaleak-preload --lib`, after `--`: the
    // library's crate, which asks rustc to name what the profile lacks.
    let lib = &o.runs[o.runs.len() - 1];
    assert_eq!(lib[0], "rustc");
    let dashes = lib.iter().position(|a| a == "--").unwrap();
    assert!(
        lib[..dashes].windows(2).any(|w| w == ["-p", "cudaleak-preload"]),
        "{lib:?}"
    );
    assert!(lib[..dashes].contains(&"--lib".to_string()), "{lib:?}");
    assert!(
        lib[dashes..].contains(&"-Cllvm-args=-pgo-warn-missing-function".to_string()),
        "{lib:?}"
    );
    assert_eq!(o.library_builds(), 1);

    // A changed profile is another file.
    let tree2 = Tree::new("pgo-applied-2", Some(b"another profile"), &[]);
    let o2 = tree2.build("auto", "zig", &[]);
    let name2 = Path::new(&o2.profile_uses()[0])
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_ne!(name, name2);

    // pgo=no: never.
    let o = tree.build("no", "zig", &[]);
    assert!(o.ok && o.profile_uses().is_empty(), "{:?} {:?}", o.notes, o.runs);
    assert!(!o.notes.iter().any(|n| n.contains("profile")), "{:?}", o.notes);

    // Linked by this machine's cc, the crates' symbols carry another hash
    // than the profile's: left out, and the command built after it.
    let o = tree.build("auto", "plain", &[]);
    assert!(o.ok && o.profile_uses().is_empty(), "{:?}", o.runs);
    assert!(
        o.says("libcudaleak.so is built without the optimization profile: it is the zig-linked build's"),
        "{:?}",
        o.notes
    );
    let command = o
        .runs
        .iter()
        .find(|r| r[0] == "build")
        .expect("the command's build");
    assert!(
        command.windows(2).any(|w| w == ["-p", "cudaleak-cli"]),
        "{command:?}"
    );
    let o = tree.build("strict", "plain", &[]);
    assert!(!o.ok);
    assert!(
        o.says("pgo=strict, but it is the zig-linked build's"),
        "{:?}",
        o.notes
    );
}

#[test]
fn a_stale_profile_is_a_note_by_default_and_a_failed_build_when_strict() {
    let tree = Tree::new("pgo-stale", Some(PROFILE), &["hot_one", "hot_two"]);
    let changed = [("FAKE_STALE", "hot_one")];
    let o = tree.build("auto", "zig", &changed);
    assert!(o.ok, "{:?}", o.notes);
    assert!(
        o.says("libcudaleak.so is optimized with the profile, less 1 function(s) that ran in the profile changed or missing in this build (the code changed since it was made: hot_one)"),
        "{:?}",
        o.notes
    );
    let o = tree.build("strict", "zig", &changed);
    assert!(!o.ok);
    assert!(
        o.says("pgo=strict, but 1 function(s) that ran in the profile changed or missing in this build (the code changed since it was made: hot_one); scripts/pgo-profile.sh makes a new profile"),
        "{:?}",
        o.notes
    );

    // A function missing from the profile matters only when it ran while
    // the profile was made: one that moved to another codegen unit is not
    // found under its old one.
    let cold = [("FAKE_MISSING", "never_ran,also_cold")];
    let o = tree.build("strict", "zig", &cold);
    assert!(o.ok, "{:?}", o.notes);
    assert!(
        o.says("optimized with the profile of the benchmark shapes"),
        "{:?}",
        o.notes
    );
    let renamed = [("FAKE_MISSING", "never_ran,hot_two,hot_one")];
    let o = tree.build("strict", "zig", &renamed);
    assert!(!o.ok);
    assert!(
        o.says("but 2 function(s) that ran in the profile changed or missing"),
        "{:?}",
        o.notes
    );
    assert!(o.says("since it was made: hot_one, hot_two)"), "{:?}", o.notes);
}

#[test]
fn a_profile_that_cannot_be_applied_is_left_out_unless_strict() {
    // A damaged profile, or one this rustc cannot read.
    let tree = Tree::new("pgo-unreadable", Some(PROFILE), &[]);
    let unreadable = [("FAKE_UNREADABLE", "1")];
    let o = tree.build("auto", "zig", &unreadable);
    assert!(o.ok, "{:?}", o.notes);
    assert!(
        o.says("the library did not build with the optimization profile"),
        "{:?}",
        o.notes
    );
    // built again, without it
    assert_eq!(o.library_builds(), 2, "{:?}", o.runs);
    assert_eq!(o.profile_uses().len(), 1);
    let o = tree.build("strict", "zig", &unreadable);
    assert!(!o.ok);
    assert!(
        o.says("pgo=strict, but the library did not build with the optimization profile"),
        "{:?}",
        o.notes
    );

    // A source without the profile (or a damaged one).
    let bare = Tree::new("pgo-absent", None, &[]);
    let o = bare.build("auto", "zig", &[]);
    assert!(o.ok && o.profile_uses().is_empty(), "{:?}", o.runs);
    assert!(
        o.says("libcudaleak.so is built without the optimization profile: this source has no crates/cudaleak-preload/pgo/libcudaleak.profdata.xz"),
        "{:?}",
        o.notes
    );
    let o = bare.build("strict", "zig", &[]);
    assert!(!o.ok);
    assert!(o.says("pgo=strict, but this source has no"), "{:?}", o.notes);
    let damaged = Tree::new("pgo-damaged", None, &[]);
    std::fs::write(
        damaged
            .dir
            .0
            .join("crates/cudaleak-preload/pgo/libcudaleak.profdata.xz"),
        b"not xz",
    )
    .unwrap();
    let o = damaged.build("auto", "zig", &[]);
    assert!(o.ok && o.profile_uses().is_empty(), "{:?}", o.runs);
    assert!(o.says("cannot be read"), "{:?}", o.notes);
    // The profile without the list of what it counts.
    let unlisted = Tree::new("pgo-unlisted", Some(PROFILE), &[]);
    std::fs::remove_file(
        unlisted
            .dir
            .0
            .join("crates/cudaleak-preload/pgo/profiled-functions.txt"),
    )
    .unwrap();
    let o = unlisted.build("strict", "zig", &[]);
    assert!(!o.ok);
    assert!(
        o.says("pgo=strict, but this source has no crates/cudaleak-preload/pgo/profiled-functions.txt"),
        "{:?}",
        o.notes
    );
    // A bad setting: one line, the build stops.
    let o = bare.build("sometimes", "zig", &[]);
    assert!(!o.ok);
    assert!(o.says("pgo=sometimes: use auto, strict or no"), "{:?}", o.notes);
}

#[test]
fn another_rustc_another_machine_or_a_compile_error_are_told_apart() {
    let tree = Tree::new("pgo-rustc", Some(PROFILE), &["hot"]);
    // Another rustc names every function otherwise: left out, before any
    // build, naming both.
    let other = [("FAKE_RUSTC_VERSION", "rustc 1.96.0 (abcdef012 2026-06-01)")];
    let o = tree.build("auto", "zig", &other);
    assert!(o.ok && o.profile_uses().is_empty(), "{:?}", o.runs);
    assert!(
        o.says("libcudaleak.so is built without the optimization profile: it was made with rustc 9.99.0 (0123456789 2026-01-01) and this build's rustc is rustc 1.96.0 (abcdef012 2026-06-01) (scripts/pgo-profile.sh makes one with it)"),
        "{:?}",
        o.notes
    );
    let o = tree.build("strict", "zig", &other);
    assert!(
        !o.ok && o.says("pgo=strict, but it was made with rustc 9.99.0"),
        "{:?}",
        o.notes
    );

    // Another machine's code differs where the library's assembly does.
    let o = tree.build("auto", "zig", &[("FAKE_MACHINE", "aarch64")]);
    assert!(o.ok && o.profile_uses().is_empty(), "{:?}", o.runs);
    assert!(
        o.says("it is made on x86_64 and this is aarch64"),
        "{:?}",
        o.notes
    );

    // A compile error of the code's own fails the build at once, once:
    // it is not the profile's, and would be the same without it.
    let o = tree.build("auto", "zig", &[("FAKE_COMPILE_ERROR", "1")]);
    assert!(!o.ok);
    assert_eq!(o.library_builds(), 1, "{:?}", o.runs);
    assert!(o.output.contains("error[E0425]"), "{}", o.output);
    assert!(
        !o.says("did not build with the optimization profile"),
        "{:?}",
        o.notes
    );

    // The compiler's other messages are shown, as cargo shows them.
    let o = tree.build("auto", "zig", &[("FAKE_WARNING", "unused variable: `spare`")]);
    assert!(o.ok);
    assert!(
        o.output.contains("warning: unused variable: `spare`"),
        "{}",
        o.output
    );
}
