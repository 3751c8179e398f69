//! The first capture's probe: find the interpreter, check its build, and
//! choose the layout (and so the frame model) to read it with.

use super::interpreter::{
    set_status, sym, turn_off, version, ACTIVE, CAPTURE, CODE_TYPE, FINALIZING_WORD, GET_THIS_THREAD_STATE,
    GET_UNCHECKED, IS_FINALIZING, LAYOUT, PROBING, STATE, UNPROBED,
};
use super::model::{
    FrameModelType, FrameObjects, Interpreter311, Interpreter312, Interpreter313, Interpreter314,
};
use super::walk::{capture_active, CaptureFn};
use crate::capture::python_debug_offsets;
use crate::capture::python_layouts::{layout_for, FrameModel, PyLayout};
use std::sync::atomic::Ordering;

/// First capture: find the interpreter and decide whether to read it.
#[cold]
pub(super) fn probe() -> bool {
    if STATE
        .compare_exchange(UNPROBED, PROBING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return STATE.load(Ordering::Acquire) == ACTIVE;
    }
    let get_this = sym(c"PyGILState_GetThisThreadState");
    let Some((major, minor)) = version().filter(|_| get_this != 0) else {
        turn_off("no Python interpreter in this process".into(), false);
        return false;
    };
    // Py_REF_DEBUG (implied by Py_DEBUG) builds export these.
    if sym(c"_Py_RefTotal") != 0 || sym(c"_Py_NegativeRefcount") != 0 {
        turn_off(format!("Python {major}.{minor} is a debug build"), true);
        return false;
    }
    // Free-threaded builds (3.13t) have another object layout; only they
    // define the biased-refcount merge function.
    if sym(c"_Py_MergeZeroLocalRefcount") != 0 {
        turn_off(format!("Python {major}.{minor} is a free-threaded build"), true);
        return false;
    }
    let Some((layout, how)) = choose_layout(major, minor) else {
        return false;
    };
    if !layout_is_models_table(layout) {
        turn_off(
            format!("Python {major}.{minor}: its layout is not its frame model's table"),
            true,
        );
        return false;
    }
    let unchecked = if !layout.attached_is_thread_local {
        0
    } else if minor >= 13 {
        sym(c"PyThreadState_GetUnchecked")
    } else {
        sym(c"_PyThreadState_UncheckedGet")
    };
    let finalizing = if minor >= 13 {
        sym(c"Py_IsFinalizing")
    } else {
        sym(c"_Py_IsFinalizing")
    };
    let code_type = sym(c"PyCode_Type");
    if code_type == 0 {
        turn_off(format!("Python {major}.{minor}: PyCode_Type not found"), true);
        return false;
    }
    GET_THIS_THREAD_STATE.store(get_this, Ordering::Release);
    GET_UNCHECKED.store(unchecked, Ordering::Release);
    IS_FINALIZING.store(finalizing, Ordering::Release);
    // SAFETY: both addresses are what dlsym found in this process (or 0).
    let word = unsafe { super::finalizing::flag_of_getter(finalizing, sym(c"_PyRuntime")) };
    FINALIZING_WORD.store(word.unwrap_or(0), Ordering::Release);
    CODE_TYPE.store(code_type, Ordering::Release);
    let capture: CaptureFn = match layout.frames {
        FrameModel::FrameObjects => capture_active::<FrameObjects>,
        FrameModel::Interpreter311 => capture_active::<Interpreter311>,
        FrameModel::Interpreter312 => capture_active::<Interpreter312>,
        FrameModel::Interpreter313 => capture_active::<Interpreter313>,
        FrameModel::Interpreter314 => capture_active::<Interpreter314>,
    };
    CAPTURE.store(capture as usize, Ordering::Release);
    LAYOUT.store(layout as *const PyLayout as *mut PyLayout, Ordering::Release);
    set_status(format!("CPython {major}.{minor}{how}"));
    STATE.store(ACTIVE, Ordering::Release);
    true
}

/// Whether `layout` is its frame model's one layout, where the model has
/// one ([`FrameModelType::TABLE`]): the walk then reads that table's
/// offsets as constants, not `layout`'s.
fn layout_is_models_table(layout: &PyLayout) -> bool {
    let table = match layout.frames {
        FrameModel::FrameObjects => FrameObjects::TABLE,
        FrameModel::Interpreter311 => Interpreter311::TABLE,
        FrameModel::Interpreter312 => Interpreter312::TABLE,
        FrameModel::Interpreter313 => Interpreter313::TABLE,
        FrameModel::Interpreter314 => Interpreter314::TABLE,
    };
    table.is_none_or(|t| t == layout)
}

/// The frame model for the running interpreter, and how it was found (for
/// the status), or None after turning capture off with a notice.
///
/// 3.8-3.12 (and 3.13 by default): the version's table, which on 3.13 must
/// agree with the interpreter's `_Py_DebugOffsets`. 3.14 and later (and
/// 3.13 with CUDALEAK_PYTHON_OFFSETS=1): a model built from
/// `_Py_DebugOffsets` itself, the layout that out-of-process debuggers of
/// those versions rely on (`python_debug_offsets::layout_from_debug_offsets`).
fn choose_layout(major: u32, minor: u32) -> Option<(&'static PyLayout, &'static str)> {
    let runtime = sym(c"_PyRuntime");
    let has_offsets = major == 3 && minor >= 13;
    match layout_for(major, minor) {
        Some(table) if !(has_offsets && crate::base::settings::config().python_offsets) => {
            // SAFETY: `runtime` is what dlsym found for `_PyRuntime` in
            // this process (the interpreter's own), or 0.
            if let Err(why) = unsafe { python_debug_offsets::check_against_runtime(table, runtime) } {
                turn_off(format!("Python {major}.{minor}: {why}"), true);
                return None;
            }
            Some((table, ""))
        }
        _ if has_offsets => {
            // SAFETY: `_PyRuntime` of this interpreter, or 0.
            match unsafe { python_debug_offsets::layout_from_runtime(runtime, major, minor) } {
                // Leaked once per process, like the tables are static.
                Ok(l) => Some((
                    Box::leak(Box::new(l)),
                    if minor > python_debug_offsets::NEWEST_KNOWN_MINOR {
                        " (frame layout from _Py_DebugOffsets; newer than the newest known, 3.14)"
                    } else {
                        " (frame layout from _Py_DebugOffsets)"
                    },
                )),
                Err(why) => {
                    turn_off(format!("Python {major}.{minor}: {why}"), true);
                    None
                }
            }
        }
        _ => {
            turn_off(
                format!("Python {major}.{minor} is not supported (3.8 and later are)"),
                true,
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::python_layouts::{layout_for, PY311, PY312};

    /// Every version's table may be read with its model's constants, and
    /// a layout of a model with a table of its own that differs from it
    /// turns capture off rather than be read with the table's offsets.
    #[test]
    fn a_models_constant_offsets_are_its_versions_table() {
        for minor in 8..=13 {
            let l = layout_for(3, minor).unwrap_or_else(|| panic!("3.{minor}"));
            assert!(layout_is_models_table(l), "3.{minor}");
        }
        let moved = PyLayout {
            frame_back: PY311.frame_back + 8,
            ..PY311
        };
        assert!(!layout_is_models_table(&moved));
        let other = PyLayout {
            tstate_frame: PY312.tstate_frame + 8,
            ..PY312
        };
        assert!(!layout_is_models_table(&other));
    }
}
