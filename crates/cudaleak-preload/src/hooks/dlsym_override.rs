//! Our `dlsym`: a lookup of a name in the hook table gets the hook
//! (`hooks/mod.rs`) in place of the real function, which `resolve`
//! remembers; every other lookup goes to glibc's `dlsym` untouched. On the
//! top floor with the hooks it hands out. And our `dlclose`, beside it:
//! what pointed into an object it unloaded is forgotten.
//!
//! Rules, each from a bug other interposers hit:
//! - it neither allocates nor locks, and keeps the caller's `RTLD_NEXT`
//!   semantics: for a name we do not wrap it does not *call* the real
//!   `dlsym` but *jumps* to it, so glibc sees the original return address
//!   and searches after the caller's object, not ours;
//! - only names in the hook table are intercepted, compared in full:
//!   cudnn*, cublas* and curl* also start with "cu".

use crate::base::loader::{is_own_address, load_range, real_dlclose, real_dlsym, real_dlsym_fn};
use crate::cuda::hook_table::{HookId, Layer};
use crate::hooks::resolve::global::{global_real, offer};
use crate::hooks::resolve::scope::{
    adopt_for_caller, caller_implements, forget_unloaded, note_scope_event, real_for_caller,
};
use crate::hooks::{hook_address, HANDOUTS};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// `decide` result: let the real `dlsym` answer (the override jumps to
/// it with the caller's return address intact).
const PASS: usize = 0;
/// `decide` result: return NULL (dlerror was set).
const NOT_FOUND: usize = 1;

/// Decides what our `dlsym` returns for a call from `caller` (its return
/// address): [`PASS`], [`NOT_FOUND`], or anything else is returned as is
/// (a hook).
extern "C" fn cudaleak_dlsym_decide(handle: *mut c_void, name: *const c_char, caller: usize) -> usize {
    // Make sure the jump target exists before deciding anything (issue:
    // without it the override jumped to address 0).
    if real_dlsym_fn().is_none() {
        return NOT_FOUND;
    }
    if name.is_null() {
        return PASS;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: dlsym's contract: name is a C string.
        let name = unsafe { CStr::from_ptr(name) };
        let Some(id) = HookId::by_name(name.to_bytes()) else {
            return PASS;
        };
        if handle == libc::RTLD_NEXT {
            // What comes after the *caller*: only the real dlsym, jumped
            // to, knows. A wrapper library that defines cudaDeviceReset
            // and forwards to dlsym(RTLD_NEXT, "cudaDeviceReset") must get the next
            // definition, not our hook (whose real function, looked up in
            // the wrapper's scope, is the wrapper: endless recursion).
            return PASS;
        }
        if id.layer() == Layer::Runtime {
            // The program may now hold a runtime function that a global
            // lookup answers differently than before (the
            // adopted answer is trusted between such events).
            note_scope_event();
        }
        let p = real_dlsym(handle, name) as usize;
        if p == 0 {
            return PASS; // not there: the real dlsym says so, and sets dlerror
        }
        let hook = hook_address(id);
        if p == hook {
            // The lookup found our own export first (RTLD_DEFAULT, or the
            // program's handle): the hook stands in only if a real
            // function exists behind it, for this caller. (RTLD_DEFAULT
            // searches the caller's scope too: an RTLD_LOCAL plugin finds
            // its own libcudart; tests/loading.rs checks it without us.)
            let behind = match id.layer() {
                Layer::Driver => global_real(id),
                Layer::Runtime => real_for_caller(id, caller),
            };
            return if behind != 0 { hook } else { not_found(name) };
        }
        let substitute = match id.layer() {
            // A wrapper of the driver looking up the function it wraps
            // below itself gets that function (the hook called
            // the wrapper back, forever).
            Layer::Driver if caller_implements(caller, id) => None,
            Layer::Driver => offer(id, p, HANDOUTS),
            Layer::Runtime => (!is_own_address(p) && adopt_for_caller(id, p, caller)).then_some(hook),
        };
        substitute.unwrap_or(PASS)
    })
    .unwrap_or(PASS)
}

/// NULL for a lookup of `name` that, without us, finds nothing: a lookup
/// of it in libc's scope (which has no CUDA function) sets dlerror as the
/// program expects ("libc.so.6: undefined symbol: cuMemAlloc_v2").
#[cold]
fn not_found(name: &CStr) -> usize {
    static LIBC: AtomicUsize = AtomicUsize::new(0);
    let mut h = LIBC.load(Ordering::Acquire);
    if h == 0 {
        // SAFETY: NOLOAD lookup of a loaded library name.
        h = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) } as usize;
        if h != 0 {
            real_dlclose(h as *mut c_void);
            LIBC.store(h, Ordering::Release);
        }
    }
    if h != 0 {
        // Its result is NULL: libc defines no CUDA name.
        let _ = real_dlsym(h as *mut c_void, name);
    }
    NOT_FOUND
}

