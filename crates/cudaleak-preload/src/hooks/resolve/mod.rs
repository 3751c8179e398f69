//! Finding the real functions behind the hooks, on every path a program
//! can take to a CUDA function (the hooks that stand in for them are
//! handed out by `dlsym_override.rs` and the `EntryPoint` event):
//!
//! 1. direct symbol binding: the loader binds to our exports (we are
//!    preloaded); the real function of a driver hook is
//!    `dlsym(RTLD_NEXT, name)` (or libcuda's, loaded privately); that of a
//!    runtime hook is the one the *calling object's* own scope holds (an
//!    RTLD_LOCAL plugin's libcudart; see "runtime hooks" below);
//! 2. `dlsym(handle, name)` on a dlopen'ed libcuda/libcudart (JAX/XLA, and
//!    every runtime: it dlopens libcuda.so.1 with RTLD_LOCAL, so RTLD_NEXT
//!    from here cannot see it). Our `dlsym` override looks the name up for
//!    the caller and returns the hook; the real address is remembered here
//!    ([`global::offer`], [`scope::adopt_for_caller`]);
//! 3. `cuGetProcAddress*` / `cudaGetDriverEntryPoint*`: the `EntryPoint`
//!    event (`events/lookups.rs`) maps the requested name and version to a hook
//!    ([`entry_points::substitute_entry_point`]).
//!
//! Rules, each from a bug other interposers hit:
//! - A hook never records itself as its own real function (that would
//!   recurse forever when a lookup returns the hook, e.g. a second
//!   `cuGetProcAddress` through our own hook): an address inside
//!   libcudaleak.so is never a real function (`loader::is_own_address`).
//! - Objects go: our `dlclose` (`dlsym_override.rs`) has every cached
//!   pointer into an object it unloaded forgotten ([`scope::forget_unloaded`]),
//!   so no later call jumps into unmapped memory.
//!
//! Three parts, bottom up:
//!
//! 1. one real function per name, found globally: `global`
//! 2. the real function of each caller's own scope: `scope`
//! 3. entry points handed out as hooks: `entry_points`

pub mod entry_points;
pub mod global;
pub mod scope;
