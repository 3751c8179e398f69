//! The dynamic loader, asked directly: glibc's own `dlsym` and `dlclose`
//! (we override both), the count that changes whenever an object is loaded
//! or unloaded, and which loaded object holds an address (ours included).
//! Nothing here allocates or takes a lock of ours: the `dlsym` override,
//! hooks and the unwinder call it.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The real `dlsym`; the override jumps here for every name it does not wrap.
pub static CUDALEAK_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's own `name` (a function we override, such as `dlsym` or
/// `dlclose`), found with `dlvsym`, which we do not override, and cached
/// in `slot`; 0 when there is none. glibc >= 2.34 versions dlsym and
/// dlclose as GLIBC_2.34 in libc; older ones as GLIBC_2.2.5 (x86-64) /
/// GLIBC_2.17 (aarch64) in libdl.
pub fn glibc_next(slot: &AtomicUsize, name: &CStr) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
        // SAFETY: plain loader lookup with valid C strings.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), version.as_ptr()) } as usize;
        if p != 0 {
            slot.store(p, Ordering::Release);
            return p;
        }
    }
    0
}

pub fn real_dlsym_fn() -> Option<DlsymFn> {
    match glibc_next(&CUDALEAK_REAL_DLSYM, c"dlsym") {
        0 => None,
        // SAFETY: p is the address of glibc's dlsym.
        p => Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) }),
    }
}

/// `dlsym` without our override in the way.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym_fn() {
        // SAFETY: valid handle semantics are the caller's; name is C string.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

// ---- the set of loaded objects ----

/// A number that changes whenever an object is loaded or unloaded:
/// glibc's `dlpi_adds + dlpi_subs`, read from the first object that
/// `dl_iterate_phdr` visits (no allocation, one short loader lock).
pub fn loaded_generation() -> u64 {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
        let end_of_subs = std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8;
        if size >= end_of_subs {
            // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` of
            // `size` bytes, which reach `dlpi_subs` (checked above), alive
            // for this call; `data` is the `&mut g` given below, a live u64
            // that nothing else touches while the iteration runs.
            unsafe {
                let info = &*info;
                *(data as *mut u64) = info.dlpi_adds.wrapping_add(info.dlpi_subs);
            }
        }
        1
    }
    let mut g: u64 = 0;
    // SAFETY: the callback only reads the info it is given.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut g as *mut u64 as *mut c_void) };
    // 0 means "never failed" to the callers below.
    g.max(1)
}

/// Whether `addr` lies in a loaded segment of some loaded object.
pub fn is_loaded_address(addr: usize) -> bool {
    module_range(addr).is_some()
}

type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

pub fn real_dlclose_fn() -> Option<DlcloseFn> {
    match glibc_next(&REAL_DLCLOSE, c"dlclose") {
        0 => None,
        // SAFETY: p is the address of glibc's dlclose.
        p => Some(unsafe { std::mem::transmute::<usize, DlcloseFn>(p) }),
    }
}

/// `dlclose` without our override in the way.
pub fn real_dlclose(handle: *mut c_void) -> c_int {
    match real_dlclose_fn() {
        // SAFETY: glibc's own dlclose; every caller passes a handle its own
        // dlopen (RTLD_NOLOAD) returned, dropping the reference it added.
        Some(f) => unsafe { f(handle) },
        None => -1,
    }
}

static OWN_START: AtomicUsize = AtomicUsize::new(0);
static OWN_END: AtomicUsize = AtomicUsize::new(0);

/// The address range of libcudaleak.so's loaded segments.
pub fn own_range() -> (usize, usize) {
    let start = OWN_START.load(Ordering::Acquire);
    if start != 0 {
        return (start, OWN_END.load(Ordering::Acquire));
    }
    let probe = own_range as *const () as usize;
    match find_module(probe) {
        Some(m) => {
            OWN_END.store(m.end, Ordering::Release);
            OWN_START.store(m.start, Ordering::Release);
            (m.start, m.end)
        }
        None => (0, 0),
    }
}

/// What the loader says about the object that contains an address.
/// (Only x86-64's fast unwinder reads the .eh_frame fields.)
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct Module {
    pub start: usize,
    pub end: usize,
    /// runtime address and size of PT_GNU_EH_FRAME (.eh_frame_hdr)
    pub eh_frame_hdr: Option<(usize, usize)>,
    /// end of the PT_LOAD segment holding .eh_frame_hdr (bounds .eh_frame)
    pub eh_segment_end: usize,
}

