//! Everything a hook keeps per thread. The thread-local itself is small,
//! zero-initialized and without `Drop` (such a thread-local needs no
//! registration and stays usable while the thread is being torn down).
//! Hooks look it up once per call and pass the reference down.
//!
//! On x86-64 Linux it is one block of initial-exec TLS, defined in
//! assembly (stable Rust has no TLS model attribute): the lookup is two
//! instructions (`fs:0` plus the block's offset from the GOT) where a
//! `thread_local!` in a shared library is a `__tls_get_addr` call, about
//! 14 instructions, four times per alloc/free pair. The
//! library is loaded with `LD_PRELOAD`, so the block is in the static TLS
//! that the loader sets up at start (a later `dlopen` would take it from
//! glibc's reserve for such libraries). Elsewhere: a `thread_local!`.
//!
//! The cells here are plain values; each is owned by the module that uses
//! it (named on the field), and this file imports none of them. The large
//! per-thread buffers (replay logs, captured stacks) are `capture/mod.rs`'s,
//! reached through the one pointer [`ThreadState::buffers`]: glibc carves
//! static TLS out of each thread's stack, and 6.4 KB of it, plus a 2.5 KB
//! stack buffer in every hook frame, made threads with 16-24 KB stacks
//! crash in their first cudaMalloc.

use cudaleak_core::record::live_map::{Caller, Flight};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

pub struct ThreadState {
    /// A driver hook is running on this thread (a nested one passes through;
    /// `hooks/events/mod.rs`).
    pub in_driver_hook: Cell<bool>,
    /// An address in the running driver hook's frame (`in_driver_hook`):
    /// where a nested one looks up to for a signal frame.
    pub driver_hook_frame: Cell<usize>,
    /// The runtime hook running on this thread (`events::HookCx`), if any.
    pub runtime_call: Cell<*const ()>,
    /// (context, slot) last seen on this thread (`state/tracker/contexts.rs`).
    pub last_context: Cell<(u64, u8)>,
    /// This thread's stack, [low, high); (0, 0) until first needed
    /// (`capture/unwind/stack.rs`).
    pub stack_bounds: Cell<(usize, usize)>,
    /// (trace id, api, kind) of the last trace interned here; id 0: none
    /// (`capture/mod.rs`).
    pub last_trace: Cell<(u32, u8, u8)>,
    /// and the (native, Python) replay generations of its frames
    pub last_generations: Cell<(u64, u64)>,
    /// `capture/mod.rs`'s per-thread buffers: null until the thread's first
    /// capture, a sentinel once the thread's exit freed them.
    pub buffers: Cell<*mut c_void>,
    /// A capture into those buffers, or the interning of its stack, is
    /// running on this thread: a signal handler's hook that interrupted
    /// it captures nothing (`HookCx::trace` in `hooks/events/mod.rs`).
    pub capturing: Cell<bool>,
    /// (caller slot + 1, its seq) of this thread's last runtime call; 0:
    /// none yet (`hooks/resolve/scope.rs`)
    pub last_caller: Cell<(usize, usize)>,
    /// This thread's kernel id, once asked (0: not yet): the live map's
    /// shard locks name their holder by it (`state/tracker/`).
    pub tid: Cell<u32>,
    /// This thread's change to the live maps, as far as it got: what a
    /// report takes over should the thread never run again
    /// (`cudaleak_core::record::live_map`, case 1).
    pub flight: Flight,
}

impl ThreadState {
    /// This thread as the live maps know it: its id and its flight.
    #[inline]
    pub fn caller(&self) -> Caller<'_> {
        let tid = match self.tid.get() {
            0 => {
                let t = cudaleak_core::base::tid_lock::gettid();
                self.tid.set(t);
                t
            }
            t => t,
        };
        Caller {
            tid,
            flight: &self.flight,
        }
    }

    /// The child of `fork`: its one thread has another id, and none of
    /// the parent's changes under way.
    pub fn reset_in_child(&self) {
        self.tid.set(0);
        self.flight.reset();
    }
}

