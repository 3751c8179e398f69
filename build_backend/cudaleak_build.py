"""cudaleak's PEP 517 build backend: maturin, plus the preload library.

Every standard way of installing from source (``pip install .``, ``pip
install git+URL``, ``pip wheel .``, an sdist, ``python -m build``, uv, pipx)
calls these hooks (pyproject.toml, ``backend-path``). maturin builds one
crate per wheel, the ``cudaleak`` command; libcudaleak.so is another crate
(crates/cudaleak-preload), so the wheel hooks build it first and put it
where maturin packs it as a file of the Python package
(python/cudaleak/_lib/libcudaleak.so, pyproject.toml's ``include``), and
the sdist hook adds the library's crate to maturin's sdist, which only
carries the command's own path dependencies. docs/packaging.md says why.

Linking: with zig (the ``ziglang`` and ``cargo-zigbuild`` packages) both
binaries are linked against the glibc of pyproject.toml's ``compatibility``
tag and the wheel carries that manylinux tag, the wheel
scripts/build-wheel.sh makes. Without zig they are linked by this
machine's C toolchain and the wheel gets the plain platform tag
(``linux_x86_64``), which promises nothing beyond this machine.

The config setting ``zig`` (``pip ... -C zig=yes``, ``python -m build -C
zig=yes``, or the environment variable CUDALEAK_BUILD_ZIG) chooses:
``auto`` (the default) uses zig when the build's environment has it (a
``--no-build-isolation`` build in an environment with both packages);
``yes`` asks the frontend for both (on Linux x86_64 and aarch64) and fails
without them; ``no`` never uses zig.

The library is optimized with the profile of the benchmark shapes
(crates/cudaleak-preload/pgo/, made by scripts/pgo-profile.sh from the
zig-linked build on x86_64, the wheel's). The config setting ``pgo`` (or
CUDALEAK_BUILD_PGO) chooses: ``auto`` (the default) applies it to a
zig-linked build on x86_64 by the rustc that made it, says when rustc
finds functions that ran in it changed or missing (changed code), and
otherwise builds without it, saying so; ``strict`` (scripts/build-wheel.sh) fails in each
of those cases; ``no`` never applies it.

Runs on every Python the package supports (3.8 and later).
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile

# The same ranges as requirements-wheel.txt, which scripts/build-wheel.sh
# and the tests install.
ZIG_REQUIREMENTS = ["ziglang>=0.13,<0.18", "cargo-zigbuild>=0.20,<0.25"]
LIBRARY_CRATE = "cudaleak-preload"
# The workspace's root package, the one maturin builds (pyproject.toml's
# manifest-path).
COMMAND_CRATE = "cudaleak-cli"
LIBRARY_CRATE_DIR = "crates/cudaleak-preload"
# Where maturin finds the library: pyproject.toml, [tool.maturin] include.
LIBRARY_IN_PACKAGE = os.path.join("python", "cudaleak", "_lib", "libcudaleak.so")
# The optimization profile (scripts/pgo-profile.sh), xz-compressed.
PROFILE_IN_CRATE = os.path.join(LIBRARY_CRATE_DIR, "pgo", "libcudaleak.profdata.xz")
# The functions that ran while it was made, by symbol, and the rustc that
# made it (`rustc -V`), written with it.
PROFILED_FUNCTIONS_IN_CRATE = os.path.join(LIBRARY_CRATE_DIR, "pgo", "profiled-functions.txt")
PROFILE_RUSTC_IN_CRATE = os.path.join(LIBRARY_CRATE_DIR, "pgo", "rustc-version.txt")
# How rustc says that a function changed since the profile was made: its
# count is discarded, and the function is optimized without it.
PROFILE_MISMATCH = "function control flow change detected (hash mismatch)"
# ... and that a function has no counts in it (asked for with
# -pgo-warn-missing-function: a function that moved to another codegen
# unit, or whose symbol changed, is not found).
PROFILE_MISSING = "no profile data available for function"
# Linux machines that ziglang and cargo-zigbuild publish wheels for.
ZIG_MACHINES = ("x86_64", "aarch64")


def _fail(message):
    """One line on stderr, and the build stops: pip shows this line."""
    sys.stderr.write("cudaleak: %s\n" % message)
    sys.stderr.flush()
    raise SystemExit(1)


def _note(message):
    sys.stdout.write("cudaleak: %s\n" % message)
    sys.stdout.flush()


def _put_scripts_dir_on_path():
    """The interpreter's own scripts directory first on PATH, as an activated
    environment has it: `venv/bin/pip wheel --no-build-isolation .` from a
    shell that never activated venv still finds its maturin and
    cargo-zigbuild (maturin's own hooks run `maturin` from PATH)."""
    scripts = sysconfig.get_path("scripts")
    path = os.environ.get("PATH", "")
    if scripts and scripts not in path.split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + path if path else scripts


def _cargo():
    """cargo's path, or the build stops at once with what to install:
    nothing is built, so no wheel can come out without its library."""
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if cargo:
        try:
            out = subprocess.run([cargo, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError:
            out = None
        if out is not None and out.returncode == 0:
            return cargo
        why = "%s does not run (%s)" % (
            cargo,
            (out.stderr.decode(errors="replace").strip().splitlines() or ["cannot execute"])[-1]
            if out is not None
            else "cannot execute",
        )
    else:
        why = "cargo is not on PATH"
        home = os.environ.get("CARGO_HOME") or os.path.join(os.path.expanduser("~"), ".cargo")
        if os.path.isfile(os.path.join(home, "bin", "cargo")):
            why += " (there is one in %s: add that directory to PATH)" % os.path.join(home, "bin")
    _fail(
        "building from source needs Rust 1.88 or newer and a C compiler, and %s: "
        "install Rust from https://rustup.rs (or your distribution's cargo and rustc), "
        "then run the install again" % why
    )


_AUTO = {"": "auto", "auto": "auto"}
_NO = {"0": "no", "no": "no", "false": "no", "off": "no"}


def _setting(config_settings, name, env, spellings, choices):
    """A config setting (``-C name=...``), else its environment variable,
    else ``auto``: the value its spelling stands for, or the build stops
    naming the choices."""
    value = (config_settings or {}).get(name)
    if value is None:
        value = os.environ.get(env, "auto")
    value = str(value).strip().lower()
    if value in spellings:
        return spellings[value]
    _fail("%s=%s: use %s" % (name, value, choices))


def _zig_mode(config_settings):
    yes = {"1": "yes", "yes": "yes", "true": "yes", "on": "yes"}
    return _setting(config_settings, "zig", "CUDALEAK_BUILD_ZIG", {**_AUTO, **yes, **_NO}, "auto, yes or no")


def _pgo_mode(config_settings):
    strict = {"strict": "strict"}
    return _setting(config_settings, "pgo", "CUDALEAK_BUILD_PGO", {**_AUTO, **strict, **_NO}, "auto, strict or no")


def _rustc_version(cargo):
    """`rustc -V` of the rustc cargo runs: $RUSTC, the one beside cargo,
    or the one on PATH."""
    rustc = os.environ.get("RUSTC")
    if not rustc:
        beside = os.path.join(os.path.dirname(cargo), "rustc")
        rustc = beside if os.path.isfile(beside) else (shutil.which("rustc") or "rustc")
    try:
        out = subprocess.run([rustc, "-V"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError:
        return None
    return out.stdout.decode(errors="replace").strip() if out.returncode == 0 else None


def _optimization_profile(mode, target_dir, zig, cargo):
    """The profile to build the library with, decompressed into the target
    directory, or None (with a note; with pgo=strict the build stops)."""
    if mode == "no":
        return None

    def without(why):
        if mode == "strict":
            _fail("pgo=strict, but %s" % why)
        _note("libcudaleak.so is built without the optimization profile: %s" % why)

    if platform.machine() != "x86_64":
        # It counts x86_64's code; another machine's differs where the
        # library's own assembly and unwinder do.
        return without("it is made on x86_64 and this is %s" % platform.machine())
    if not zig:
        # A Rust function's symbol, by which the profile finds it, carries
        # a hash of how cargo built its crate (-C metadata), which differs
        # between the zig-linked build and this one.
        return without("it is the zig-linked build's (the wheel's), and this build links with this "
                       "machine's cc")
    src = os.path.join(os.getcwd(), PROFILE_IN_CRATE)
    for path in (PROFILE_IN_CRATE, PROFILED_FUNCTIONS_IN_CRATE, PROFILE_RUSTC_IN_CRATE):
        # (without the list, a build that names every function otherwise
        # would not be told from one that matches)
        if not os.path.isfile(os.path.join(os.getcwd(), path)):
            return without("this source has no %s" % path)
    with open(os.path.join(os.getcwd(), PROFILE_RUSTC_IN_CRATE)) as f:
        made_by = f.read(4096).strip()
    this = _rustc_version(cargo)
    if this != made_by:
        # Another rustc names every function otherwise (and an older one
        # may not read the file): the profile would find nothing.
        return without("it was made with %s and this build's rustc is %s "
                       "(scripts/pgo-profile.sh makes one with it)" % (made_by, this or "unknown"))
    try:
        import lzma
    except ImportError:
        return without("this Python has no lzma module to decompress it")
    limit = 64 << 20
    try:
        with lzma.open(src) as f:
            data = f.read(limit + 1)
    except (OSError, EOFError, lzma.LZMAError) as e:
        return without("%s cannot be read (%s)" % (PROFILE_IN_CRATE, e))
    if len(data) > limit:
        return without("%s is larger than %d MiB decompressed" % (PROFILE_IN_CRATE, limit >> 20))
    # Named by its content: cargo rebuilds when the flag changes, not when
    # a file the flag names does.
    import hashlib

    dest = os.path.join(target_dir, "pgo", "libcudaleak-%s.profdata" % hashlib.sha256(data).hexdigest()[:16])
    if os.path.isfile(dest):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".profdata.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, dest)
    return dest


def _zig_platform():
    """Whether zig can link for this machine (glibc Linux on a machine that
    ziglang has wheels for)."""
    return (
        sys.platform.startswith("linux")
        and platform.machine() in ZIG_MACHINES
        and platform.libc_ver()[0] == "glibc"
    )


class _Zig(object):
    """What linking through zig needs: cargo-zigbuild and zig."""

    def __init__(self, cargo_zigbuild, env):
        self.cargo_zigbuild = cargo_zigbuild
        self.env = env


def _find_zig(mode):
    if mode == "no" or not _zig_platform():
        if mode == "yes":
            _fail("zig=yes, but zig links only for glibc Linux on %s" % " or ".join(ZIG_MACHINES))
        return None
    cargo_zigbuild = shutil.which("cargo-zigbuild")
    env = {}
    try:
        import importlib.util

        has_ziglang = importlib.util.find_spec("ziglang") is not None
    except (ImportError, ValueError):
        has_ziglang = False
    if has_ziglang:
        # maturin and cargo-zigbuild run `python3 -m ziglang` by default,
        # which may be another interpreter than the one holding ziglang.
        env["CARGO_ZIGBUILD_PYTHON_PATH"] = sys.executable
    if cargo_zigbuild and (has_ziglang or shutil.which("zig")):
        return _Zig(cargo_zigbuild, env)
    if mode == "yes":
        _fail("zig=yes, but %s missing: pip install %s" % (
            "cargo-zigbuild is" if not cargo_zigbuild else "zig is",
            " ".join("'%s'" % r for r in ZIG_REQUIREMENTS),
        ))
    return None


def _maturin_config():
    import maturin

    return maturin.get_config()


def _manylinux_glibc(tag):
    """'manylinux_2_28' -> '2.28'."""
    parts = (tag or "").split("_")
    if len(parts) != 3 or parts[0] != "manylinux" or not (parts[1].isdigit() and parts[2].isdigit()):
        _fail("pyproject.toml's [tool.maturin] compatibility must be manylinux_X_Y, not %r" % (tag,))
    return "%s.%s" % (parts[1], parts[2])


def _run_checked(cmd, env=None, stdout=None):
    """Runs a build step; on failure its own output says why and the build
    stops (cargo's diagnostics go to stderr, which the frontend shows)."""
    sys.stdout.flush()
    try:
        done = subprocess.run(cmd, env=env, stdout=stdout)
    except OSError as e:
        _fail("cannot run %s: %s" % (cmd[0], e))
    if done.returncode != 0:
        _fail("%s failed with exit status %d (its output is above)" % (" ".join(cmd[:2]), done.returncode))
    return done


def _target_directory(cargo):
    out = _run_checked(
        [cargo, "metadata", "--format-version", "1", "--no-deps"],
        stdout=subprocess.PIPE,
    )
    return json.loads(out.stdout.decode())["target_directory"]


def _triple():
    return "%s-unknown-linux-gnu" % platform.machine()


def _profiled_functions():
    path = os.path.join(os.getcwd(), PROFILED_FUNCTIONS_IN_CRATE)
    try:
        with open(path) as f:
            return {line.strip() for line in f.read(1 << 20).splitlines() if line.strip()}
    except OSError:
        return set()


def _cargo_build_step(cmd, env):
    """Runs a cargo build with JSON messages: shows the compiler's
    diagnostics as cargo would, and returns its exit status, the .so it
    built, the functions rustc found changed since the optimization
    profile was made, those it found no counts for, and the errors."""
    sys.stdout.flush()
    try:
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE)
    except OSError as e:
        _fail("cannot run %s: %s" % (cmd[0], e))
    library, changed, missing, errors = None, [], set(), []
    for line in done.stdout.decode(errors="replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") == "compiler-message":
            rendered = (message.get("message") or {}).get("rendered") or ""
            if PROFILE_MISSING in rendered:
                # one per function the profile does not count: most never
                # run in the shapes, and say nothing
                missing.add(rendered.split(PROFILE_MISSING, 1)[1].split()[0])
                continue
            sys.stderr.write(rendered)
            if (message.get("message") or {}).get("level") == "error":
                errors.append(rendered)
            if PROFILE_MISMATCH in rendered:
                changed.append(rendered.split(PROFILE_MISMATCH, 1)[1].split()[0])
        elif message.get("reason") == "compiler-artifact":
            if "cdylib" not in message.get("target", {}).get("kind", []):
                continue
            for name in message.get("filenames", []):
                if name.endswith(".so"):
                    library = name
    sys.stderr.flush()
    return done.returncode, library, changed, missing, errors


def _build_library(cargo, zig, profile, pgo):
    """Builds libcudaleak.so and copies it to python/cudaleak/_lib/, where
    maturin takes it into the wheel. With zig, in a target directory of its
    own: cargo-zigbuild and maturin set the compiler environment
    differently, and in one directory each would rebuild what the other
    built. Without, the command's crate after it, in the same directory,
    where maturin then finds it built. `cargo rustc` gives the optimization
    profile to the library's crate only: its dependencies' code that the
    hooks run is inlined into it and profiled there."""
    env = dict(os.environ)
    env["CARGO"] = cargo
    target_dir = _target_directory(cargo)
    if zig is not None:
        glibc = _manylinux_glibc(_maturin_config().get("compatibility"))
        env.update(zig.env)
        cmd = [zig.cargo_zigbuild, "rustc", "--target", "%s.%s" % (_triple(), glibc)]
        cmd += ["--target-dir", os.path.join(target_dir, "wheel-lib")]
        _note("building libcudaleak.so with zig, for glibc %s" % glibc)
    else:
        cmd = [cargo, "rustc"]
        _note("building libcudaleak.so and the command with this machine's linker")
    cmd += ["-p", LIBRARY_CRATE, "--lib", "--profile", profile, "--message-format=json"]
    profdata = _optimization_profile(pgo, target_dir, zig is not None, cargo)
    library = None
    if profdata is not None:
        flags = ["-Cprofile-use=" + profdata, "-Cllvm-args=-pgo-warn-missing-function"]
        status, library, changed, missing, errors = _cargo_build_step(cmd + ["--"] + flags, env)
        if status != 0 and not any("profile" in e.lower() for e in errors):
            # (a compile error of its own: the same without the profile)
            _fail("%s failed with exit status %d (its output is above)" % (" ".join(cmd[:2]), status))
        if status != 0:
            # The profile is damaged, or this rustc cannot read it.
            if pgo == "strict":
                _fail("pgo=strict, but the library did not build with the optimization profile "
                      "(the output is above)")
            _note("the library did not build with the optimization profile (the output is above): "
                  "building it without")
            library = None
        else:
            lost = sorted(set(changed) | (missing & _profiled_functions()))
            if lost:
                shown = ", ".join(lost[:3]) + (" and %d more" % (len(lost) - 3) if len(lost) > 3 else "")
                why = ("%d function(s) that ran in the profile changed or missing in this build "
                       "(the code changed since it was made: %s)" % (len(lost), shown))
                if pgo == "strict":
                    _fail("pgo=strict, but %s; scripts/pgo-profile.sh makes a new profile" % why)
                _note("libcudaleak.so is optimized with the profile, less %s" % why)
            else:
                _note("libcudaleak.so is optimized with the profile of the benchmark shapes")
    if library is None:
        status, library, _, _, _ = _cargo_build_step(cmd, env)
        if status != 0:
            _fail("%s failed with exit status %d (its output is above)" % (" ".join(cmd[:2]), status))
    if library is None or not os.path.isfile(library):
        _fail("cargo built no libcudaleak.so (%s)" % " ".join(cmd))
    if zig is None:
        _run_checked([cargo, "build", "-p", COMMAND_CRATE, "--profile", profile], env=env)
    dest = os.path.join(os.getcwd(), LIBRARY_IN_PACKAGE)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    # A new file renamed over the old one: a running program that mapped
    # the previous library keeps its copy.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".libcudaleak.")
    try:
        with os.fdopen(fd, "wb") as f, open(library, "rb") as src:
            shutil.copyfileobj(src, f)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest


def _maturin_settings(config_settings, zig):
    """maturin's config settings with the linking options added: the
    user's own maturin arguments (MATURIN_PEP517_ARGS, maturin.build-args)
    come last, so they win."""
    import maturin

    if zig is not None:
        ours = ["--zig", "--target", _triple()]
        compatibility = _maturin_config().get("compatibility")
    else:
        # maturin's hooks default to the plain platform tag too; said here
        # so that pyproject.toml's manylinux compatibility, which only
        # zig's linking makes true, is never checked against this glibc.
        ours = []
        compatibility = "linux"
    user = maturin.get_maturin_pep517_args(config_settings)
    if not any(a == "--compatibility" or a.startswith("--compatibility=") for a in user):
        ours += ["--compatibility", compatibility]
    settings = dict(config_settings or {})
    settings.pop("build-args", None)
    settings["maturin.build-args"] = ours + user
    return settings


def _build(wheel_directory, config_settings, metadata_directory, editable):
    _put_scripts_dir_on_path()
    cargo = _cargo()
    zig = _find_zig(_zig_mode(config_settings))
    if zig is None:
        _note("no zig: the wheel is for this machine only (plain platform tag); "
              "with ziglang and cargo-zigbuild it would be manylinux")
    config = _maturin_config()
    _build_library(cargo, zig, config.get("profile", "release"), _pgo_mode(config_settings))
    import maturin

    saved = dict(os.environ)
    os.environ["CARGO"] = cargo
    if zig is not None:
        os.environ.update(zig.env)
    # maturin would leave a copy of each wheel in the target directory's
    # wheels/, where scripts/build-wheel.sh keeps the one it made.
    out = tempfile.mkdtemp(prefix="cudaleak-wheel-")
    try:
        settings = _maturin_settings(config_settings, zig)
        settings["maturin.build-args"] = ["--out", out] + settings["maturin.build-args"]
        if editable:
            return maturin.build_editable(wheel_directory, settings, metadata_directory)
        return maturin.build_wheel(wheel_directory, settings, metadata_directory)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


# --- PEP 517 hooks ----------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    _put_scripts_dir_on_path()
    _cargo()
    import maturin

    requires = list(maturin.get_requires_for_build_wheel(config_settings))
    # Only when asked: docs/packaging.md, "The tag", says why isolated
    # builds do not fetch zig by default.
    if _zig_mode(config_settings) == "yes" and _zig_platform():
        requires += ZIG_REQUIREMENTS
    return requires


def get_requires_for_build_editable(config_settings=None):
    return get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    _put_scripts_dir_on_path()
    _cargo()
    import maturin

    return list(maturin.get_requires_for_build_sdist(config_settings))


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _put_scripts_dir_on_path()
    cargo = _cargo()
    import maturin

    os.environ["CARGO"] = cargo
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, config_settings, metadata_directory, editable=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, config_settings, metadata_directory, editable=True)


def build_sdist(sdist_directory, config_settings=None):
    _put_scripts_dir_on_path()
    cargo = _cargo()
    import maturin

    os.environ["CARGO"] = cargo
    name = maturin.build_sdist(sdist_directory, config_settings)
    _complete_sdist(cargo, os.path.join(sdist_directory, name))
    return name


# --- the sdist ----------------------------------------------------------------


def _library_crate_files(cargo):
    """The library crate's files as `cargo package` would ship them (what
    git tracks, less what the crate excludes), relative to the crate."""
    out = _run_checked(
        [cargo, "package", "--list", "--allow-dirty", "-p", LIBRARY_CRATE],
        stdout=subprocess.PIPE,
    )
    crate = os.path.join(os.getcwd(), LIBRARY_CRATE_DIR)
    # cargo also lists what it would generate (Cargo.toml.orig, the
    # normalized Cargo.toml, .cargo_vcs_info.json): the files on disk are
    # the ones to ship, with the workspace's own Cargo.toml.
    files = [
        rel
        for rel in out.stdout.decode().splitlines()
        if rel and os.path.isfile(os.path.join(crate, rel))
    ]
    if "Cargo.toml" not in files:
        _fail("cargo package --list names no Cargo.toml for %s" % LIBRARY_CRATE)
    return files


def _complete_sdist(cargo, path):
    """maturin's sdist holds the command's crate and its path dependencies,
    with the workspace's members cut down to those. Adds the library's
    crate, puts the workspace's own Cargo.toml back (all members), and
    leaves out a library built earlier into the Python package: the sdist
    is source only."""
    files = _library_crate_files(cargo)
    with tarfile.open(path, "r:gz") as old:
        members = [(m, old.extractfile(m).read() if m.isfile() else None) for m in old.getmembers()]
    top = members[0][0].name.split("/")[0]
    lib_in_package = "%s/%s" % (top, LIBRARY_IN_PACKAGE.replace(os.sep, "/"))
    root = os.getcwd()
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as new:
        for member, data in members:
            if member.name == lib_in_package:
                continue
            if member.name == "%s/Cargo.toml" % top:
                with open(os.path.join(root, "Cargo.toml"), "rb") as f:
                    data = f.read()
                member.size = len(data)
            new.addfile(member, _bytes_io(data) if data is not None else None)
        mtime = members[0][0].mtime
        for rel in sorted(files):
            src = os.path.join(root, LIBRARY_CRATE_DIR, rel)
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo("%s/%s/%s" % (top, LIBRARY_CRATE_DIR, rel))
            info.size = len(data)
            info.mode = 0o755 if os.access(src, os.X_OK) else 0o644
            info.mtime = mtime
            new.addfile(info, _bytes_io(data))
    os.replace(tmp, path)


def _bytes_io(data):
    import io

    return io.BytesIO(data)