/// Our `dlsym`. A naked function: it must not have a frame of its own when
/// it jumps to the real `dlsym`, which reads its caller from the return
/// address (glibc's `RETURN_ADDRESS (0)` for RTLD_NEXT). The CFI lines
/// let debuggers, profilers and `backtrace()` unwind through it.
///
/// # Safety
/// Called as `dlsym` by the program.
#[cfg(all(target_arch = "x86_64", not(test)))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        ".cfi_startproc",
        // Keep the arguments for the jump; realign the stack for the call.
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        // The caller's return address, for the decision.
        "mov rdx, [rsp + 24]",
        "call {decide}",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "jz 2f",
        "cmp rax, 1",
        // Labels 0 and 1 read as binary literals to LLVM's x86 parser,
        // which rustc 1.88 (our rust-version) denies (binary_asm_labels).
        "jne 3f",
        "xor eax, eax",
        "3:",
        "ret",
        // Tail jump: the real dlsym sees our caller's return address.
        "2:",
        "jmp qword ptr [rip + {real}]",
        ".cfi_endproc",
        decide = sym cudaleak_dlsym_decide,
        real = sym crate::base::loader::CUDALEAK_REAL_DLSYM,
    )
}

/// See the x86-64 version.
///
/// # Safety
/// Called as `dlsym` by the program.
#[cfg(all(target_arch = "aarch64", not(test)))]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        ".cfi_startproc",
        "stp x29, x30, [sp, #-32]!",
        ".cfi_def_cfa_offset 32",
        ".cfi_offset x29, -32",
        ".cfi_offset x30, -24",
        "stp x0, x1, [sp, #16]",
        // The caller's return address, for the decision.
        "mov x2, x30",
        "bl {decide}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        "cbz x16, 2f",
        "cmp x16, #1",
        "csel x0, xzr, x16, eq",
        "ret",
        "2:",
        // x16 (or x17), not any other register: with BTI, glibc's dlsym
        // starts with `bti c` (or `paciasp`), which an indirect `br`
        // reaches only through x16/x17 (else SIGILL at startup on
        // Grace/GH200). No aarch64 machine here to test it on.
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "br x16",
        ".cfi_endproc",
        decide = sym cudaleak_dlsym_decide,
        real = sym crate::base::loader::CUDALEAK_REAL_DLSYM,
    )
}

// ---- the dlclose override: objects that go ----

const SNAPSHOT_MAX: usize = 256;
const NAME_MAX: usize = 256;

/// The loaded objects (ranges and names) before a `dlclose`, and their
/// ranges after it: static (the override neither allocates nor locks, and
/// 70 KiB do not belong on a small thread stack), taken with a try-flag:
/// a second thread closing at the same moment never waits, it checks
/// every cached pointer against the loader instead (slower, and its
/// unloaded objects are not named).
struct Snapshot {
    before: Objects,
    after: Objects,
    names: [[u8; NAME_MAX]; SNAPSHOT_MAX],
    gone: Objects,
}

/// Up to SNAPSHOT_MAX ranges: the newest ones (the loader lists objects
/// in load order, and the newest are the likeliest to be closed).
struct Objects {
    ranges: [(usize, usize); SNAPSHOT_MAX],
    /// how many were visited; the kept ones are the last
    /// min(seen, SNAPSHOT_MAX), in a ring
    seen: usize,
}

impl Objects {
    const EMPTY: Objects = Objects {
        ranges: [(0, 0); SNAPSHOT_MAX],
        seen: 0,
    };

    fn kept(&self) -> &[(usize, usize)] {
        &self.ranges[..self.seen.min(SNAPSHOT_MAX)]
    }

    fn contains(&self, p: usize) -> bool {
        self.kept().iter().any(|&(lo, hi)| lo <= p && p < hi)
    }
}

static SNAPSHOT_BUSY: AtomicBool = AtomicBool::new(false);
static SNAPSHOT: SnapshotCell = SnapshotCell(std::cell::UnsafeCell::new(Snapshot {
    before: Objects::EMPTY,
    after: Objects::EMPTY,
    names: [[0; NAME_MAX]; SNAPSHOT_MAX],
    gone: Objects::EMPTY,
}));
struct SnapshotCell(std::cell::UnsafeCell<Snapshot>);
// SAFETY: accessed only by the thread holding SNAPSHOT_BUSY.
unsafe impl Sync for SnapshotCell {}

