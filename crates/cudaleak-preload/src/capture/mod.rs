//! Stack capture. Bottom up:
//!
//! 1. CPython's structure offsets, per version: `python_layouts`
//! 2. the offsets CPython 3.13+ gives of itself: `python_debug_offsets`
//! 3. when a capture looks through a thread's other replay logs: `looks`
//! 4. native frames, Python frames: `unwind`, `python`
//!
//! This file: what a hook records about the call stack: raw return
//! addresses (our own frames dropped) and raw Python frames. Names and lines come at dump time.
//!
//! The capture owns the thread's large buffers ([`ThreadBuffers`]):
//! allocated at a thread's first capture, reached through the one pointer
//! `ThreadState::buffers`, freed by a pthread key destructor when the
//! thread exits (programs that make many threads do not leak). Their parts
//! belong to the modules that use them: the unwinder's and the Python
//! walk's replay logs are theirs, handed to them for each capture.

pub mod looks;
pub mod python;
pub mod python_debug_offsets;
pub mod python_layouts;
pub mod unwind;

use crate::base::thread::ThreadState;
use crate::capture::python::PyReplayLogs;
use crate::capture::unwind::{EvalStop, ReplayLog, LOGS};
use cudaleak_core::config::MAX_STACK_DEPTH;
use cudaleak_core::record::depot::{Depot, TraceKey};
use cudaleak_core::record::python::PyRawFrame;
use cudaleak_core::record::{Api, MemoryKind, TraceId};
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Python frames recorded per allocation.
pub const PY_MAX: usize = 64;
/// Captured stacks a thread holds at once: a driver hook's, and those of
/// the hooks a signal handler calls while it runs, with room to spare.
/// Captures take them in turn.
const STACK_SLOTS: usize = 4;

/// One captured stack's frames; only the first `n_*` entries (kept in
/// `capture::Stack`) are ever read, so they are never zeroed.
pub struct StackBuffer {
    pub native: [MaybeUninit<u64>; MAX_STACK_DEPTH],
    pub python: [MaybeUninit<PyRawFrame>; PY_MAX],
    /// the Python walk's generation whose frames `python` holds; 0: none
    /// (a new trace of a replay of them copies nothing from the log:
    /// `Stack::take_python_frames`)
    pub python_generation: u64,
}

/// A thread's large buffers, allocated on the heap zeroed (the replay
/// logs' empty state is all zero bits), never built on the (small) stack.
pub struct ThreadBuffers {
    /// What the last stack walks read (`unwind/`, replay).
    pub replay: ReplayLog,
    /// The trace last interned from each pair of replay logs' frames
    /// ([`Stack::intern_by_log`]), by the sum of the logs' slots.
    traces: [TraceMemo; LOGS],
    /// What the last Python frame walks saw (`python/`, replay).
    pub python_replay: PyReplayLogs,
    stacks: [StackBuffer; STACK_SLOTS],
    next_stack: usize,
}

impl ThreadBuffers {
    /// The next stack buffer of `this`, in turn.
    ///
    /// # Safety
    /// `this` is the calling thread's buffers ([`buffers`]).
    /// Only the fields used are reached (no `&mut ThreadBuffers`): a
    /// capture holds references into other fields meanwhile.
    pub unsafe fn next_stack(this: *mut ThreadBuffers) -> *mut StackBuffer {
        // SAFETY: `this` is the calling thread's live buffers (contract);
        // only the `next_stack` field is borrowed, which no capture holds a
        // reference into, and no other thread reaches these buffers.
        let next = unsafe { &mut *std::ptr::addr_of_mut!((*this).next_stack) };
        let i = *next % STACK_SLOTS;
        *next = i + 1;
        // SAFETY: a place projection inside the same live allocation
        // (`i < STACK_SLOTS`); no reference is made, only its address.
        unsafe { std::ptr::addr_of_mut!((*this).stacks[i]) }
    }
}

/// A trace interned from frames of these generations, for a block of this
/// API and kind; id 0: none.
#[derive(Clone, Copy)]
struct TraceMemo {
    generations: (u64, u64),
    id: u32,
    api: u8,
    kind: u8,
}

/// `ThreadState::buffers` once the thread's key destructor freed them: a
/// later hook on the exiting thread captures nothing rather than allocate
/// again.
const GONE: *mut c_void = std::ptr::dangling_mut();

