//! The `cudaleak` Python package for the command: `import cudaleak` and
//! the pytest plugin work in the command's own Python even when the
//! package lives only in another environment (`pipx install` puts the
//! command, the library and the package in a venv of their own).
//!
//! Only the package is made reachable, never the environment around it:
//! a private directory (`mkdtemp`, 0700) holding one entry, `cudaleak`, a
//! link to the package that holds the preloaded library, goes first on
//! PYTHONPATH, and is removed after the run. The plugin is named in
//! PYTEST_PLUGINS, so the command's own pytest loads it without `-p`.
//! Both keep the user's values after ours.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin's module, and the name of its `pytest11` entry point
/// (pyproject.toml). pytest loads entry points first and skips a
/// PYTEST_PLUGINS module already registered under its name, so in an
/// environment that has cudaleak installed too it is registered once.
pub const PYTEST_PLUGIN: &str = "cudaleak.pytest_plugin";

/// What was added to the command's environment; the private directory,
/// if one was made, goes when this is dropped.
pub struct PythonPackage {
    link_dir: Option<PathBuf>,
}

impl PythonPackage {
    /// Puts the package that goes with `lib` on the command's PYTHONPATH
    /// and its plugin in PYTEST_PLUGINS: the package holding the library
    /// (the wheel's `cudaleak/_lib/libcudaleak.so`, in any environment),
    /// else `tree`, a directory holding only the package (a checkout's
    /// python/ beside cargo's target/release). Neither: nothing is added.
    pub fn for_command(cmd: &mut Command, lib: &Path, tree: Option<PathBuf>) -> PythonPackage {
        let mut made = PythonPackage { link_dir: None };
        let entry = match package_holding(lib) {
            Some(package) => match link_to(&package) {
                Ok(dir) => {
                    made.link_dir = Some(dir.clone());
                    dir
                }
                Err(e) => {
                    note!("cudaleak: {e}; the command's Python will not see the cudaleak package");
                    return made;
                }
            },
            None => match tree {
                Some(dir) => dir,
                None => return made,
            },
        };
        cmd.env("PYTHONPATH", super::prepend_path("PYTHONPATH", &entry));
        cmd.env(
            "PYTEST_PLUGINS",
            with_plugin(std::env::var_os("PYTEST_PLUGINS").as_deref()),
        );
        made
    }
}

impl Drop for PythonPackage {
    fn drop(&mut self) {
        if let Some(dir) = &self.link_dir {
            let _ = std::fs::remove_file(dir.join("cudaleak"));
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// `.../cudaleak` when `lib` is `.../cudaleak/_lib/libcudaleak.so` of a
/// package with its module and plugin beside it.
fn package_holding(lib: &Path) -> Option<PathBuf> {
    let libs = lib
        .parent()
        .filter(|d| d.file_name() == Some(OsStr::new("_lib")))?;
    let package = libs
        .parent()
        .filter(|d| d.file_name() == Some(OsStr::new("cudaleak")))?;
    let whole = ["__init__.py", "pytest_plugin.py"]
        .iter()
        .all(|f| package.join(f).is_file());
    whole.then(|| package.canonicalize().ok()).flatten()
}

/// A new private directory whose only entry, `cudaleak`, links to `package`.
fn link_to(package: &Path) -> Result<PathBuf, String> {
    let dir = super::super::demo::private_dir_named("cudaleak-python")?;
    let link = dir.join("cudaleak");
    std::os::unix::fs::symlink(package, &link).map_err(|e| {
        let _ = std::fs::remove_dir(&dir);
        format!("cannot create {}: {e}", link.display())
    })?;
    Ok(dir)
}

/// PYTEST_PLUGINS with the plugin after the user's own (comma-separated,
/// as pytest reads it); unchanged when it already names the plugin.
fn with_plugin(old: Option<&OsStr>) -> OsString {
    let old = old.unwrap_or_default();
    let listed = old
        .to_string_lossy()
        .split(',')
        .any(|p| p.trim() == PYTEST_PLUGIN);
    if listed {
        return old.to_owned();
    }
    let mut v = old.to_owned();
    if !v.is_empty() && !old.to_string_lossy().ends_with(',') {
        v.push(",");
    }
    v.push(PYTEST_PLUGIN);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_goes_after_the_users_own_and_only_once() {
        let w = |s: Option<&str>| with_plugin(s.map(OsStr::new)).into_string().unwrap();
        assert_eq!(w(None), "cudaleak.pytest_plugin");
        assert_eq!(w(Some("")), "cudaleak.pytest_plugin");
        assert_eq!(w(Some("mine")), "mine,cudaleak.pytest_plugin");
        assert_eq!(w(Some("a,b,")), "a,b,cudaleak.pytest_plugin");
        assert_eq!(w(Some("a,cudaleak.pytest_plugin")), "a,cudaleak.pytest_plugin");
    }

    #[test]
    fn only_a_whole_package_around_the_library_counts() {
        let root = std::env::temp_dir().join(format!("cudaleak-pkg-test-{}", std::process::id()));
        let package = root.join("site-packages/cudaleak");
        std::fs::create_dir_all(package.join("_lib")).unwrap();
        let lib = package.join("_lib/libcudaleak.so");
        std::fs::write(&lib, b"").unwrap();
        std::fs::write(package.join("__init__.py"), b"").unwrap();
        // no plugin: not the wheel's package
        assert_eq!(package_holding(&lib), None);
        std::fs::write(package.join("pytest_plugin.py"), b"").unwrap();
        assert_eq!(package_holding(&lib), Some(package.canonicalize().unwrap()));
        // cargo's target/release/libcudaleak.so is in no package
        assert_eq!(package_holding(&root.join("libcudaleak.so")), None);

        let dir = link_to(&package).unwrap();
        let entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(entries, [OsString::from("cudaleak")]);
        assert_eq!(std::fs::read_link(dir.join("cudaleak")).unwrap(), package);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        drop(PythonPackage {
            link_dir: Some(dir.clone()),
        });
        assert!(!dir.exists());
        assert!(package.join("__init__.py").is_file(), "the package itself stays");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