pub fn find_module(addr: usize) -> Option<Module> {
    struct Search {
        addr: usize,
        found: Option<Module>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `&mut s` given to `dl_iterate_phdr` below,
        // live and not otherwise used while the iteration runs.
        let s = unsafe { &mut *(data as *mut Search) };
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info`, alive
        // for this call.
        let info = unsafe { &*info };
        let base = info.dlpi_addr as usize;
        // SAFETY: the loader's program headers of this object: `dlpi_phnum`
        // entries at `dlpi_phdr`, mapped while the object is loaded, which
        // the loader lock held during the iteration guarantees.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let inside = phdrs.iter().any(|p| {
            p.p_type == libc::PT_LOAD
                && base + p.p_vaddr as usize <= s.addr
                && s.addr < base + (p.p_vaddr + p.p_memsz) as usize
        });
        if !inside {
            return 0;
        }
        // SAFETY: `info` is what `dl_iterate_phdr` passed this callback.
        let Some((lo, hi)) = (unsafe { load_range(info) }) else {
            return 0;
        };
        let hdr = phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_GNU_EH_FRAME)
            .map(|p| (base + p.p_vaddr as usize, p.p_memsz as usize));
        let seg_end = hdr
            .and_then(|(h, _)| {
                phdrs.iter().find_map(|p| {
                    let (a, b) = (base + p.p_vaddr as usize, base + (p.p_vaddr + p.p_memsz) as usize);
                    (p.p_type == libc::PT_LOAD && a <= h && h < b).then_some(b)
                })
            })
            .unwrap_or(hi);
        s.found = Some(Module {
            start: lo,
            end: hi,
            eh_frame_hdr: hdr,
            eh_segment_end: seg_end,
        });
        1
    }
    let mut s = Search { addr, found: None };
    // SAFETY: the callback only reads the loader's program headers.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut s as *mut Search as *mut libc::c_void) };
    s.found
}

/// The lowest and highest address of an object's loaded segments, as
/// `find_module` computes them for the one object it finds (`dlclose`
/// snapshots every object).
///
/// # Safety
/// `info` is what `dl_iterate_phdr` passes its callback.
pub unsafe fn load_range(info: &libc::dl_phdr_info) -> Option<(usize, usize)> {
    let base = info.dlpi_addr as usize;
    // SAFETY: the caller passes what `dl_iterate_phdr` gave its callback
    // (this function's `# Safety`), so its
    // `dlpi_phnum` program headers at `dlpi_phdr` are mapped (the loader
    // lock is held for the callback's duration).
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let (mut lo, mut hi) = (usize::MAX, 0);
    for p in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
        lo = lo.min(base + p.p_vaddr as usize);
        hi = hi.max(base + (p.p_vaddr + p.p_memsz) as usize);
    }
    (lo < hi).then_some((lo, hi))
}

/// The range of the loaded object that contains `addr`, if any.
pub fn module_range(addr: usize) -> Option<(usize, usize)> {
    find_module(addr).map(|m| (m.start, m.end))
}

/// Whether `p` lies in libcudaleak.so itself: one of our hooks, never a
/// real CUDA function (a lookup that finds our own export found no real
/// function; handing it back as one would make a hook call itself).
#[inline]
pub fn is_own_address(p: usize) -> bool {
    let (lo, hi) = own_range();
    if hi != 0 {
        return lo <= p && p < hi;
    }
    same_object_as_us(p)
}

/// The loader asked another way, for when our own range could not be had
/// (it always can, but a wrong "not ours" would let a hook become its own
/// real function and call itself forever): whether `p` and this function
/// lie in one loaded object.
#[cold]
fn same_object_as_us(p: usize) -> bool {
    let base = |addr: usize| {
        // SAFETY: zeroed Dl_info is a valid out parameter.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads loader state into `info`.
        let ok = unsafe { libc::dladdr(addr as *const c_void, &mut info) };
        (ok != 0).then_some(info.dli_fbase as usize)
    };
    match (base(p), base(same_object_as_us as *const () as usize)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}