/// The pthread key whose destructor frees a thread's buffers, plus one;
/// 0 until created, u32::MAX when it cannot be.
static KEY: AtomicU32 = AtomicU32::new(0);

extern "C" fn free_buffers(p: *mut libc::c_void) {
    if p.is_null() {
        return;
    }
    crate::base::thread::current().buffers.set(GONE);
    // SAFETY: allocated in `buffers` with this layout; no capture is
    // running on this exiting thread.
    unsafe { std::alloc::dealloc(p.cast(), std::alloc::Layout::new::<ThreadBuffers>()) };
}

fn key() -> Option<libc::pthread_key_t> {
    crate::base::thread::exit_key(&KEY, free_buffers)
}

/// This thread's buffers, allocated on first use; None when they cannot
/// be had (out of memory, or the thread is exiting). A raw pointer, not
/// `&mut`: a capture holds a reference into one field (a stack buffer)
/// while the unwinder and the Python walk reach others (their replay
/// logs); two live `&mut ThreadBuffers` over them would be undefined
/// behaviour. Fields are reached with `addr_of_mut!`.
#[inline]
pub fn buffers(thread: &ThreadState) -> Option<*mut ThreadBuffers> {
    let p = thread.buffers.get().cast::<ThreadBuffers>();
    if !p.is_null() && p != GONE.cast() {
        return Some(p);
    }
    if p == GONE.cast() {
        return None;
    }
    new_buffers(thread)
}

#[cold]
fn new_buffers(thread: &ThreadState) -> Option<*mut ThreadBuffers> {
    let key = key()?;
    // SAFETY: a plain allocation; every field's empty state is all zero
    // bits (below).
    let p = unsafe { std::alloc::alloc_zeroed(std::alloc::Layout::new::<ThreadBuffers>()) }
        .cast::<ThreadBuffers>();
    if p.is_null() {
        return None;
    }
    // The replay logs (the native ones 360 KiB, the Python ones 164 KiB)
    // and the trace memos are empty as zeroed (tests check it): not
    // written here, so fresh pages from the allocator are touched only as
    // a thread's walks fill them.
    // SAFETY: registering the buffers for the key's destructor.
    if unsafe { libc::pthread_setspecific(key, p.cast()) } != 0 {
        // SAFETY: just allocated with this layout.
        unsafe { std::alloc::dealloc(p.cast(), std::alloc::Layout::new::<ThreadBuffers>()) };
        return None;
    }
    thread.buffers.set(p.cast());
    Some(p)
}

/// Stack a capture may need below the hook (unwinder, Python walk, a new
/// trace's interning); with less left, the capture is skipped and the block
/// recorded without a stack, rather than overflow a small thread stack
/// (16 KiB thread stacks crashed).
const CAPTURE_STACK_NEEDED: usize = 16 << 10;

/// Captures skipped because a signal handler's hook interrupted a capture
/// on the same thread (the report's `totals.stacks_skipped_nested`).
pub static NESTED_CAPTURES: AtomicU64 = AtomicU64::new(0);

/// A captured stack. It lives in the hook's frame, so it is small: the
/// frames are in one of the thread's stack buffers ([`ThreadBuffers`]),
/// taken in turn, so that a hook's stack is still there when a signal
/// handler that interrupted it calls a hook that captures its own.
pub struct Stack {
    /// null when nothing was captured
    buffer: *mut StackBuffer,
    n_native: usize,
    n_python: usize,
    /// null: the Python frames are in `buffer`; otherwise they are in this
    /// log of the thread's, which a replay repeated, until
    /// a new trace needs them ([`Self::intern`], `python::take_frames`)
    python_log: *const python::PyReplayLog,
    /// the Python frames' generation (0: none)
    python_generation: u64,
    /// (native, Python) generations of the thread's replay logs that the
    /// frames are (`unwind::capture`, `python::capture`): equal
    /// generations, equal frames. None: not comparable (no capture, or
    /// the reference unwinder).
    generations: Option<(u64, u64)>,
}

impl Stack {
    /// The stack of a hook that captures nothing: a signal handler's hook
    /// that interrupted another hook's capture on its thread
    /// (`HookCx::trace`), counted in the report's
    /// `totals.stacks_skipped_nested`.
    pub fn skipped(slot: &mut MaybeUninit<Stack>) -> &Stack {
        NESTED_CAPTURES.fetch_add(1, Ordering::Relaxed);
        slot.write(Self::NONE)
    }

