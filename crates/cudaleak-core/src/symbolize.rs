//! Dump-time symbolization of raw return addresses: demangled function,
//! file, line and module, inlined frames expanded (innermost first).
//!
//! Hooks only record addresses; this runs on the dumping thread. Results
//! are cached for the life of the process, so repeated dumps (signals,
//! intervals) pay only for addresses they have not seen.

use crate::report::NativeFrame;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};

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

/// Symbolizes addresses of the current process.
#[derive(Default)]
pub struct ProcessSymbolizer {
    cache: HashMap<u64, Vec<NativeFrame>>,
}

impl ProcessSymbolizer {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Path of the loaded object that contains `addr`, from the dynamic loader.
pub fn module_of(addr: u64) -> Option<String> {
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

impl SymbolSource for ProcessSymbolizer {
    fn symbolize(&mut self, return_address: u64) -> Vec<NativeFrame> {
        if let Some(hit) = self.cache.get(&return_address) {
            return hit.clone();
        }
        // The call instruction ends just before the return address; looking
        // up `ra - 1` gives the caller's line, not the next statement's.
        let pc = return_address.saturating_sub(1);
        let module = module_of(pc);
        // Offset and build-id: what a symbolizer needs later, elsewhere.
        let located = crate::module_location::module_at(pc);
        let offset = located.as_ref().map(|m| hex(pc.wrapping_sub(m.bias)));
        let build_id = located.and_then(|m| m.build_id);
        let mut frames = Vec::new();
        backtrace::resolve(pc as *mut c_void, |sym| {
            frames.push(NativeFrame {
                address: hex(pc),
                function: sym.name().map(|n| format!("{n:#}")),
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
