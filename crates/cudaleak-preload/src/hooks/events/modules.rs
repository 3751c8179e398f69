//! Modules and libraries loaded (cuModuleLoad*, cuLibraryLoad*) and
//! unloaded: one block of kind `module` per loaded one, keyed by its
//! handle, with the loading call's stack; its bytes are the device
//! globals of its image as far as they can be read
//! (`cudaleak_core::record::module_image`).

use super::*;
use cudaleak_core::record::module_image::{self, Kind, HEADER_BYTES};

/// Where a module's image is.
pub enum ModuleImage {
    /// in the program's memory (a cubin, a fatbin, PTX, or the runtime's
    /// fatbin wrapper)
    Data(*const c_void),
    /// in a file
    File(*const c_char),
}

/// A module or library load: `out` receives its handle.
pub struct ModuleLoad {
    pub api: Api,
    pub out: *mut *mut c_void,
    pub image: ModuleImage,
}

impl Event for ModuleLoad {
    type State = ();
    fn before(&self, _: &mut HookCx) -> Option<()> {
        tracker::note_allocation_call();
        Some(())
    }
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        if result != CUDA_SUCCESS || self.out.is_null() {
            return;
        }
        // SAFETY: the program's out parameter, written by the successful
        // call; read unaligned.
        let handle = unsafe { self.out.read_unaligned() } as u64;
        if handle == 0 {
            return;
        }
        let bytes = match self.image {
            // SAFETY: the image the driver has just loaded from, readable
            // as far as its own headers say (`image_bytes`).
            ModuleImage::Data(p) => unsafe { image_bytes(p.cast(), 0) },
            ModuleImage::File(path) => file_bytes(path),
        };
        let thread = cx.thread;
        tracker::record_allocation(
            handle,
            bytes.unwrap_or(0),
            self.api,
            MemoryKind::Module,
            cx.stack(),
            None,
            thread,
        );
    }
}

/// The first bytes at `p`, at most `N`, stopping after a NUL: PTX text may
/// be shorter than `N` bytes, and a C string is readable up to its NUL.
///
/// # Safety
/// `p` is readable as a C string or as at least `N` bytes.
unsafe fn prefix<const N: usize>(p: *const u8) -> ([u8; N], usize) {
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        // SAFETY: every byte before this one was not NUL, so the string
        // (or the longer image) goes on.
        *b = unsafe { p.add(i).read() };
        if *b == 0 {
            return (out, i + 1);
        }
    }
    (out, N)
}

/// The device globals of the image at `p`, when it is a cubin, a fatbin
/// or the runtime's wrapper of one.
///
/// # Safety
/// `p` is an image the driver accepted: a cubin or fatbin spanning what its
/// headers say, PTX text, or the runtime's wrapper of a fatbin.
unsafe fn image_bytes(p: *const u8, depth: u32) -> Option<u64> {
    if p.is_null() || depth > 1 {
        return None;
    }
    // SAFETY: per the function's contract.
    let (first, got) = unsafe { prefix::<4>(p) };
    if got < 4 {
        return None;
    }
    match module_image::kind(&first) {
        Kind::Other => None,
        Kind::Wrapper => {
            // { int magic; int version; const void *data; ... }
            // SAFETY: the wrapper is at least 16 bytes (its magic said so);
            // read unaligned.
            let data = unsafe { p.add(8).cast::<*const u8>().read_unaligned() };
            // SAFETY: the fatbin the wrapper points to.
            unsafe { image_bytes(data, depth + 1) }
        }
        Kind::Elf | Kind::Fatbin => {
            // SAFETY: a cubin's ELF header is 64 bytes; a fatbin's header
            // (16) is followed by at least one entry's (64).
            let header = unsafe { std::slice::from_raw_parts(p, HEADER_BYTES) };
            let len = usize::try_from(module_image::extent(header)?).ok()?;
            // SAFETY: the image spans what its headers say: the driver
            // read it so.
            let image = unsafe { std::slice::from_raw_parts(p, len) };
            module_image::global_bytes(image)
        }
    }
}

/// The device globals of the image in the file `path` (mapped, only the
/// pages of its headers read).
fn file_bytes(path: *const c_char) -> Option<u64> {
    if path.is_null() {
        return None;
    }
    // SAFETY: the NUL-terminated path the program passed, which the
    // successful call read.
    let path = unsafe { std::ffi::CStr::from_ptr(path) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let mapped = cudaleak_core::base::safe_read::Mapped::open(path, module_image::MAX_IMAGE_BYTES)?;
    module_image::global_bytes(mapped.bytes())
}

/// cuModuleUnload, cuLibraryUnload: the module's block, taken out before
/// the call and put back if it fails (case 3).
pub const FREES_MODULE: KindSet = &frees(&[MemoryKind::Module], &[]);

/// cuModuleUnload, cuLibraryUnload. A handle not recorded (a module loaded
/// before tracking began, or by a library function no hook saw) is not a
/// bad free: the driver says whether the handle was good.
pub struct ModuleUnload(pub *mut c_void);

impl Event for ModuleUnload {
    type State = Option<cudaleak_core::record::Block>;
    fn before(&self, cx: &mut HookCx) -> Option<Self::State> {
        (!self.0.is_null()).then(|| tracker::remove_block(self.0 as u64, FREES_MODULE, cx.thread))
    }
    fn after(&self, cx: &mut HookCx, removed: Self::State, result: c_int) {
        if removed.is_some() {
            tracker::finish_release(self.0 as u64, removed, result == CUDA_SUCCESS, cx.thread);
        }
    }
}