    const NONE: Stack = Stack {
        buffer: std::ptr::null_mut(),
        n_native: 0,
        n_python: 0,
        python_log: std::ptr::null(),
        python_generation: 0,
        generations: None,
    };

    /// Captures the calling thread's native and Python stacks into `slot`.
    /// The caller holds the thread's capture flag (`ThreadState::capturing`,
    /// set by `HookCx::trace` until the stack is interned): no other
    /// capture runs on the thread meanwhile, and the replay logs are this
    /// one's.
    #[inline(never)]
    pub fn capture_into<'a>(slot: &'a mut MaybeUninit<Stack>, thread: &ThreadState) -> &'a Stack {
        let bounds = unwind::stack_bounds(slot as *const _ as usize, thread);
        let stack = match room_to_capture(slot as *const _ as usize, bounds)
            .then(|| buffers(thread))
            .flatten()
        {
            Some(buffers) => Self::capture(
                buffers,
                // SAFETY: this thread's buffers, just had; no other capture
                // is running on this thread (the caller holds the capture
                // flag).
                unsafe { ThreadBuffers::next_stack(buffers) },
                bounds.map(|(_, top)| top),
            ),
            None => Self::NONE,
        };
        slot.write(stack)
    }

    /// Captures into `buffer`, one of the stack buffers of `buffers` (the
    /// calling thread's). Python frames first: with them, the native walk
    /// stops at the outermost eval-loop frame that runs them
    /// ([`EvalStop`]).
    /// `stack_top`: the top of the thread's stack that `capture_into`
    /// runs on (None: not the thread's own stack).
    #[inline(always)]
    fn capture(buffers: *mut ThreadBuffers, buffer: *mut StackBuffer, stack_top: Option<usize>) -> Stack {
        // SAFETY: the thread's own buffer, not in use by a live capture (see
        // `Stack`); its arrays are MaybeUninit. One field at a time (the
        // replay logs are other fields of the same allocation), and
        // captures do not nest on a thread.
        let py = unsafe {
            python::capture(
                &mut (*buffer).python,
                &mut *std::ptr::addr_of_mut!((*buffers).python_replay),
                &mut (*buffer).python_generation,
            )
        };
        let (n_python, python_generation) = (py.n, py.generation);
        let depth = crate::base::settings::config().stack_depth.min(MAX_STACK_DEPTH);
        let (n_native, native_generation) = if depth > 0 {
            let stop = if n_python > 0 {
                // SAFETY: the thread's own buffers; a shared borrow of the
                // one field `python_replay` alone, which no live reference
                // (the Python capture's ended) points into.
                eval_stop(unsafe { (*std::ptr::addr_of!((*buffers).python_replay)).eval_groups() })
            } else {
                EvalStop::default()
            };
            // SAFETY: the thread's own buffer, not in use by a live capture
            // (see `Stack`), its arrays MaybeUninit. `native` and `replay`
            // are borrowed one field at a time, and no other live reference
            // points into either (the Python capture's have ended); captures
            // do not nest on a thread.
            unsafe {
                unwind::capture(
                    &mut (&mut (*buffer).native)[..depth],
                    stack_top,
                    &mut *std::ptr::addr_of_mut!((*buffers).replay),
                    stop,
                )
            }
        } else {
            // No native frames: always the same (none).
            (0, Some(0))
        };
        Stack {
            buffer,
            n_native,
            n_python,
            python_log: py.log,
            python_generation,
            generations: native_generation.map(|g| (g, python_generation)),
        }
    }

    pub fn native(&self) -> &[u64] {
        if self.buffer.is_null() {
            return &[];
        }
        // SAFETY: the first n_native entries were written by the unwinder.
        unsafe { std::slice::from_raw_parts((*self.buffer).native.as_ptr().cast::<u64>(), self.n_native) }
    }

    /// The Python frames in the stack buffer: all of them, unless a
    /// replay left them in its log (`python_log`; see `intern_new`).
    #[inline(always)]
    fn python_in_buffer(&self) -> &[PyRawFrame] {
        if self.buffer.is_null() {
            return &[];
        }
        // SAFETY: the first n_python entries were written by the reader,
        // or copied from the log by `take_python_frames`.
        unsafe {
            std::slice::from_raw_parts((*self.buffer).python.as_ptr().cast::<PyRawFrame>(), self.n_python)
        }
    }

    /// Copies the Python frames a replay left in its log into the stack
    /// buffer, unless it holds them already; false when they are gone.
    #[inline(always)]
    fn take_python_frames(&self) -> bool {
        // SAFETY: the stack buffer this capture took (not null: a log is
        // set only with frames), of the calling thread (a Stack does not
        // leave its hook); only its Python fields are reached.
        let (frames, held) = unsafe {
            (
                &mut *std::ptr::addr_of_mut!((*self.buffer).python),
                &mut *std::ptr::addr_of_mut!((*self.buffer).python_generation),
            )
        };
        if *held == self.python_generation {
            return true;
        }
        // SAFETY: `python_log` is the thread's log that this capture
        // replayed, and `n_python` its count (`capture`).
        if !unsafe { python::take_frames(self.python_log, self.python_generation, self.n_python, frames) } {
            *held = 0;
            return false;
        }
        *held = self.python_generation;
        true
    }

    /// The trace id of this stack in `depot` for a block of `api` and
    /// `kind`. When the native and Python frames are the same generations
    /// of the thread's replay logs as a trace interned here before from
    /// the same native log, and API and kind are the same, that trace's
    /// id is reused without hashing. Comparing generations replaced a
    /// copy and a memcmp of the Python frames (158 instructions of a
    /// Python pair), and unlike "the native frames were replayed" it
    /// cannot mistake a capture never interned (a failed call) for an
    /// earlier trace.
    pub fn intern(&self, depot: &Depot, api: Api, kind: MemoryKind, thread: &ThreadState) -> TraceId {
        let (last_id, last_api, last_kind) = thread.last_trace.get();
        if let Some(generations) = self.generations {
            if last_id != 0
                && (last_api, last_kind) == (api as u8, kind as u8)
                && thread.last_generations.get() == generations
            {
                return TraceId(last_id);
            }
        }
        let id = self.intern_by_log(depot, api, kind, thread);
        match self.generations {
            Some(generations) => {
                thread.last_generations.set(generations);
                thread.last_trace.set((id.0, api as u8, kind as u8));
            }
            None => thread.last_trace.set((0, 0, 0)),
        }
        id
    }

    /// [`Self::intern`] when the frames are not the last trace's: the
    /// trace last interned from the same native log may be (a thread
    /// that allocates from several call paths in turn).
    #[inline(never)]
    fn intern_by_log(&self, depot: &Depot, api: Api, kind: MemoryKind, thread: &ThreadState) -> TraceId {
        let buffers = thread.buffers.get().cast::<ThreadBuffers>();
        let Some(generations) = self.generations else {
            return self.intern_new(depot, api, kind);
        };
        if buffers.is_null() || buffers == GONE.cast() {
            return self.intern_new(depot, api, kind);
        }
        // Each generation's low bits are its log's slot: a thread whose
        // Python frames change under the same native frames (a Python
        // program's ops) keeps a trace per Python log, and one whose
        // native frames change under no Python frames one per native log.
        let at = generations.0.wrapping_add(generations.1) as usize % LOGS;
        // SAFETY: the calling thread's live buffers (not freed: not GONE);
        // only the memo is reached, which no live reference points into.
        let memo = unsafe { &mut *std::ptr::addr_of_mut!((*buffers).traces[at]) };
        if memo.id != 0 && memo.generations == generations && (memo.api, memo.kind) == (api as u8, kind as u8)
        {
            return TraceId(memo.id);
        }
        let id = self.intern_new(depot, api, kind);
        *memo = TraceMemo {
            generations,
            id: id.0,
            api: api as u8,
            kind: kind as u8,
        };
        id
    }

    /// Out of line: a new trace is the rare case, and inlined here it made
    /// the common one (a replayed stack) save more registers.
    #[inline(never)]
    fn intern_new(&self, depot: &Depot, api: Api, kind: MemoryKind) -> TraceId {
        if !self.python_log.is_null() {
            return self.intern_new_from_log(depot, api, kind);
        }
        self.intern_frames(depot, api, kind, self.python_in_buffer())
    }

    /// [`Self::intern_new`] of a stack whose Python frames a replay left
    /// in its log: they are copied into the stack buffer first. Were they
    /// gone from the log (walked over by a signal handler's hook on this
    /// thread, which the capture flag held until the stack is interned
    /// rules out: `HookCx::trace`), the trace has the native frames alone, counted in
    /// `totals.stacks_skipped_nested`. Apart, so that the common case
    /// saves no registers for it.
    #[cold]
    #[inline(never)]
    fn intern_new_from_log(&self, depot: &Depot, api: Api, kind: MemoryKind) -> TraceId {
        let python = if self.take_python_frames() {
            self.python_in_buffer()
        } else {
            NESTED_CAPTURES.fetch_add(1, Ordering::Relaxed);
            &[]
        };
        self.intern_frames(depot, api, kind, python)
    }

    #[inline(always)]
    fn intern_frames(&self, depot: &Depot, api: Api, kind: MemoryKind, python: &[PyRawFrame]) -> TraceId {
        let key = TraceKey {
            api,
            kind,
            native: self.native(),
            python,
        };
        depot.intern(&key, |k| python::remember_code_objects(k.python))
    }
}