/// A thread's state before its first hook: every field zero, so that the
/// initial-exec block can live in `.tbss` (zero-filled for each thread).
#[cfg(any(test, not(all(target_arch = "x86_64", target_os = "linux"))))]
const fn initial() -> ThreadState {
    ThreadState {
        in_driver_hook: Cell::new(false),
        driver_hook_frame: Cell::new(0),
        runtime_call: Cell::new(std::ptr::null()),
        last_context: Cell::new((0, 0)),
        stack_bounds: Cell::new((0, 0)),
        last_trace: Cell::new((0, 0, 0)),
        last_generations: Cell::new((0, 0)),
        buffers: Cell::new(std::ptr::null_mut()),
        capturing: Cell::new(false),
        last_caller: Cell::new((0, 0)),
        tid: Cell::new(0),
        flight: Flight::new(),
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
std::arch::global_asm!(
    ".pushsection .tbss.cudaleak_thread_state,\"awT\",@nobits",
    ".p2align 6",
    ".globl cudaleak_thread_state",
    ".hidden cudaleak_thread_state",
    ".type cudaleak_thread_state,@object",
    ".size cudaleak_thread_state, {size}",
    "cudaleak_thread_state:",
    ".zero {size}",
    ".popsection",
    size = const std::mem::size_of::<ThreadState>(),
);

/// The calling thread's state. The reference must not leave the thread,
/// which is why only hooks (running on it) use it.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub fn current() -> &'static ThreadState {
    let block: *const ThreadState;
    // SAFETY: the initial-exec TLS access sequence: the thread pointer
    // (`fs:0` holds its own address on x86-64 Linux) plus the block's
    // offset, which the loader wrote into the GOT. It only reads the GOT
    // and the thread pointer, and changes the flags (`add`).
    unsafe {
        std::arch::asm!(
            "mov {block}, qword ptr fs:[0]",
            "add {block}, qword ptr [rip + cudaleak_thread_state@GOTTPOFF]",
            block = out(reg) block,
            options(pure, readonly, nostack)
        );
    }
    // SAFETY: the block is this thread's, lives as long as the thread
    // (TLS, no destructor), is aligned for `ThreadState` (64 bytes) and
    // zero-filled, which is `initial()` (all its fields are zero: cells of
    // false, 0 and null; tested), a valid `ThreadState`. The reference is
    // only used on this thread, within a hook.
    unsafe { &*block }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
thread_local! {
    static THREAD: ThreadState = const { initial() };
}

/// The calling thread's state. The reference must not leave the thread,
/// which is why only hooks (running on it) use it.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[inline]
pub fn current() -> &'static ThreadState {
    // SAFETY: a thread-local without destructor lives as long as its thread,
    // and the reference is only used on this thread, within a hook.
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}

/// A pthread key whose `destructor` runs at the exit of each thread that
/// set a non-null value, made at the first call: `slot` holds it plus one,
/// 0 before, `u32::MAX` when it cannot be made. Atomics, not a `Once`: a
/// hook may ask while another hook on this thread asks too.
pub fn exit_key(
    slot: &AtomicU32,
    destructor: unsafe extern "C" fn(*mut c_void),
) -> Option<libc::pthread_key_t> {
    match slot.load(Ordering::Acquire) {
        0 => {}
        u32::MAX => return None,
        k => return Some(k - 1),
    }
    let mut k: libc::pthread_key_t = 0;
    // SAFETY: creating a key with a plain extern "C" destructor.
    if unsafe { libc::pthread_key_create(&mut k, Some(destructor)) } != 0 {
        let _ = slot.compare_exchange(0, u32::MAX, Ordering::AcqRel, Ordering::Acquire);
        return None;
    }
    match slot.compare_exchange(0, k + 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(k),
        Err(won) => {
            // Another thread made one first: use that one.
            // SAFETY: our own, unused key.
            unsafe { libc::pthread_key_delete(k) };
            (won != u32::MAX).then(|| won - 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(t: &ThreadState) -> String {
        format!(
            "{:?} {:?}",
            (
                t.in_driver_hook.get(),
                t.driver_hook_frame.get(),
                t.runtime_call.get(),
                t.last_context.get(),
                t.stack_bounds.get(),
                t.last_trace.get(),
                t.last_generations.get(),
                t.buffers.get(),
                t.last_caller.get(),
            ),
            (t.tid.get(), t.flight.lost()),
        )
    }

    /// The initial-exec block is zero-filled: a new thread must see all
    /// zero bytes, and they must read as `initial()`.
    #[test]
    fn a_new_thread_starts_from_the_all_zero_initial_state() {
        let seen = std::thread::spawn(move || {
            let t = current();
            // SAFETY: the plain bytes of this thread's live state, which
            // no padding-carrying value was ever written over (fresh).
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    t as *const ThreadState as *const u8,
                    std::mem::size_of::<ThreadState>(),
                )
            }
            .to_vec();
            let fresh = fields(t);
            t.last_caller.set((7, 7));
            (
                bytes,
                fresh,
                current().last_caller.get(),
                t as *const ThreadState as usize,
            )
        })
        .join()
        .unwrap();
        assert!(seen.0.iter().all(|&b| b == 0), "{:?}", seen.0);
        assert_eq!(seen.1, fields(&initial()));
        assert_eq!(seen.2, (7, 7));
        assert_eq!(seen.3 % std::mem::align_of::<ThreadState>(), 0);
        // Another thread, another block.
        assert_ne!(current() as *const ThreadState as usize, seen.3);
    }
}
