//! Modules and libraries loaded (cuModuleLoad*, cuLibraryLoad*) and
//! unloaded: one block of kind `module` per loaded one, keyed by its
//! handle, with the loading call's stack; its bytes are the device
//! globals of its image as far as they can be read
//! (`cudaleak_core::record::module_image`).

use super::*;
use cudaleak_core::record::module_image::{self, Bytes, ImageReader, Kind};

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
            ModuleImage::Data(p) => image_bytes(p.cast()),
            ModuleImage::File(path) => file_bytes(path),
        };
        let thread = cx.thread;
        let trace = cx.trace(self.api, MemoryKind::Module);
        tracker::record_traced_allocation(
            handle,
            bytes.unwrap_or(0),
            self.api,
            MemoryKind::Module,
            trace,
            None,
            thread,
        );
    }
}

/// The program's memory from an address on, read with `process_vm_readv`
/// on this very process: an address that cannot be read fails the read
/// (EFAULT) instead of faulting, whatever an image's headers claim. Where
/// the call is refused (a seccomp filter), nothing is read.
struct ProgramMemory(usize);

impl ImageReader for ProgramMemory {
    fn read(&self, at: u64, buf: &mut [u8]) -> bool {
        let Some(addr) = usize::try_from(at).ok().and_then(|a| self.0.checked_add(a)) else {
            return false;
        };
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: buf.len(),
        };
        // SAFETY: a system call that copies into `buf`, which it may fill
        // entirely; the remote range is checked by the kernel, not touched
        // by this process.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        usize::try_from(n) == Ok(buf.len())
    }
}

/// The device globals of the image at `p` (a cubin, a fatbin or the
/// runtime's wrapper of one; PTX and anything else: not known).
fn image_bytes(p: *const u8) -> Option<u64> {
    if p.is_null() {
        return None;
    }
    let memory = ProgramMemory(p as usize);
    let mut wrapper = [0u8; 16];
    if !memory.read(0, &mut wrapper[..4]) {
        return None;
    }
    if module_image::kind(&wrapper[..4]) == Kind::Wrapper {
        // { int magic; int version; const void *data; ... }
        if !memory.read(0, &mut wrapper) {
            return None;
        }
        let data = u64::from_le_bytes(wrapper[8..16].try_into().ok()?);
        return (data != 0)
            .then(|| module_image::global_bytes(&ProgramMemory(data as usize)))
            .flatten();
    }
    module_image::global_bytes(&memory)
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
    module_image::global_bytes(&Bytes(mapped.bytes()))
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
