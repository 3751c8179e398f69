//! The interpreter's frame model as a type: the walk, its replay and the
//! frame reads are compiled once per model (monomorphised), and each
//! carries only its own model's tests, decided at compile time.

use crate::capture::python_layouts::{FrameModel, PyLayout, PY311, PY312};

/// A [`FrameModel`] as a type parameter (a const generic of an enum is
/// not stable Rust). Its constants are known at compile time: a test on
/// them costs a walk nothing, and the code for other models is left out.
pub(super) trait FrameModelType {
    const MODEL: FrameModel;
    /// The one layout of this model, where it has one (3.11 and 3.12:
    /// their tables; `probe` turns capture off for any other): its offsets
    /// are then constants of the compiled walk ([`fixed`]), which frees
    /// the registers that held them. None: the layout is read at run time
    /// (the versions a model spans differ, or 3.13+ may take its offsets
    /// from `_Py_DebugOffsets`).
    const TABLE: Option<&'static PyLayout> = None;
    /// 3.8 to 3.10: a chain of frame objects, not interpreter frames
    const FRAME_OBJECTS: bool = matches!(Self::MODEL, FrameModel::FrameObjects);
    /// 3.11: `is_entry`, and the owner byte right after it
    const IS_311: bool = matches!(Self::MODEL, FrameModel::Interpreter311);
    /// 3.12 and later: C calls into Python push a shim frame
    const SINCE_312: bool = matches!(
        Self::MODEL,
        FrameModel::Interpreter312 | FrameModel::Interpreter313 | FrameModel::Interpreter314
    );
    /// 3.13 and later: a frame's executable may be other than a code object
    const SINCE_313: bool = matches!(
        Self::MODEL,
        FrameModel::Interpreter313 | FrameModel::Interpreter314
    );
    /// 3.14 and later: the executable is a tagged stack reference
    const SINCE_314: bool = matches!(Self::MODEL, FrameModel::Interpreter314);
    /// 3.11 and 3.12: every frame of the chain executes a code object, and
    /// its instruction word (`prev_instr`) points into that object's own
    /// memory, the bytecode it keeps inline (`co_code_adaptive`; a frame
    /// not started yet points one unit before it, still inside the
    /// object, and a C entry's shim frame runs the interpreter's
    /// trampoline code object). Two live code objects do not overlap, so
    /// a frame whose instruction word is the one logged runs the code
    /// object logged, or a later one over a freed one's memory, which
    /// the log's guards tell apart ([`guard`](super::code::guard)):
    /// replay compares the instruction word alone. Not on 3.13 and
    /// later, whose executable may be another object (an entry frame's
    /// is `None`, its instruction a static trampoline), nor for frame
    /// objects, whose instruction is an index (`f_lasti`).
    const INSTR_NAMES_CODE: bool = matches!(
        Self::MODEL,
        FrameModel::Interpreter311 | FrameModel::Interpreter312
    );
}

/// [`FrameModel::FrameObjects`] as a type.
pub(super) struct FrameObjects;
/// [`FrameModel::Interpreter311`] as a type.
pub(super) struct Interpreter311;
/// [`FrameModel::Interpreter312`] as a type.
pub(super) struct Interpreter312;
/// [`FrameModel::Interpreter313`] as a type.
pub(super) struct Interpreter313;
/// [`FrameModel::Interpreter314`] as a type.
pub(super) struct Interpreter314;

impl FrameModelType for FrameObjects {
    const MODEL: FrameModel = FrameModel::FrameObjects;
}
impl FrameModelType for Interpreter311 {
    const MODEL: FrameModel = FrameModel::Interpreter311;
    const TABLE: Option<&'static PyLayout> = Some(&PY311);
}
impl FrameModelType for Interpreter312 {
    const MODEL: FrameModel = FrameModel::Interpreter312;
    const TABLE: Option<&'static PyLayout> = Some(&PY312);
}
impl FrameModelType for Interpreter313 {
    const MODEL: FrameModel = FrameModel::Interpreter313;
}
impl FrameModelType for Interpreter314 {
    const MODEL: FrameModel = FrameModel::Interpreter314;
}

/// The layout a walk of model `M` reads with: `M`'s table where it has
/// one (equal to `l`: `probe` checked it), a constant; `l` otherwise.
#[inline(always)]
pub(super) fn fixed<M: FrameModelType>(l: &PyLayout) -> &PyLayout {
    match M::TABLE {
        Some(table) => table,
        None => l,
    }
}
