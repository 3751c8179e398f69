//! Names and lines for addresses. Bottom up:
//!
//! 1. where an address lies in its module: `module_location`
//! 2. one dump's frames, a report symbolized after the fact: `frame_table`, `offline`
//!
//! This file: dump-time symbolization of raw return addresses: demangled
//! function, file, line and module, inlined frames expanded (innermost
//! first).
//!
//! Hooks only record addresses; this runs on the dumping thread. Results
//! are cached for the life of the process, so repeated dumps (signals,
//! intervals) pay only for addresses they have not seen.

pub mod frame_table;
pub mod module_location;
pub mod offline;

use crate::report::NativeFrame;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Turns one return address into frames. A trait so that the report
/// assembly can be unit-tested with fake symbol tables.
pub trait SymbolSource {
    /// Frames for the call instruction before `return_address`, innermost
    /// (most inlined) first. Never empty.
    fn symbolize(&mut self, return_address: u64) -> Vec<NativeFrame>;
}

pub fn hex(addr: u64) -> String {
    format!("{addr:#x}")
}

/// A symbol's name as people read it: demangled when it is mangled (C++'s
/// Itanium `_Z…`, Rust's legacy `_ZN…h…E` and v0 `_R…`), else as written.
///
/// A C++ demangler also reads *types*: given a plain C name such as `f`,
/// `i`, `St` or `Dn` it answers `float`, `int`, `std` or
/// `std::nullptr_t`, which renamed C functions in reports and changed
/// their groups and what suppressions matched. Only a mangled prefix asks
/// for demangling.
pub fn demangle(raw: &str) -> String {
    let mangled = raw.starts_with("_Z") || raw.starts_with("_R") || raw.starts_with("__Z");
    if !mangled {
        return raw.to_string();
    }
    format!("{:#}", backtrace::SymbolName::new(raw.as_bytes()))
}

/// Symbolizes addresses of the current process.
#[derive(Default)]
pub struct ProcessSymbolizer {
    cache: HashMap<u64, Vec<NativeFrame>>,
    /// per module path: its own symbol table when it carries no line
    /// tables of its own (see [`ModuleSymbols`])
    modules: HashMap<String, ModuleSymbols>,
    /// per path of an object unloaded before the dump: its runtime
    /// allocation functions (see [`ProcessSymbolizer::unloaded_frame`])
    unloaded_runtimes: HashMap<String, UnloadedRuntime>,
}