/// Where the native walk of a stack with these Python frames stops: after
/// as many eval-loop frames as the frames have eval-loop invocations (the
/// report puts each invocation's Python frames in the place of its
/// eval-loop frame; `merge_stacks`), so the frames below the outermost
/// one, the interpreter's start-up, are not walked on every capture (most
/// of a Python stack's native frames, the same every time). No stop when the eval loop is not known. `invocations`: the
/// captured Python frames' eval-loop invocations, as the Python walk's log
/// keeps them (a replay counts nothing).
#[inline]
fn eval_stop(invocations: usize) -> EvalStop {
    let Some((lo, hi)) = eval_loop() else {
        return EvalStop::default();
    };
    EvalStop {
        lo,
        hi,
        after: invocations as u32,
    }
}

/// `_PyEval_EvalFrameDefault`'s address range: 0 unknown, 1 being found or
/// not found, 2 found (EVAL_LO..EVAL_HI). Found once, at the first capture
/// with Python frames (the interpreter is loaded by then).
static EVAL_STATE: AtomicU8 = AtomicU8::new(0);
static EVAL_LO: AtomicUsize = AtomicUsize::new(0);
static EVAL_HI: AtomicUsize = AtomicUsize::new(0);

#[inline]
fn eval_loop() -> Option<(usize, usize)> {
    match EVAL_STATE.load(Ordering::Acquire) {
        2 => Some((EVAL_LO.load(Ordering::Relaxed), EVAL_HI.load(Ordering::Relaxed))),
        1 => None,
        _ => find_eval_loop(),
    }
}

