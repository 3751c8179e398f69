//! The driver's free and total memory of the devices a watched process
//! uses, read by the viewer through NVML (`libnvidia-ml.so.1`, the library
//! `nvidia-smi` reads), so that the program under the library is never
//! asked: querying memory there would need a CUDA context on the library's
//! thread. NVML numbers devices as the machine does, CUDA as the process
//! sees them: the process's `CUDA_VISIBLE_DEVICES` maps one to the other.

use crate::cli::dump::environ_var;
use cudaleak_core::live_view::LiveView;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// One device's memory as the driver counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free: u64,
    pub total: u64,
}

#[repr(C)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

type Init = unsafe extern "C" fn() -> c_int;
type ByIndex = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type MemoryInfo = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_int;

/// NVML, loaded and initialized.
pub struct Nvml {
    by_index: ByIndex,
    by_uuid: ByUuid,
    memory: MemoryInfo,
}

/// A symbol of `handle`, as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the symbol's true function type.
unsafe fn symbol<T: Copy>(handle: *mut c_void, name: &CStr) -> Option<T> {
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    // SAFETY: the caller's contract: T is a function pointer of the
    // symbol's type, the size of a pointer.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Nvml {
    /// NVML, or why not (no NVIDIA driver here: the simulated one has none).
    pub fn load() -> Result<Nvml, String> {
        // SAFETY: a NUL-terminated name; the library stays loaded for the
        // viewer's life (never closed: its functions are kept).
        let handle =
            unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err("no NVML: libnvidia-ml.so.1 not found".into());
        }
        // SAFETY: the types are NVML's own declarations (nvml.h).
        let (init, by_index, by_uuid, memory) = unsafe {
            (
                symbol::<Init>(handle, c"nvmlInit_v2"),
                symbol::<ByIndex>(handle, c"nvmlDeviceGetHandleByIndex_v2"),
                symbol::<ByUuid>(handle, c"nvmlDeviceGetHandleByUUID"),
                symbol::<MemoryInfo>(handle, c"nvmlDeviceGetMemoryInfo"),
            )
        };
        let (Some(init), Some(by_index), Some(by_uuid), Some(memory)) = (init, by_index, by_uuid, memory)
        else {
            return Err("NVML lacks the functions needed".into());
        };
        // SAFETY: nvmlInit_v2 takes nothing; it may be called more than once.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(format!("NVML did not start (error {rc})"));
        }
        Ok(Nvml {
            by_index,
            by_uuid,
            memory,
        })
    }

    /// The memory of the device `visible` names: an index, or a `GPU-`
    /// UUID, as `CUDA_VISIBLE_DEVICES` gives them.
    pub fn memory(&self, visible: &str) -> Option<DeviceMemory> {
        let mut dev: *mut c_void = std::ptr::null_mut();
        let rc = if let Ok(i) = visible.parse::<c_uint>() {
            // SAFETY: an out pointer to a local.
            unsafe { (self.by_index)(i, &mut dev) }
        } else if visible.starts_with("GPU-") {
            let uuid = std::ffi::CString::new(visible).ok()?;
            // SAFETY: a NUL-terminated UUID and an out pointer to a local.
            unsafe { (self.by_uuid)(uuid.as_ptr(), &mut dev) }
        } else {
            // A MIG instance or an abbreviated UUID: not mapped here.
            return None;
        };
        if rc != 0 {
            return None;
        }
        let mut m = NvmlMemory {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a handle NVML gave and an out pointer to a local of
        // nvmlMemory_t's layout.
        let rc = unsafe { (self.memory)(dev, &mut m) };
        (rc == 0).then_some(DeviceMemory {
            free: m.free,
            total: m.total,
        })
    }
}

/// The driver's memory of the devices `view` of process `pid` names, by
/// CUDA ordinal, or why it is not known.
pub fn of_process(
    pid: i32,
    view: Option<&LiveView>,
    nvml: &Result<Nvml, String>,
) -> Result<Vec<(u32, DeviceMemory)>, String> {
    let nvml = nvml.as_ref().map_err(Clone::clone)?;
    let visible = environ_var(pid, "CUDA_VISIBLE_DEVICES");
    let mut out = Vec::new();
    for d in view.iter().flat_map(|v| &v.devices) {
        let Ok(ordinal) = d.device.parse::<u32>() else {
            continue;
        };
        if let Some(m) = visible_device(visible.as_deref(), ordinal).and_then(|n| nvml.memory(&n)) {
            out.push((ordinal, m));
        }
    }
    Ok(out)
}

/// The machine's name of CUDA ordinal `ordinal` in a process whose
/// `CUDA_VISIBLE_DEVICES` is `visible` (None: unset, every device in
/// order).
pub fn visible_device(visible: Option<&str>, ordinal: u32) -> Option<String> {
    match visible {
        None => Some(ordinal.to_string()),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .nth(ordinal as usize)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_ordinals_map_through_the_visible_devices() {
        assert_eq!(visible_device(None, 2).as_deref(), Some("2"));
        assert_eq!(visible_device(Some("3,1"), 0).as_deref(), Some("3"));
        assert_eq!(visible_device(Some("3, 1"), 1).as_deref(), Some("1"));
        assert_eq!(visible_device(Some("GPU-abc"), 0).as_deref(), Some("GPU-abc"));
        assert_eq!(visible_device(Some("3"), 1), None);
        assert_eq!(visible_device(Some(""), 0), None);
    }
}
