//! The device memory a CUDA module image holds for its globals.
//!
//! No driver call says how much memory a loaded module takes. Its
//! `__device__` variables are what it holds for as long as it is loaded:
//! in a cubin (an ELF file) they are the `.nv.global` (zero-initialized,
//! no file bytes) and `.nv.global.init` sections, whose sizes the section
//! headers give. A fatbin (magic `0xBA55ED50`) holds one or more such
//! cubins, one per architecture, of which the driver loads one: the
//! largest is taken. PTX text, compressed fatbin entries, and anything
//! else give `None`: not known. Code, constant banks and the driver's own
//! bookkeeping are not counted.
//!
//! The image comes from the program, without a length, and its headers
//! may claim more than the driver read: everything is read through an
//! [`ImageReader`], which the library backs with a copy that fails instead
//! of faulting, a few bytes at a time (headers and the section-name table,
//! never the code).

/// Reads `buf.len()` bytes of the image at offset `at`; false when they
/// cannot be read.
pub trait ImageReader {
    fn read(&self, at: u64, buf: &mut [u8]) -> bool;
}

/// An image in a slice (a mapped file, a test's bytes).
pub struct Bytes<'a>(pub &'a [u8]);

impl ImageReader for Bytes<'_> {
    fn read(&self, at: u64, buf: &mut [u8]) -> bool {
        let Ok(at) = usize::try_from(at) else { return false };
        match at.checked_add(buf.len()).and_then(|end| self.0.get(at..end)) {
            Some(src) => {
                buf.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
}

/// The image `inner` holds from offset `base` on (a fatbin's entry).
struct At<'a> {
    inner: &'a dyn ImageReader,
    base: u64,
}

impl ImageReader for At<'_> {
    fn read(&self, at: u64, buf: &mut [u8]) -> bool {
        self.base
            .checked_add(at)
            .is_some_and(|at| self.inner.read(at, buf))
    }
}

/// Image files larger are not read (the largest fatbins are a few GiB).
pub const MAX_IMAGE_BYTES: u64 = 1 << 32;
/// Section headers, names and fatbin entries read at most.
const MAX_SECTIONS: u64 = 4096;
const MAX_NAMES: u64 = 1 << 20;
const MAX_ENTRIES: usize = 1024;

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The runtime's fatbin wrapper (`__cudaRegisterFatBinary`'s argument): a
/// magic, a version, then a pointer to the fatbin.
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// What an image's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// a 64-bit little-endian ELF file (a cubin)
    Elf,
    Fatbin,
    /// the runtime's wrapper around a fatbin
    Wrapper,
    /// PTX text or anything else
    Other,
}

/// The kind of an image from its first 4 bytes.
pub fn kind(first: &[u8]) -> Kind {
    if first.get(..4) == Some(&ELF_MAGIC[..]) {
        Kind::Elf
    } else if u32_at(first, 0) == Some(FATBIN_MAGIC) {
        Kind::Fatbin
    } else if u32_at(first, 0) == Some(FATBIN_WRAPPER_MAGIC) {
        Kind::Wrapper
    } else {
        Kind::Other
    }
}

/// The bytes of `__device__` variables of a cubin or fatbin image.
pub fn global_bytes(image: &dyn ImageReader) -> Option<u64> {
    let mut first = [0u8; 4];
    if !image.read(0, &mut first) {
        return None;
    }
    match kind(&first) {
        Kind::Elf => elf_global_bytes(image),
        Kind::Fatbin => fatbin_global_bytes(image),
        Kind::Wrapper | Kind::Other => None,
    }
}

fn elf_global_bytes(elf: &dyn ImageReader) -> Option<u64> {
    let mut h = [0u8; 64];
    if !elf.read(0, &mut h) || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let shoff = u64_at(&h, 0x28)?;
    let shentsize = u16_at(&h, 0x3a)? as u64;
    let shnum = u16_at(&h, 0x3c)? as u64;
    let shstrndx = u16_at(&h, 0x3e)? as u64;
    if shentsize < 64 || shnum == 0 || shnum > MAX_SECTIONS || shstrndx >= shnum {
        return None;
    }
    let section = |i: u64| -> Option<(u32, u64, u64)> {
        let mut sh = [0u8; 64];
        let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
        if !elf.read(at, &mut sh) {
            return None;
        }
        // (name offset, file offset, size)
        Some((u32_at(&sh, 0)?, u64_at(&sh, 0x18)?, u64_at(&sh, 0x20)?))
    };
    let (_, names_at, names_len) = section(shstrndx)?;
    if names_len > MAX_NAMES {
        return None;
    }
    let mut names = vec![0u8; usize::try_from(names_len).ok()?];
    if !elf.read(names_at, &mut names) {
        return None;
    }
    let mut total = 0u64;
    for i in 0..shnum {
        let (name_at, _, size) = section(i)?;
        let name = names.get(name_at as usize..)?;
        let name = &name[..name.iter().position(|&c| c == 0)?];
        if name == b".nv.global" || name == b".nv.global.init" {
            total = total.checked_add(size)?;
        }
    }
    Some(total)
}

