//! Our `dlsym`: a lookup of a name in the hook table gets the hook
//! (`hooks.rs`) in place of the real function, which `resolve` remembers;
//! every other lookup goes to glibc's `dlsym` untouched. On the top floor
//! with the hooks it hands out.
//!
//! Rules, each from a bug other interposers hit:
//! - it neither allocates nor locks, and keeps the caller's `RTLD_NEXT`
//!   semantics: for a name we do not wrap it does not *call* the real
//!   `dlsym` but *jumps* to it, so glibc sees the original return address
//!   and searches after the caller's object, not ours;
//! - only names in the hook table are intercepted, compared in full:
//!   cudnn*, cublas* and curl* also start with "cu".

use crate::base::loader::{is_own_address, real_dlclose, real_dlsym, real_dlsym_fn};
use crate::cuda::hook_table::{HookId, Layer};
use crate::hooks::hook_address;
use crate::hooks::resolve::{
    adopt_for_caller, caller_implements, global_real, note_scope_event, offer, real_for_caller,
};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

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
            // to, knows. A wrapper library that defines cudaMalloc and
            // forwards to dlsym(RTLD_NEXT, "cudaMalloc") must get the next
            // definition, not our hook (whose real function, looked up in
            // the wrapper's scope, is the wrapper: endless recursion).
            return PASS;
        }
        if id.layer() == Layer::Runtime {
            // The program may now hold a runtime function that a global
            // lookup answers differently than before (issue 24: the
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
            // below itself gets that function (issue 22: the hook called
            // the wrapper back, forever).
            Layer::Driver if caller_implements(caller, id) => false,
            Layer::Driver => offer(id, p, hook),
            Layer::Runtime => !is_own_address(p) && adopt_for_caller(id, p, caller),
        };
        if substitute {
            hook
        } else {
            PASS
        }
    })
    .unwrap_or(PASS)
}

/// NULL for a lookup of `name` that, without us, finds nothing: a lookup
/// of it in libc's scope (which has no CUDA function) sets dlerror as the
/// program expects ("libc.so.6: undefined symbol: cudaMalloc").
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
        "jne 1f",
        "xor eax, eax",
        "1:",
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