/// The runtime allocation functions an unloaded object's file defines, at
/// offsets from its lowest loaded address (what [`unloaded_module_of`]
/// gives): (start, size, name), sorted by start.
#[derive(Default)]
struct UnloadedRuntime(Vec<(u64, u64, &'static str)>);

impl UnloadedRuntime {
    fn of_file(path: &str) -> UnloadedRuntime {
        let read = map_file(path, |data| {
            use object::{Object, ObjectSegment};
            let file = object::File::parse(data).ok()?;
            // The lowest loaded address is the lowest segment's: the
            // offsets count from it.
            let lowest = file.segments().map(|s| s.address()).min()?;
            let mut entries: Vec<(u64, u64, &'static str)> = function_symbols(&file)
                .into_iter()
                .filter_map(|(start, size, name)| {
                    let rt = crate::record::runtime_entries::RUNTIME_ATTRIBUTION
                        .iter()
                        .find(|(rt, _)| *rt == name)?;
                    Some((start.checked_sub(lowest)?, size, rt.0))
                })
                .collect();
            entries.sort();
            Some(UnloadedRuntime(entries))
        });
        read.unwrap_or_default()
    }

    fn function_at(&self, offset: u64) -> Option<&'static str> {
        let i = self.0.partition_point(|s| s.0 <= offset).checked_sub(1)?;
        let (start, size, name) = self.0[i];
        (offset < start + size).then_some(name)
    }
}

/// How the frames of one module are named at dump time.
///
/// The bug: a one-leak exit report took ~100 ms, 60 % of it
/// inflating the compressed DWARF of libc's separate debug file
/// (`/usr/lib/debug/.build-id/…`, where libc6-dbg is installed) to name
/// `__libc_start_call_main`, a start-up frame. A module without line
/// tables of its own is named from its own symbol table only; its lines,
/// from a debug file, are `cudaleak report --symbolize`'s work, after the
/// fact, where nothing waits on it.
enum ModuleSymbols {
    /// the module has `.debug_line`: the full DWARF lookup
    OwnLines,
    /// function symbols: (start, size, name), sorted by start
    SymbolsOnly(Vec<(u64, u64, String)>),
}

impl ModuleSymbols {
    fn of_file(path: &str) -> ModuleSymbols {
        map_file(path, |data| {
            use object::Object;
            let file = object::File::parse(data).ok()?;
            if file.section_by_name(".debug_line").is_some() || file.section_by_name(".zdebug_line").is_some()
            {
                return Some(ModuleSymbols::OwnLines);
            }
            let mut symbols = function_symbols(&file);
            // The symbol table of its debug file, if installed (libc6-dbg):
            // it names the static functions the module's own table lacks
            // (`__libc_start_call_main`, a start-up frame the text report
            // folds away by name), read without touching the DWARF.
            if let Some(id) = file.build_id().ok().flatten().filter(|id| id.len() > 1) {
                let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
                let debug = format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
                if let Some(more) = map_file(&debug, |data| {
                    Some(function_symbols(&object::File::parse(data).ok()?))
                }) {
                    symbols.extend(more);
                }
            }
            symbols.sort();
            symbols.dedup_by_key(|s| s.0);
            Some(ModuleSymbols::SymbolsOnly(symbols))
        })
        // Unreadable or not ELF: what backtrace makes of it.
        .unwrap_or(ModuleSymbols::OwnLines)
    }

    /// The demangled function at file address `at`, if a symbol covers it.
    fn function_at(symbols: &[(u64, u64, String)], at: u64) -> Option<String> {
        let i = symbols.partition_point(|s| s.0 <= at).checked_sub(1)?;
        let (start, size, name) = &symbols[i];
        (at < start + size).then(|| demangle(name))
    }
}

/// The function symbols of an object file, unsorted: (start, size, name).
pub fn function_symbols(file: &object::File<'_>) -> Vec<(u64, u64, String)> {
    use object::{Object, ObjectSymbol};
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .collect()
}

/// Runs `read` over the regular file at `path`, mapped read-only (only the
/// pages it touches are read: a symbol table, not a 2 GiB library).
fn map_file<T>(path: &str, read: impl FnOnce(&[u8]) -> Option<T>) -> Option<T> {
    read(crate::base::safe_read::Mapped::open(std::path::Path::new(path), u64::MAX)?.bytes())
}

impl ProcessSymbolizer {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Path of the loaded object that contains `addr`, from the dynamic loader.
pub fn module_of(addr: u64) -> Option<String> {
    // SAFETY: `Dl_info` is plain pointers and integers, all valid as zero.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads loader state; info is a valid out-pointer.
    let ok = unsafe { libc::dladdr(addr as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    if name.is_empty() {
        // The main program: the loader gives "", /proc/self/exe names it.
        return std::fs::read_link("/proc/self/exe")
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
    }
    Some(name)
}

// ---- objects that were unloaded ----
//
// A block allocated through a plugin that was dlclose'd later still
// names the plugin: the preload library notes each unloaded
// object here, from its `dlclose` override (no allocation, no lock: an
// append-only table of fixed entries, each published by its `ready`
// flag), and dump-time symbolization falls back to it for an address no
// loaded object holds, as module+offset.

const UNLOADED_MAX: usize = 128;
const UNLOADED_NAME: usize = 256;

struct UnloadedObject {
    lo: AtomicU64,
    hi: AtomicU64,
    len: AtomicUsize,
    name: UnsafeCell<[u8; UNLOADED_NAME]>,
    ready: AtomicBool,
}

struct UnloadedTable([UnloadedObject; UNLOADED_MAX]);
// SAFETY: an entry's name is written once, by the thread that claimed it,
// before `ready` is set; readers read it only after seeing `ready`.
unsafe impl Sync for UnloadedTable {}

static UNLOADED: UnloadedTable = UnloadedTable(
    [const {
        UnloadedObject {
            lo: AtomicU64::new(0),
            hi: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            name: UnsafeCell::new([0; UNLOADED_NAME]),
            ready: AtomicBool::new(false),
        }
    }; UNLOADED_MAX],
);
static UNLOADED_CLAIMED: AtomicUsize = AtomicUsize::new(0);

/// Remembers that the object at [lo, hi) named `name` was unloaded.
/// Allocates nothing and never blocks; past the table's size, later
/// unloads are not remembered (their frames keep a bare address).
pub fn note_unloaded(lo: u64, hi: u64, name: &[u8]) {
    let i = UNLOADED_CLAIMED.fetch_add(1, Ordering::AcqRel);
    let Some(e) = UNLOADED.0.get(i) else {
        UNLOADED_CLAIMED.store(UNLOADED_MAX, Ordering::Relaxed);
        return;
    };
    let n = name.len().min(UNLOADED_NAME);
    // SAFETY: entry i belongs to this thread until `ready` is set.
    unsafe { (&mut *e.name.get())[..n].copy_from_slice(&name[..n]) };
    e.len.store(n, Ordering::Relaxed);
    e.lo.store(lo, Ordering::Relaxed);
    e.hi.store(hi, Ordering::Relaxed);
    e.ready.store(true, Ordering::Release);
}

/// The most recently unloaded object that held `addr`: (path, offset).
pub fn unloaded_module_of(addr: u64) -> Option<(String, u64)> {
    let claimed = UNLOADED_CLAIMED.load(Ordering::Acquire).min(UNLOADED_MAX);
    UNLOADED.0[..claimed].iter().rev().find_map(|e| {
        if !e.ready.load(Ordering::Acquire) {
            return None;
        }
        let (lo, hi) = (e.lo.load(Ordering::Relaxed), e.hi.load(Ordering::Relaxed));
        if !(lo <= addr && addr < hi) {
            return None;
        }
        let len = e.len.load(Ordering::Relaxed);
        // SAFETY: published by `ready`, never written again.
        let name = unsafe { &(&*e.name.get())[..len] };
        let name = String::from_utf8_lossy(name).into_owned();
        let name = if name.is_empty() {
            "unknown unloaded object".into()
        } else {
            name
        };
        Some((name, addr - lo))
    })
}

impl ProcessSymbolizer {
    /// The frame of an address in an unloaded object: its module, and in
    /// place of a function name `module-file-name+offset` (the offset from
    /// the object's lowest loaded address), which `addr2line -e` resolves.
    /// A runtime allocation function (cudaMalloc) is named, from the
    /// object's file if it is still there, so that the blocks a runtime
    /// unloaded before the dump allocated are named by the runtime call,
    /// as every runtime allocation is (`record/runtime_entries.rs`).
    fn unloaded_frame(&mut self, pc: u64) -> Option<NativeFrame> {
        let (path, offset) = unloaded_module_of(pc)?;
        let base = path.rsplit('/').next().unwrap_or(&path).to_string();
        let runtime = self
            .unloaded_runtimes
            .entry(path.clone())
            .or_insert_with(|| UnloadedRuntime::of_file(&path))
            .function_at(offset);
        Some(NativeFrame {
            address: hex(pc),
            function: Some(runtime.map_or_else(|| format!("{base}+{offset:#x}"), str::to_string)),
            file: None,
            line: None,
            module: Some(path),
            offset: Some(hex(offset)),
            build_id: None,
        })
    }
}

impl SymbolSource for ProcessSymbolizer {
    fn symbolize(&mut self, return_address: u64) -> Vec<NativeFrame> {
        if let Some(hit) = self.cache.get(&return_address) {
            return hit.clone();
        }
        // The call instruction ends just before the return address; looking
        // up `ra - 1` gives the caller's line, not the next statement's.
        let pc = return_address.saturating_sub(1);
        let module = module_of(pc);
        if module.is_none() {
            if let Some(frame) = self.unloaded_frame(pc) {
                self.cache.insert(return_address, vec![frame.clone()]);
                return vec![frame];
            }
        }
        // Offset and build-id: what a symbolizer needs later, elsewhere.
        let located = crate::symbolize::module_location::module_at(pc);
        let offset = located.as_ref().map(|m| hex(pc.wrapping_sub(m.bias)));
        let bias = located.as_ref().map(|m| m.bias);
        let build_id = located.and_then(|m| m.build_id);
        let mut frames = Vec::new();
        if let (Some(path), Some(bias)) = (module.as_deref(), bias) {
            let symbols = self
                .modules
                .entry(path.to_string())
                .or_insert_with(|| ModuleSymbols::of_file(path));
            if let ModuleSymbols::SymbolsOnly(symbols) = symbols {
                let frame = NativeFrame {
                    address: hex(pc),
                    function: ModuleSymbols::function_at(symbols, pc.wrapping_sub(bias)),
                    file: None,
                    line: None,
                    module,
                    offset,
                    build_id,
                };
                self.cache.insert(return_address, vec![frame.clone()]);
                return vec![frame];
            }
        }
        backtrace::resolve(pc as *mut c_void, |sym| {
            frames.push(NativeFrame {
                address: hex(pc),
                function: sym
                    .name()
                    .map(|n| demangle(&String::from_utf8_lossy(n.as_bytes()))),
                file: sym.filename().map(|p| p.to_string_lossy().into_owned()),
                line: sym.lineno().map(i64::from),
                module: module.clone(),
                offset: offset.clone(),
                build_id: build_id.clone(),
            });
        });
        if frames.is_empty() {
            frames.push(NativeFrame {
                address: hex(pc),
                function: None,
                file: None,
                line: None,
                module,
                offset,
                build_id,
            });
        }
        self.cache.insert(return_address, frames.clone());
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mangled_names_are_demangled() {
        // plain C names that a C++ demangler reads as types
        for plain in [
            "f", "i", "v", "St", "Dn", "a", "b", "main", "site_a", "Z", "_start",
        ] {
            assert_eq!(demangle(plain), plain);
        }
        assert_eq!(demangle("_Z1fv"), "f()");
        assert_eq!(demangle("_ZN5torch5emptyEv"), "torch::empty()");
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate4main"), "mycrate::main");
        // a mangled-looking name the demangler cannot read stays as written
        assert_eq!(demangle("_ZN3foo"), "_ZN3foo");
    }

    #[inline(never)]
    fn here() -> u64 {
        // The return address of this call lies in the test function below.
        let mut ra = 0u64;
        backtrace::trace(|f| {
            ra = f.ip() as u64;
            false
        });
        ra
    }

    #[test]
    fn a_module_without_line_tables_of_its_own_is_named_from_its_symbols_only() {
        // libc.so.6 as distributions ship it: stripped, its DWARF in a
        // separate debug file (libc6-dbg), which a dump must not inflate.
        let malloc = libc::malloc as *const () as u64;
        let module = module_of(malloc).expect("libc is loaded");
        assert!(
            matches!(ModuleSymbols::of_file(&module), ModuleSymbols::SymbolsOnly(_)),
            "{module} carries line tables of its own: this test needs a distribution's stripped libc"
        );
        // A return address inside malloc (past its first instruction).
        let frames = ProcessSymbolizer::new().symbolize(malloc + 2);
        assert_eq!(frames.len(), 1, "{frames:?}");
        let f = &frames[0];
        assert!(
            f.function.as_deref().is_some_and(|n| n.contains("malloc")),
            "{f:?}"
        );
        assert_eq!((f.file.as_deref(), f.line), (None, None), "{f:?}");
        assert!(f.offset.is_some() && f.build_id.is_some(), "{f:?}");
    }

    #[test]
    fn symbolizes_an_address_of_this_test_binary() {
        let ra = here();
        let frames = ProcessSymbolizer::new().symbolize(ra);
        let f = &frames[0];
        assert!(f.module.is_some());
        assert!(f.address.starts_with("0x"));
        assert!(
            frames.iter().any(|f| f
                .function
                .as_deref()
                .is_some_and(|n| n.contains("here") || n.contains("trace"))),
            "{frames:?}"
        );
    }
}
