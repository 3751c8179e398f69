//! The hooks. Bottom up:
//!
//! 1. the real function behind each hook: `resolve`
//! 2. what each call means: `events`
//! 3. dlsym handing out hooks: `dlsym_override`
//!
//! This file: the hooks themselves, one exported `extern "C-unwind"`
//! function per line of the hook table (`hook_table.rs`), which finds the real function
//! (`resolve/`), lets the event look at the call before and after it
//! (`events/`), and returns the real result unchanged; and
//! [`hook_address`], which `dlsym`, `cuGetProcAddress` and
//! `cudaGetDriverEntryPoint` hand out instead of the real address.
//!
//! Exports are `#[cfg_attr(not(test), no_mangle)]` (as bytehound does), so
//! the unit-test binary of this crate does not interpose on itself.
//!
//! Hooks and the real functions they call are `extern "C-unwind"`: a
//! thread cancelled inside the real call (`pthread_cancel` acts at the
//! driver's cancellation points) unwinds through the hook to the program,
//! as it would without us. Under `extern "C"` any unwind through a hook
//! aborted the process. No `catch_unwind` is live around the real call:
//! catching glibc's forced unwind without rethrowing it aborts too
//! ("FATAL: exception not rethrown").

pub mod dlsym_override;
pub mod events;
pub mod resolve;

use crate::cuda::ffi::*;
use crate::cuda::hook_table::*;
use crate::hooks::events::*;
use cudaleak_core::record::{Api, MemoryKind::*};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

macro_rules! cuda_hooks {
    ($(
        $layer:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            $(as $base:ident @ $since:literal $($per_thread:ident)?)?
            => $event:expr;
    )*) => {
        /// The address handed out in place of the real function.
        pub fn hook_address(id: HookId) -> usize {
            match id { $(HookId::$name => exports::$name as *const () as usize),* }
        }

        /// The address handed out in place of a driver function that is
        /// not the global definition of its name (`resolve/global.rs`,
        /// `ALTERNATE`); 0 for runtime functions.
        pub fn alternate_hook_address(id: HookId) -> usize {
            match id { $(HookId::$name => alternate_address!($layer $name)),* }
        }

        /// Driver hooks that call the function a lookup gave rather than
        /// the global definition: not exported, only handed out.
        pub mod alternates {
            #![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            use super::*;
            $(
                alternate_body!($layer fn $name($($arg: $ty),*) -> $ret => $event);
            )*
        }

        /// What each hook does once its real function is known.
        pub mod bodies {
            #![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            use super::*;
            $(
                hook_body!($layer fn $name($($arg: $ty),*) -> $ret => $event);
            )*
        }

        /// The exported symbols: a driver hook is its body; a runtime hook
        /// is an entry stub that notes its caller first (`resolve/scope.rs`).
        pub mod exports {
            #![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            use super::*;
            $(
                hook_export!($layer fn $name($($arg: $ty),*) -> $ret);
            )*
        }
    };
}

/// The body of one hook: find the real function, let the event watch the
/// call. A runtime hook takes the real function its caller's own scope
/// binds (two libcudart copies each keep theirs, an RTLD_LOCAL plugin's
/// libcudart is found), which its entry stub looked up.
macro_rules! hook_body {
    (Driver fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $event:expr) => {
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
            type Real = unsafe extern "C-unwind" fn($($ty),*) -> $ret;
            let Some(real) = crate::hooks::resolve::global::real::<Real>(HookId::$name) else {
                return crate::hooks::resolve::global::missing_result(HookId::$name);
            };
            // SAFETY: `real` is the next definition of this very symbol
            // (the loader's, by name), so it has the hooked signature, and
            // it gets the program's own arguments unchanged: the program's
            // call meets its contract, as it would without us.
            crate::hooks::events::intercept(Layer::Driver, || $event, || unsafe { real($($arg),*) })
        }
    };
    (Runtime fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $event:expr) => {
        /// `real`: what the entry stub found for the caller (0: nothing).
        pub unsafe extern "C-unwind" fn $name(real: usize, $($arg: $ty),*) -> $ret {
            type Real = unsafe extern "C-unwind" fn($($ty),*) -> $ret;
            if real == 0 {
                return crate::hooks::resolve::global::missing_code(HookId::$name);
            }
            // SAFETY: a function of the hooked signature, from the loader.
            let real = unsafe { std::mem::transmute::<usize, Real>(real) };
            // SAFETY: the real function of this name in the calling object's
            // scope, called with the program's own arguments unchanged: the
            // program's call meets its contract, as it would without us.
            crate::hooks::events::intercept(Layer::Runtime, || $event, || unsafe { real($($arg),*) })
        }
    };
}

/// A driver hook whose real function is the one a lookup gave (a shim's
/// own, or the driver's past a wrapper): the same event, another callee.
/// Runtime hooks have none: theirs is found per caller (`resolve/scope.rs`).
macro_rules! alternate_body {
    (Driver fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $event:expr) => {
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
            type Real = unsafe extern "C-unwind" fn($($ty),*) -> $ret;
            let Some(real) = crate::hooks::resolve::global::alternate_real::<Real>(HookId::$name) else {
                return crate::hooks::resolve::global::missing_result(HookId::$name);
            };
            // SAFETY: `real` is what a lookup of this very name gave the
            // program (`offer`), so it has the hooked signature, and it
            // gets the program's own arguments unchanged: the program's
            // call meets its contract, as it would without us.
            crate::hooks::events::intercept(Layer::Driver, || $event, || unsafe { real($($arg),*) })
        }
    };
    (Runtime fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $event:expr) => {};
}

