//! Code objects: the guard that tells one from a later one at the same
//! address, and the names and line tables reports keep of them.

use super::interpreter::{ACTIVE, LAYOUT, STATE};
use super::memory::{plausible, read};
use crate::capture::python_layouts::PyLayout;
use cudaleak_core::record::python::{CodeInfo, CodeTable, PyRawFrame};
use std::sync::atomic::Ordering;

/// The code objects seen in captured stacks, with their names and line
/// tables, read while they were alive ([`remember_code_objects`]); the
/// dump resolves Python frames with it.
pub static CODES: CodeTable = CodeTable::new();

/// Tells a code object from a later one at the same (freed and reused)
/// address: its qualified-name and line-table objects, which sit on one
/// cache line of the code object. A new code object at the same address
/// with both the same is, for our purposes, the same code.
///
/// # Safety
/// `code` is a live code object of the interpreter `l` was checked against.
#[inline(always)]
pub(super) unsafe fn guard(l: &PyLayout, code: usize) -> u64 {
    // SAFETY: two pointer fields of the live code object at the checked
    // layout's offsets (the contract).
    let name: usize = unsafe { read(code + l.code_qualname.unwrap_or(l.code_name)) };
    // SAFETY: the line-table pointer field of the live code object at the
    // checked layout's offset (the contract); a plain word.
    let table: usize = unsafe { read(code + l.code_linetable) };
    (name as u64) ^ (table as u64).rotate_left(32)
}

/// Reads a str object (compact layout) into a String.
///
/// # Safety
/// `obj` is implausible (then None) or a live str object of the
/// interpreter `l` was checked against (a code object's name or file).
unsafe fn read_str(l: &PyLayout, obj: usize) -> Option<String> {
    if !plausible(obj, 8) {
        return None;
    }
    // SAFETY: the length field in the header of `obj`, a live str object
    // (the contract: plausible, checked above), at the checked layout's
    // offset; a plain integer.
    let len: isize = unsafe { read(obj + l.unicode_length) };
    if !(0..=(1 << 20)).contains(&len) {
        return None;
    }
    // SAFETY: the `state` bit field in the header of the same live str, at
    // the checked layout's offset; a plain integer.
    let state: u32 = unsafe { read(obj + l.unicode_state) };
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact {
        return None;
    }
    let len = len as usize;
    if ascii {
        // SAFETY: a compact ASCII str keeps its `len` bytes inline, right
        // after the `PyASCIIObject` header; the object is live and not
        // mutated (strs are immutable), and `len` is capped above.
        let data = unsafe { std::slice::from_raw_parts((obj + l.unicode_ascii_size) as *const u8, len) };
        return Some(String::from_utf8_lossy(data).into_owned());
    }
    let data = obj + l.unicode_compact_size;
    // SAFETY: a compact non-ASCII str keeps `len` code units of `kind`
    // bytes (1, 2 or 4, matched below) inline after the
    // `PyCompactUnicodeObject` header, allocated and aligned by CPython
    // for that kind; immutable and live, `len` capped above.
    let chars: String = unsafe {
        match kind {
            1 => std::slice::from_raw_parts(data as *const u8, len)
                .iter()
                .map(|&b| b as char)
                .collect(),
            2 => char::decode_utf16(
                std::slice::from_raw_parts(data as *const u16, len)
                    .iter()
                    .copied(),
            )
            .map(|c| c.unwrap_or('\u{fffd}'))
            .collect(),
            4 => std::slice::from_raw_parts(data as *const u32, len)
                .iter()
                .map(|&c| char::from_u32(c).unwrap_or('\u{fffd}'))
                .collect(),
            _ => return None,
        }
    };
    Some(chars)
}

/// Copies a bytes object's content.
///
/// # Safety
/// `obj` is implausible (then None) or a live bytes object of the
/// interpreter `l` was checked against (a code object's line table).
unsafe fn read_bytes(l: &PyLayout, obj: usize) -> Option<Vec<u8>> {
    if !plausible(obj, 8) {
        return None;
    }
    // SAFETY: `ob_size` of `obj`, a live bytes object (the contract:
    // plausible, checked above), at the checked layout's offset.
    let len: isize = unsafe { read(obj + l.bytes_size) };
    if !(0..=(1 << 24)).contains(&len) {
        return None;
    }
    // SAFETY: a bytes object keeps its `ob_size` bytes inline at `ob_sval`;
    // live and immutable, `len` capped above.
    Some(unsafe { std::slice::from_raw_parts((obj + l.bytes_data) as *const u8, len as usize) }.to_vec())
}

/// Copies what reports need of each code object of `frames` not copied
/// yet. Runs when a new trace is stored (rule 4); the code objects are
/// alive, their frames are on this thread's stack.
pub fn remember_code_objects(frames: &[PyRawFrame]) {
    if frames.is_empty() || STATE.load(Ordering::Acquire) != ACTIVE {
        return;
    }
    // SAFETY: ACTIVE means LAYOUT is set.
    let l = unsafe { &*LAYOUT.load(Ordering::Acquire) };
    for f in frames {
        if CODES.contains(f.code, f.guard) {
            continue;
        }
        let code = f.code as usize;
        // SAFETY: a live code object, checked by type in capture.
        let info = unsafe {
            CodeInfo {
                filename: read_str(l, read(code + l.code_filename)).unwrap_or_else(|| "<unknown>".into()),
                qualname: read_str(l, read(code + l.code_qualname.unwrap_or(l.code_name)))
                    .unwrap_or_else(|| "<unknown>".into()),
                firstlineno: read(code + l.code_firstlineno),
                format: l.line_format,
                linetable: read_bytes(l, read(code + l.code_linetable)).unwrap_or_default(),
            }
        };
        CODES.insert(f.code, f.guard, info);
    }
}
