//! Where an address lies in its module: the module's load bias and GNU
//! build-id, read from the program headers the loader mapped (never from
//! the file, which may have been replaced since). A report then carries
//! `module+0xOFFSET` and the build-id for every native frame, and a
//! symbolizer can find the matching debug file on any machine later.
//! Runs at dump time only, cached per module.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// One loaded module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// `dlpi_addr`: what is added to the file's addresses when it is mapped
    pub bias: u64,
    /// its `NT_GNU_BUILD_ID`, lower-case hex
    pub build_id: Option<String>,
}

/// Build-ids per load bias and first segment: a module unloaded and another
/// loaded at the same place has other segments, so a stale entry is only
/// used for the same mapping.
static CACHE: Mutex<Option<BuildIds>> = Mutex::new(None);

/// (load bias, first segment's address) → build-id.
type BuildIds = HashMap<(u64, u64), Option<String>>;

const NT_GNU_BUILD_ID: u32 = 3;

/// The GNU build-id in a block of ELF notes (`PT_NOTE` contents).
pub fn build_id_in_notes(mut notes: &[u8]) -> Option<String> {
    fn word(b: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    }
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let namesz = word(notes, 0)? as usize;
        let descsz = word(notes, 4)? as usize;
        let kind = word(notes, 8)?;
        let name_at = 12;
        let desc_at = name_at + align4(namesz);
        let next = desc_at.checked_add(align4(descsz))?;
        let name = notes.get(name_at..name_at + namesz)?;
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
        }
        notes = notes.get(next..)?;
    }
    None
}

struct Search {
    pc: u64,
    found: Option<(u64, u64, Option<String>)>,
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid info; data is our Search.
    let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let bias = info.dlpi_addr;
    let inside = phdrs.iter().any(|p| {
        p.p_type == libc::PT_LOAD
            && search.pc >= bias.wrapping_add(p.p_vaddr)
            && search.pc < bias.wrapping_add(p.p_vaddr).wrapping_add(p.p_memsz)
    });
    if !inside {
        return 0;
    }
    let first_load = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_LOAD)
        .map_or(0, |p| bias.wrapping_add(p.p_vaddr));
    let mut build_id = None;
    for p in phdrs.iter().filter(|p| p.p_type == libc::PT_NOTE) {
        // SAFETY: a PT_NOTE segment of a loaded module is mapped readable.
        let notes = unsafe {
            std::slice::from_raw_parts(bias.wrapping_add(p.p_vaddr) as *const u8, p.p_memsz as usize)
        };
        if let Some(id) = build_id_in_notes(notes) {
            build_id = Some(id);
            break;
        }
    }
    search.found = Some((bias, first_load, build_id));
    1
}

/// The loaded module containing `pc`, or None (JIT code, unmapped).
pub fn module_at(pc: u64) -> Option<Module> {
    let mut search = Search { pc, found: None };
    // SAFETY: dl_iterate_phdr calls `visit` with valid infos and our pointer.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    let (bias, first_load, build_id) = search.found?;
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let build_id = cache
        .get_or_insert_with(HashMap::new)
        .entry((bias, first_load))
        .or_insert(build_id)
        .clone();
    Some(Module { bias, build_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_build_id_note_among_others() {
        let mut notes = Vec::new();
        // An ABI tag note first (type 1, name "GNU").
        for w in [4u32, 16, 1] {
            notes.extend_from_slice(&w.to_ne_bytes());
        }
        notes.extend_from_slice(b"GNU\0");
        notes.extend_from_slice(&[0u8; 16]);
        for w in [4u32, 3, NT_GNU_BUILD_ID] {
            notes.extend_from_slice(&w.to_ne_bytes());
        }
        notes.extend_from_slice(b"GNU\0");
        notes.extend_from_slice(&[0xab, 0x01, 0xff, 0]);
        assert_eq!(build_id_in_notes(&notes).as_deref(), Some("ab01ff"));
        assert_eq!(build_id_in_notes(&notes[..20]), None);
    }

    #[test]
    fn this_test_binary_has_a_module_with_a_bias() {
        let pc = finds_the_build_id_note_among_others as *const () as usize as u64;
        let m = module_at(pc).expect("the test binary is a loaded module");
        assert!(pc >= m.bias);
    }
}