macro_rules! alternate_address {
    (Driver $name:ident) => {
        alternates::$name as *const () as usize
    };
    (Runtime $name:ident) => {
        0
    };
}

/// What lookups may hand out for a hooked function (`resolve/global.rs`).
pub const HANDOUTS: crate::hooks::resolve::global::Handouts = crate::hooks::resolve::global::Handouts {
    hook: hook_address,
    alternate: alternate_hook_address,
};

/// The exported symbol of one hook.
macro_rules! hook_export {
    (Driver fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        pub use super::bodies::$name;
    };
    // The stub reads the return address (the caller's), has the real
    // function for that caller looked up, restores the argument registers,
    // shifts them by one to pass the real function first, and jumps to the
    // body: the stack is as the caller left it, so arguments passed in
    // memory (a struct passed by value) stay in place. Hence at most 5
    // integer argument registers (x86-64 has 6), counted per type by
    // [`RegisterArgument`] below, checked at compile time.
    (Runtime fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        const _: () = assert!(
            0 $(+ <$ty as RegisterArgument>::INTEGER_REGISTERS)* <= 5,
            "a runtime hook's arguments take at most 5 integer registers"
        );

        #[cfg(target_arch = "x86_64")]
        #[cfg_attr(not(test), no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
            std::arch::naked_asm!(
                // CFI, so that debuggers, profilers and backtrace() walk
                // through the stub.
                ".cfi_startproc",
                // r9 is no argument (at most 5); 5 pushes realign the stack.
                "push rdi",
                ".cfi_adjust_cfa_offset 8",
                "push rsi",
                ".cfi_adjust_cfa_offset 8",
                "push rdx",
                ".cfi_adjust_cfa_offset 8",
                "push rcx",
                ".cfi_adjust_cfa_offset 8",
                "push r8",
                ".cfi_adjust_cfa_offset 8",
                "mov rdi, [rsp + 40]",
                "mov esi, {id}",
                "call {enter}",
                "pop r8",
                ".cfi_adjust_cfa_offset -8",
                "pop rcx",
                ".cfi_adjust_cfa_offset -8",
                "pop rdx",
                ".cfi_adjust_cfa_offset -8",
                "pop rsi",
                ".cfi_adjust_cfa_offset -8",
                "pop rdi",
                ".cfi_adjust_cfa_offset -8",
                "mov r9, r8",
                "mov r8, rcx",
                "mov rcx, rdx",
                "mov rdx, rsi",
                "mov rsi, rdi",
                "mov rdi, rax",
                "jmp {body}",
                ".cfi_endproc",
                id = const HookId::$name as u32,
                enter = sym crate::hooks::resolve::scope::cudaleak_enter_runtime,
                body = sym super::bodies::$name,
            )
        }

        #[cfg(target_arch = "aarch64")]
        #[cfg_attr(not(test), no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
            std::arch::naked_asm!(
                ".cfi_startproc",
                "stp x29, x30, [sp, #-80]!",
                ".cfi_def_cfa_offset 80",
                ".cfi_offset x29, -80",
                ".cfi_offset x30, -72",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "stp x2, x3, [sp, #32]",
                "stp x4, x5, [sp, #48]",
                "stp x6, x7, [sp, #64]",
                "mov x0, x30",
                "mov x1, #{id}",
                "bl {enter}",
                "mov x9, x0",
                "ldp x1, x2, [sp, #16]",
                "ldp x3, x4, [sp, #32]",
                "ldp x5, x6, [sp, #48]",
                "ldr x7, [sp, #64]",
                "mov x0, x9",
                "ldp x29, x30, [sp], #80",
                ".cfi_def_cfa_offset 0",
                ".cfi_restore x29",
                ".cfi_restore x30",
                "b {body}",
                ".cfi_endproc",
                id = const HookId::$name as u32,
                enter = sym crate::hooks::resolve::scope::cudaleak_enter_runtime,
                body = sym super::bodies::$name,
            )
        }

/// Elsewhere the caller is unknown: the global lookup answers.
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
            let real = crate::hooks::resolve::scope::cudaleak_enter_runtime(0, HookId::$name as u32);
            // SAFETY: the body's contract is the hooked function's, with
            // the real function (or 0) first: the program's arguments pass
            // through unchanged.
            unsafe { super::bodies::$name(real, $($arg),*) }
        }
    };
}

/// A type a runtime hook may take as an argument, with the number of
/// integer argument registers it takes (x86-64 SysV, AAPCS64). Only the
/// types listed here compile: a float travels in an xmm/v register, which
/// the entry stub's call into Rust may clobber, and a by-value struct of
/// 9 to 16 bytes takes two registers; neither may be added without
/// changing the stubs. Larger structs travel in memory on x86-64 (0
/// registers) and by reference on aarch64 (1).
pub trait RegisterArgument {
    const INTEGER_REGISTERS: usize;
}

macro_rules! one_register {
    ($($t:ty),*) => {
        $(impl RegisterArgument for $t {
            const INTEGER_REGISTERS: usize = 1;
        })*
    };
}
one_register!(usize, c_int, c_uint, c_ulonglong);

impl<T> RegisterArgument for *mut T {
    const INTEGER_REGISTERS: usize = 1;
}

impl<T> RegisterArgument for *const T {
    const INTEGER_REGISTERS: usize = 1;
}

crate::cuda::hook_table::for_each_cuda_hook!(cuda_hooks);