/// The largest of the fatbin's uncompressed cubins (one per architecture;
/// the driver loads one). None when it holds none that can be read.
fn fatbin_global_bytes(fatbin: &dyn ImageReader) -> Option<u64> {
    let mut h = [0u8; 16];
    if !fatbin.read(0, &mut h) {
        return None;
    }
    let header_size = u16_at(&h, 6)? as u64;
    let end = header_size.checked_add(u64_at(&h, 8)?)?;
    let mut at = header_size;
    let mut best: Option<u64> = None;
    // Each entry: kind (u16), version (u16), its header's size (u32), its
    // payload's size (u64), ..., then the payload.
    for _ in 0..MAX_ENTRIES {
        let mut e = [0u8; 16];
        if at.checked_add(16)? > end || !fatbin.read(at, &mut e) {
            break;
        }
        let entry_header = u32_at(&e, 4)? as u64;
        let payload = u64_at(&e, 8)?;
        if entry_header < 16 {
            break;
        }
        let start = at.checked_add(entry_header)?;
        // A compressed or PTX payload does not start with the ELF magic.
        let cubin = At {
            inner: fatbin,
            base: start,
        };
        let mut first = [0u8; 4];
        if cubin.read(0, &mut first) && kind(&first) == Kind::Elf {
            if let Some(n) = elf_global_bytes(&cubin) {
                best = Some(best.map_or(n, |b| b.max(n)));
            }
        }
        at = start.checked_add(payload)?;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cubin-like ELF with sections (name, size): a null section, the
    /// given ones, and the section-name table last.
    pub fn elf(sections: &[(&str, u64)]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_at = Vec::new();
        for (n, _) in sections {
            name_at.push(names.len() as u32);
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        let shstrtab_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let names_at = 64u64;
        let shoff = names_at + names.len() as u64;
        let shnum = sections.len() as u16 + 2;
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(&ELF_MAGIC);
        out[4] = 2;
        out[5] = 1;
        out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&shnum.to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&(shnum - 1).to_le_bytes());
        out.extend_from_slice(&names);
        let header = |name: u32, offset: u64, size: u64| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&offset.to_le_bytes());
            h[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            h
        };
        out.extend(header(0, 0, 0));
        for (i, (_, size)) in sections.iter().enumerate() {
            out.extend(header(name_at[i], 0, *size));
        }
        out.extend(header(shstrtab_name, names_at, names.len() as u64));
        out
    }

    fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut body = Vec::new();
        for e in entries {
            let mut h = vec![0u8; 64];
            h[..2].copy_from_slice(&2u16.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..16].copy_from_slice(&(e.len() as u64).to_le_bytes());
            body.extend(h);
            body.extend_from_slice(e);
        }
        let mut out = vec![0u8; 16];
        out[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        out[6..8].copy_from_slice(&16u16.to_le_bytes());
        out[8..16].copy_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend(body);
        out
    }

    #[test]
    fn a_cubin_s_globals_are_its_nv_global_sections() {
        let image = elf(&[
            (".text.kernel", 4096),
            (".nv.global", 1 << 20),
            (".nv.global.init", 4096),
            (".nv.constant0.kernel", 352),
        ]);
        assert_eq!(global_bytes(&Bytes(&image[..])), Some((1 << 20) + 4096));
        assert_eq!(global_bytes(&Bytes(&elf(&[(".text.k", 64)]))), Some(0));
    }

    #[test]
    fn a_fatbin_counts_its_largest_cubin() {
        let small = elf(&[(".nv.global", 100)]);
        let large = elf(&[(".nv.global", 300)]);
        let mut compressed = large.clone();
        compressed[0] = 0x13;
        let image = fatbin(&[small, compressed, large]);
        assert_eq!(global_bytes(&Bytes(&image[..])), Some(300));
        assert_eq!(global_bytes(&Bytes(&fatbin(&[b"// PTX".to_vec()]))), None);
    }

    #[test]
    fn ptx_and_cut_or_crafted_images_are_not_known() {
        let ptx = b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.5\n.target sm_90\n\0".to_vec();
        assert_eq!(kind(&ptx), Kind::Other);
        assert_eq!(global_bytes(&Bytes(&ptx[..])), None);
        let image = elf(&[(".nv.global", 1 << 20)]);
        for cut in [0, 4, 63, 64, 100, image.len() - 1] {
            // Never a panic, never a read past the slice: not known.
            assert_eq!(global_bytes(&Bytes(&image[..cut])), None, "{cut}");
        }
        let mut huge = image.clone();
        huge[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(global_bytes(&Bytes(&huge[..])), None);
        // A name offset past the names, a count beyond the cap.
        let mut odd = image.clone();
        odd[0x3c..0x3e].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(global_bytes(&Bytes(&odd[..])), None);
        let mut wrapper = vec![0u8; 16];
        wrapper[..4].copy_from_slice(&FATBIN_WRAPPER_MAGIC.to_le_bytes());
        assert_eq!(kind(&wrapper), Kind::Wrapper);
    }
}
