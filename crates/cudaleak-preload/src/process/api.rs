//! The in-process C API: dumps on demand and checkpoints, for test suites
//! and the Python module `cudaleak` (`python/cudaleak`).
//!
//! ```c
//! int      cudaleak_dump(const char *reason);          // 0: report written
//! uint64_t cudaleak_checkpoint(void);                  // id of a new checkpoint
//! int      cudaleak_live_since(uint64_t id, uint64_t *blocks, uint64_t *bytes);
//! char    *cudaleak_leaks_since_json(uint64_t id);     // free with cudaleak_free
//! void     cudaleak_free(char *p);
//! uint64_t cudaleak_peak_window_begin(void);           // live bytes now
//! uint64_t cudaleak_peak_window_bytes(void);           // most live since the oldest open window began
//! uint64_t cudaleak_peak_window_end(void);             // the same, and the window closes
//! uint64_t cudaleak_peak_bytes(void);                  // the process's peak so far
//! char    *cudaleak_peak_json(void);                   // the process's peak by call site
//! ```

use crate::process::dump::{self, Request};
use crate::process::lifecycle;
use crate::state::{live_bytes, tracker};
use cudaleak_core::assemble::Snapshot;
use cudaleak_core::record::MAX_EPOCH;
use cudaleak_core::report::Trigger;
use std::ffi::{c_char, c_int, CString};
use std::panic::catch_unwind;
use std::sync::atomic::Ordering;

/// Writes a report now (trigger "api"). Returns 0 when a report was
/// written, 1 when the process has made no allocation call yet (no report
/// by the contract), -1 when writing failed.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_dump(reason: *const c_char) -> c_int {
    catch_unwind(|| {
        if !tracker::saw_allocation_call() {
            return 1;
        }
        let mut r = Request::new(Trigger::Api);
        r.reason = lifecycle::c_str_arg(reason);
        match dump::dump(r) {
            Some(o) if o.path.is_some() => 0,
            _ => -1,
        }
    })
    .unwrap_or(-1)
}

/// Starts a checkpoint: blocks allocated from now on carry its id or a
/// later one. Ids start at 1.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_checkpoint() -> u64 {
    // Saturates where blocks stop telling epochs apart (MAX_EPOCH): from
    // there on a checkpoint covers everything since the last distinct one.
    let previous = tracker::EPOCH
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            Some((e + 1).min(MAX_EPOCH))
        })
        .unwrap_or(MAX_EPOCH);
    (previous + 1).min(MAX_EPOCH) as u64
}

/// Blocks and bytes still live that were allocated since checkpoint `id`.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_live_since(id: u64, blocks: *mut u64, bytes: *mut u64) -> c_int {
    catch_unwind(|| {
        // A block whose context was destroyed since is still a leak of the
        // region: counted with the live ones.
        let since = tracker::blocks_since(id.min(u32::MAX as u64) as u32);
        let mut live = since.live;
        live.extend(since.torn_down);
        // A module loaded in the region stays loaded by design: no leak.
        live.retain(|(_, b)| b.kind().is_leak());
        let total: u64 = live.iter().map(|(_, b)| b.size()).sum();
        // SAFETY: the caller's out parameters, written when non-null.
        unsafe {
            if !blocks.is_null() {
                *blocks = live.len() as u64;
            }
            if !bytes.is_null() {
                *bytes = total;
            }
        }
        0
    })
    .unwrap_or(-1)
}

/// A report (JSON, schema version 1, trigger "api") of the blocks still
/// live that were allocated since checkpoint `id`, suppressions applied.
/// Nothing is written to disk. Free the string with [`cudaleak_free`].
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_leaks_since_json(id: u64) -> *mut c_char {
    catch_unwind(|| {
        let mut since = tracker::blocks_since(id.min(u32::MAX as u64) as u32);
        since.live.retain(|(_, b)| b.kind().is_leak());
        since.torn_down.retain(|(_, b)| b.kind().is_leak());
        let snap = Snapshot {
            blocks: since.live,
            torn_down: since.torn_down,
            ..Default::default()
        };
        report_json(&snap, format!("blocks since checkpoint {id}"))
    })
    .ok()
    .flatten()
    .unwrap_or(std::ptr::null_mut())
}

/// `snap` as a report (trigger "api", `reason`) in a string for the
/// caller, or None. Not a dump (no file, no growth bookkeeping): it
/// carries the sequence number the next dump will have.
fn report_json(snap: &Snapshot, reason: String) -> Option<*mut c_char> {
    let report = dump::with_state(None, |state| {
        let mut meta_req = Request::new(Trigger::Api);
        meta_req.reason = Some(reason);
        let sequence = state.next_sequence();
        dump::assemble(state, snap, dump::meta_for(&meta_req, sequence), false)
    })?;
    let json = serde_json::to_string(&report).ok()?;
    CString::new(json).ok().map(CString::into_raw)
}

/// Opens a peak window (a test's, a block's): from now until
/// [`cudaleak_peak_window_end`], the most live bytes the process holds are
/// kept. Returns the live bytes now. Windows open at once share one mark,
/// the most since the oldest of them began.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_peak_window_begin() -> u64 {
    catch_unwind(live_bytes::window_begin).unwrap_or(0)
}

/// The most live bytes since the oldest open window began; 0 when none is
/// open.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_peak_window_bytes() -> u64 {
    catch_unwind(live_bytes::window_high_water).unwrap_or(0)
}

/// The process's peak so far, in bytes (`totals.peak_bytes` of the next
/// report): a window whose mark passed the peak read at its beginning set
/// the process's peak.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_peak_bytes() -> u64 {
    catch_unwind(live_bytes::peak).unwrap_or(0)
}

/// Closes a window opened by [`cudaleak_peak_window_begin`]; returns its
/// peak (as [`cudaleak_peak_window_bytes`] just before), 0 when none was
/// open.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_peak_window_end() -> u64 {
    catch_unwind(live_bytes::window_end).unwrap_or(0)
}

/// A report (JSON, trigger "api") of the process's peak: `peak` holds what
/// each call site held at that moment, `totals.peak_bytes` its bytes; no
/// live block is read, nothing is written to disk. For a peak window whose
/// mark is the process's peak, these are the sites at the window's peak.
/// Free the string with [`cudaleak_free`].
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_peak_json() -> *mut c_char {
    catch_unwind(|| {
        let peak = tracker::peak_now();
        let snap = Snapshot {
            peak_bytes: peak.bytes,
            peak: Some(peak),
            ..Default::default()
        };
        report_json(&snap, "the process's peak".into())
    })
    .ok()
    .flatten()
    .unwrap_or(std::ptr::null_mut())
}

/// Frees a string returned by this API.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cudaleak_free(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: only strings from CString::into_raw above reach here.
        drop(unsafe { CString::from_raw(p) });
    }
}