/// For the lifecycle's fork child handler: a parent thread may have been
/// inside `dlclose` at the fork, holding the snapshot, which no thread of
/// the child will ever give back.
pub fn reset_after_fork() {
    SNAPSHOT_BUSY.store(false, Ordering::Release);
}

/// Records the loaded objects' ranges in `objects` (and their names in
/// `names`, when given).
fn list_loaded(objects: &mut Objects, names: Option<&mut [[u8; NAME_MAX]; SNAPSHOT_MAX]>) {
    struct Walk<'a> {
        objects: &'a mut Objects,
        names: Option<&'a mut [[u8; NAME_MAX]; SNAPSHOT_MAX]>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Walk` that `list_loaded` lent
        // dl_iterate_phdr for this call, and `info` the loader's record of
        // one loaded object, valid while the callback runs.
        let (w, info) = unsafe { (&mut *(data as *mut Walk), &*info) };
        // SAFETY: `info` is what dl_iterate_phdr passed this callback.
        let Some(range) = (unsafe { load_range(info) }) else {
            return 0;
        };
        let at = w.objects.seen % SNAPSHOT_MAX;
        if let Some(names) = w.names.as_deref_mut() {
            let slot = &mut names[at];
            slot[0] = 0;
            if !info.dlpi_name.is_null() {
                // SAFETY: the loader's name of the object, a C string while
                // the callback runs; copied out before it returns.
                let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
                let k = name.len().min(NAME_MAX - 1);
                slot[..k].copy_from_slice(&name[..k]);
                slot[k] = 0;
            }
        }
        w.objects.ranges[at] = range;
        w.objects.seen += 1;
        0
    }
    objects.seen = 0;
    let mut w = Walk { objects, names };
    // SAFETY: the callback only reads the loader's program headers.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut w as *mut Walk as *mut c_void) };
}

/// Our `dlclose`. After the real one, if objects went away, everything
/// that pointed into them is forgotten: cached real functions (a later
/// call must never jump into unmapped memory), the callers' scopes,
/// unwind rules; and their names are kept so that blocks they allocated
/// still name their module (`cudaleak-core`'s `symbolize/mod.rs`).
///
/// The forgetting comes after the unmapping: which objects a `dlclose`
/// unloads (dependencies whose last reference goes, or none when another
/// handle holds them) only the loader knows. A thread that calls into an
/// object while another thread unloads it races in the program already
/// (without us, the same call would jump into the unmapped object). The
/// global table holds no private runtime copy (see `ADOPTED` in `resolve/scope.rs`), so a
/// call from an object with a runtime of its own, or a global one, never
/// meets a closing plugin's pointers.
///
/// # Safety
/// Called as `dlclose` by the program.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = crate::base::loader::real_dlclose_fn() else {
        return -1;
    };
    let generation = crate::base::loader::loaded_generation();
    let owned = !SNAPSHOT_BUSY.swap(true, Ordering::Acquire);
    // SAFETY: the snapshot is ours while SNAPSHOT_BUSY is held (owned).
    let snap = owned.then(|| unsafe { &mut *SNAPSHOT.0.get() });
    let mut snap = snap.and_then(|s| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            list_loaded(&mut s.before, Some(&mut s.names));
        }))
        .ok()
        .map(|_| s)
    });
    // SAFETY: glibc's own dlclose, given the program's handle as the
    // program passed it: the program's call meets its contract, as it
    // would without us.
    let result = unsafe { real(handle) };
    if crate::base::loader::loaded_generation() != generation {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match snap.as_deref_mut() {
            Some(s) => forget_unloaded_since(s),
            None => forget_unloaded(&|p| !crate::base::loader::is_loaded_address(p)),
        }));
    }
    if owned {
        SNAPSHOT_BUSY.store(false, Ordering::Release);
    }
    result
}

/// Compares the objects before and after: the gone ones are named for
/// the report and every cached pointer is checked against their list
/// (one loader walk, whatever the number of cached pointers).
fn forget_unloaded_since(s: &mut Snapshot) {
    list_loaded(&mut s.after, None);
    s.gone.seen = 0;
    for (i, &(lo, hi)) in s.before.kept().iter().enumerate() {
        if s.after.kept().contains(&(lo, hi)) {
            continue;
        }
        let slot = &s.names[i];
        let len = slot.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
        cudaleak_core::symbolize::note_unloaded(lo as u64, hi as u64, &slot[..len]);
        s.gone.ranges[s.gone.seen] = (lo, hi);
        s.gone.seen += 1;
    }
    if s.gone.seen == 0 {
        return;
    }
    let gone = &s.gone;
    forget_unloaded(&|p| gone.contains(p));
}