#[cold]
fn find_eval_loop() -> Option<(usize, usize)> {
    if EVAL_STATE
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    let f = crate::base::loader::real_dlsym(libc::RTLD_DEFAULT, c"_PyEval_EvalFrameDefault") as usize;
    if f == 0 {
        return None;
    }
    // SAFETY: zeroed Dl_info is a valid out parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *const libc::Elf64_Sym = std::ptr::null();
    // SAFETY: dladdr1 only reads loader state; both out pointers are valid.
    let ok = unsafe {
        libc::dladdr1(
            f as *const libc::c_void,
            &mut info,
            &mut sym as *mut *const libc::Elf64_Sym as *mut *mut libc::c_void,
            RTLD_DL_SYMENT,
        )
    };
    if ok == 0 || sym.is_null() || info.dli_saddr as usize != f {
        return None;
    }
    // SAFETY: the loader's symbol table entry for `f`, mapped while the
    // interpreter is loaded.
    let size = unsafe { (*sym).st_size } as usize;
    if size == 0 {
        return None;
    }
    EVAL_LO.store(f, Ordering::Relaxed);
    EVAL_HI.store(f + size, Ordering::Relaxed);
    EVAL_STATE.store(2, Ordering::Release);
    Some((f, f + size))
}

/// glibc's `dladdr1` flag for the symbol table entry (dlfcn.h).
const RTLD_DL_SYMENT: libc::c_int = 1;

/// Whether the stack below `sp`, in a thread stack of `bounds` (None:
/// not the thread's own stack), has room for a capture.
fn room_to_capture(sp: usize, bounds: Option<(usize, usize)>) -> bool {
    match bounds {
        Some((low, _)) => sp - low >= CAPTURE_STACK_NEEDED,
        // Not on the thread's own stack (a coroutine, sigaltstack): no
        // bounds to check against, as before.
        None => true,
    }
}
