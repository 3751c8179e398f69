//! CPython 3.13 and later describe their own structures: `_Py_DebugOffsets`
//! (Include/internal/pycore_debug_offsets.h), the first member of
//! `_PyRuntime`. Here its declared layout per version, and the frame model
//! built from a running interpreter's offsets, checked field by field:
//! the tables of `python_layouts.rs` are checked against it on 3.13, and
//! 3.14 and later are read with it alone.

use crate::capture::python_layouts::{FrameModel, PyLayout};
use cudaleak_core::record::linetable::LineFormat;

/// One section of `_Py_DebugOffsets`: a struct of u64 fields, named as in
/// the header, in declaration order. A section's `size` field, where it
/// has one, is the sizeof of the CPython struct it describes.
pub struct Section {
    pub name: &'static str,
    pub fields: &'static [&'static str],
}

/// The declared layout of one version's `_Py_DebugOffsets`
/// (Include/internal/pycore_debug_offsets.h; the first member of
/// `_PyRuntime`): `char cookie[8]`, `uint64_t version`, `uint64_t
/// free_threaded`, then the sections.
pub struct DebugOffsetsLayout {
    pub minor: u32,
    pub sections: &'static [Section],
    /// `f_executable` tag bits (a known layout fact, not in the offsets)
    executable_tag_mask: usize,
    frames: FrameModel,
}

const COOKIE: &[u8; 8] = b"xdebugpy";
const HEADER_BYTES: usize = 24;

const fn section(name: &'static str, fields: &'static [&'static str]) -> Section {
    Section { name, fields }
}

// Sections the same in 3.13 and 3.14.
const RUNTIME_STATE: Section = section("runtime_state", &["size", "finalizing", "interpreters_head"]);
const THREAD_STATE: Section = section(
    "thread_state",
    &[
        "size",
        "prev",
        "next",
        "interp",
        "current_frame",
        "thread_id",
        "native_thread_id",
        "datastack_chunk",
        "status",
    ],
);
const PYOBJECT: Section = section("pyobject", &["size", "ob_type"]);
const TYPE_OBJECT: Section = section("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]);
const TUPLE_OBJECT: Section = section("tuple_object", &["size", "ob_item", "ob_size"]);
const LIST_OBJECT: Section = section("list_object", &["size", "ob_item", "ob_size"]);
const DICT_OBJECT: Section = section("dict_object", &["size", "ma_keys", "ma_values"]);
const FLOAT_OBJECT: Section = section("float_object", &["size", "ob_fval"]);
const LONG_OBJECT: Section = section("long_object", &["size", "lv_tag", "ob_digit"]);
const BYTES_OBJECT: Section = section("bytes_object", &["size", "ob_size", "ob_sval"]);
const UNICODE_OBJECT: Section = section("unicode_object", &["size", "state", "length", "asciiobject_size"]);
const GC: Section = section("gc", &["size", "collecting"]);

/// v3.13.0 (Include/internal/pycore_runtime.h there; the struct moved to
/// pycore_debug_offsets.h later in the 3.13 branch, unchanged).
pub static DEBUG_OFFSETS_313: DebugOffsetsLayout = DebugOffsetsLayout {
    minor: 13,
    executable_tag_mask: 0,
    frames: FrameModel::Interpreter313,
    sections: &[
        RUNTIME_STATE,
        section(
            "interpreter_state",
            &[
                "size",
                "id",
                "next",
                "threads_head",
                "gc",
                "imports_modules",
                "sysdict",
                "builtins",
                "ceval_gil",
                "gil_runtime_state",
                "gil_runtime_state_enabled",
                "gil_runtime_state_locked",
                "gil_runtime_state_holder",
            ],
        ),
        THREAD_STATE,
        section(
            "interpreter_frame",
            &[
                "size",
                "previous",
                "executable",
                "instr_ptr",
                "localsplus",
                "owner",
            ],
        ),
        section(
            "code_object",
            &[
                "size",
                "filename",
                "name",
                "qualname",
                "linetable",
                "firstlineno",
                "argcount",
                "localsplusnames",
                "localspluskinds",
                "co_code_adaptive",
            ],
        ),
        PYOBJECT,
        TYPE_OBJECT,
        TUPLE_OBJECT,
        LIST_OBJECT,
        DICT_OBJECT,
        FLOAT_OBJECT,
        LONG_OBJECT,
        BYTES_OBJECT,
        UNICODE_OBJECT,
        GC,
    ],
};

/// v3.14.0: the interpreter state gained `threads_main`,
/// `code_object_generation` and `tlbc_generation`; frames `stackpointer`
/// and `tlbc_index`; code objects `co_tlbc`; new sections for sets,
/// generators, list nodes and the remote debugger. `f_executable` became
/// a `_PyStackRef` (Include/internal/pycore_interpframe_structs.h) whose
/// low two bits are tags (Include/internal/pycore_stackref.h, GIL build).
pub static DEBUG_OFFSETS_314: DebugOffsetsLayout = DebugOffsetsLayout {
    minor: 14,
    executable_tag_mask: 3,
    frames: FrameModel::Interpreter314,
    sections: &[
        RUNTIME_STATE,
        section(
            "interpreter_state",
            &[
                "size",
                "id",
                "next",
                "threads_head",
                "threads_main",
                "gc",
                "imports_modules",
                "sysdict",
                "builtins",
                "ceval_gil",
                "gil_runtime_state",
                "gil_runtime_state_enabled",
                "gil_runtime_state_locked",
                "gil_runtime_state_holder",
                "code_object_generation",
                "tlbc_generation",
            ],
        ),
        THREAD_STATE,
        section(
            "interpreter_frame",
            &[
                "size",
                "previous",
                "executable",
                "instr_ptr",
                "localsplus",
                "owner",
                "stackpointer",
                "tlbc_index",
            ],
        ),
        section(
            "code_object",
            &[
                "size",
                "filename",
                "name",
                "qualname",
                "linetable",
                "firstlineno",
                "argcount",
                "localsplusnames",
                "localspluskinds",
                "co_code_adaptive",
                "co_tlbc",
            ],
        ),
        PYOBJECT,
        TYPE_OBJECT,
        TUPLE_OBJECT,
        LIST_OBJECT,
        section("set_object", &["size", "used", "table", "mask"]),
        DICT_OBJECT,
        FLOAT_OBJECT,
        LONG_OBJECT,
        BYTES_OBJECT,
        UNICODE_OBJECT,
        GC,
        section("gen_object", &["size", "gi_name", "gi_iframe", "gi_frame_state"]),
        section("llist_node", &["next", "prev"]),
        section(
            "debugger_support",
            &[
                "eval_breaker",
                "remote_debugger_support",
                "remote_debugging_enabled",
                "debugger_pending_call",
                "debugger_script_path",
                "debugger_script_path_size",
            ],
        ),
    ],
};

static DEBUG_OFFSETS: &[&DebugOffsetsLayout] = &[&DEBUG_OFFSETS_313, &DEBUG_OFFSETS_314];

/// The newest CPython whose `_Py_DebugOffsets` layout this code knows.
pub const NEWEST_KNOWN_MINOR: u32 = 14;

impl DebugOffsetsLayout {
    pub fn for_minor(minor: u32) -> Option<&'static DebugOffsetsLayout> {
        DEBUG_OFFSETS.iter().copied().find(|d| d.minor == minor)
    }

    /// Bytes from the cookie to the end of the last section.
    pub fn len(&self) -> usize {
        HEADER_BYTES + 8 * self.sections.iter().map(|s| s.fields.len()).sum::<usize>()
    }

    /// Byte position of `section.field` in the struct.
    pub fn position(&self, section: &str, field: &str) -> Option<usize> {
        let mut at = HEADER_BYTES;
        for s in self.sections {
            if s.name == section {
                return s.fields.iter().position(|f| *f == field).map(|i| at + 8 * i);
            }
            at += 8 * s.fields.len();
        }
        None
    }
}

/// The fields the frame walk and the code-object copy read, each with how
/// many bytes are read at that offset; width 0: a size, not an offset.
const NEEDED: &[(&str, &str, usize)] = &[
    ("thread_state", "current_frame", 8),
    ("interpreter_frame", "previous", 8),
    ("interpreter_frame", "executable", 8),
    ("interpreter_frame", "instr_ptr", 8),
    ("interpreter_frame", "owner", 1),
    ("code_object", "filename", 8),
    ("code_object", "name", 8),
    ("code_object", "qualname", 8),
    ("code_object", "linetable", 8),
    ("code_object", "firstlineno", 4),
    ("code_object", "co_code_adaptive", 2),
    ("pyobject", "ob_type", 8),
    ("bytes_object", "ob_size", 8),
    ("bytes_object", "ob_sval", 1),
    ("unicode_object", "state", 4),
    ("unicode_object", "length", 8),
    ("unicode_object", "asciiobject_size", 0),
];

/// Structs larger than this are not what the offsets claim to describe.
const MAX_STRUCT_BYTES: u64 = 1 << 20;

/// Builds the frame model of a 3.13+ interpreter from its own
/// `_Py_DebugOffsets` (`blob`, starting at the cookie, at least as long as
/// the layout read). Checks the cookie, that the version is the running
/// one, not free-threaded, and that every field read lies inside the
/// struct size the offsets give for it. Known layout facts are used only
/// where the offsets say nothing: the line-table format, the
/// incomplete-frame rule (`_co_firsttraceable`, the int 16 bytes before
/// `co_code_adaptive` from 3.11 to 3.14, and the owner values) and the
/// `f_executable` tags. A version newer than the newest known is read
/// with the newest known layout of the offsets and its facts, and only if
/// every field needed is described there and passes the checks.
pub fn layout_from_debug_offsets(blob: &[u8], major: u32, minor: u32) -> Result<PyLayout, String> {
    if blob.len() < HEADER_BYTES || &blob[..8] != COOKIE {
        return Err("no _Py_DebugOffsets cookie".into());
    }
    let d = DebugOffsetsLayout::for_minor(minor)
        .or_else(|| (major == 3 && minor > NEWEST_KNOWN_MINOR).then_some(&DEBUG_OFFSETS_314))
        .ok_or_else(|| format!("no _Py_DebugOffsets layout known for {major}.{minor}"))?;
    let word = |at: usize| -> Option<u64> {
        blob.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let hex = word(8).unwrap_or(0);
    if ((hex >> 24) & 0xff, (hex >> 16) & 0xff) != (major as u64, minor as u64) {
        return Err(format!("_Py_DebugOffsets is for version {hex:#x}"));
    }
    if word(16) != Some(0) {
        return Err("free-threaded build".into());
    }
    if blob.len() < d.len() {
        return Err("_Py_DebugOffsets shorter than its layout".into());
    }
    // The offsets are the first member of the runtime state they size.
    let runtime_size = d.position("runtime_state", "size").and_then(word).unwrap_or(0);
    if runtime_size < d.len() as u64 || runtime_size > MAX_STRUCT_BYTES * 16 {
        return Err(format!("_Py_DebugOffsets.runtime_state.size is {runtime_size}"));
    }
    let mut got = [0usize; NEEDED.len()];
    for (slot, &(sec, field, width)) in got.iter_mut().zip(NEEDED) {
        let (Some(size_at), Some(at)) = (d.position(sec, "size"), d.position(sec, field)) else {
            return Err(format!("_Py_DebugOffsets does not describe {sec}.{field}"));
        };
        let (size, value) = (word(size_at).unwrap_or(0), word(at).unwrap_or(u64::MAX));
        if size == 0 || size > MAX_STRUCT_BYTES {
            return Err(format!("_Py_DebugOffsets.{sec}.size is {size}"));
        }
        let fits = if width == 0 {
            value > 0 && value <= size
        } else {
            value.checked_add(width as u64).is_some_and(|end| end <= size)
        };
        if !fits {
            return Err(format!(
                "_Py_DebugOffsets.{sec}.{field} is {value}, outside the {size}-byte struct"
            ));
        }
        *slot = value as usize;
    }
    let [tstate_frame, frame_back, frame_code, frame_instr, frame_owner, code_filename, code_name, code_qualname, code_linetable, code_firstlineno, code_adaptive, ob_type, bytes_size, bytes_data, unicode_state, unicode_length, unicode_ascii_size] =
        got;
    // Every object starts with a refcount and its type: anything else means
    // the sections are not where this layout puts them.
    if ob_type != 8 || code_adaptive < 16 {
        return Err("_Py_DebugOffsets does not match its known layout".into());
    }
    Ok(PyLayout {
        major,
        minor,
        frames: d.frames,
        tstate_frame,
        cframe_current_frame: None,
        attached_is_thread_local: true,
        frame_code,
        frame_back,
        frame_instr,
        lasti_unit_bytes: 2,
        frame_is_entry: None,
        frame_owner: Some(frame_owner),
        owner_c_entry: Some(3),
        executable_tag_mask: d.executable_tag_mask,
        ob_type,
        code_filename,
        code_name,
        code_qualname: Some(code_qualname),
        code_firstlineno,
        code_linetable,
        code_code_adaptive: Some(code_adaptive),
        code_first_traceable: Some(code_adaptive - 16),
        owner_generator: Some(1),
        line_format: LineFormat::Locations311,
        bytes_size,
        bytes_data,
        unicode_length,
        unicode_state,
        unicode_ascii_size,
        // PyCompactUnicodeObject: PyASCIIObject, utf8_length, utf8
        unicode_compact_size: unicode_ascii_size + 16,
    })
}

/// The `_Py_DebugOffsets` at the start of `_PyRuntime`, as bytes.
///
/// # Safety
/// `runtime` is the address of the interpreter's `_PyRuntime`.
pub unsafe fn debug_offsets_blob(runtime: usize, minor: u32) -> Option<&'static [u8]> {
    if runtime == 0 {
        return None;
    }
    // SAFETY: `runtime` is not 0, so per the contract the address of
    // `_PyRuntime`, a global `_PyRuntimeState` of the interpreter's image
    // (the executable or libpython), far larger than these 24 bytes; u8
    // needs no alignment. 'static: an interpreter's image is not unloaded
    // while it runs. The interpreter writes these bytes from its static
    // initializer, and again on a re-initialization (Py_Initialize after
    // Py_Finalize) with the same values, never anything else, so no write
    // changes what the slice reads.
    let header = unsafe { std::slice::from_raw_parts(runtime as *const u8, HEADER_BYTES) };
    if &header[..8] != COOKIE {
        return Some(header);
    }
    // The cookie says this is the runtime state, which starts with the
    // offsets; its size, checked against the layout, bounds what is read.
    let d = DebugOffsetsLayout::for_minor(minor.min(NEWEST_KNOWN_MINOR))?;
    // SAFETY: `runtime` is not 0, so per the contract the address of
    // `_PyRuntime`, in the interpreter's image, mapped for as long as it
    // runs ('static), and written only with these same values; u8 needs
    // no alignment. On 3.13+ `_Py_DebugOffsets` is the first member of `_PyRuntimeState`, which also holds the main
    // interpreter's state inline (hundreds of KiB), so the at most 760
    // bytes of a known layout lie inside `_PyRuntime` even for a newer
    // version read with the newest known layout. The offsets' own
    // `runtime_state.size` is checked against this length when parsed.
    Some(unsafe { std::slice::from_raw_parts(runtime as *const u8, d.len()) })
}

/// The frame model from the running interpreter's own offsets.
///
/// # Safety
/// As [`debug_offsets_blob`].
pub unsafe fn layout_from_runtime(runtime: usize, major: u32, minor: u32) -> Result<PyLayout, String> {
    // SAFETY: `runtime` is `_PyRuntime` or 0, this function's contract,
    // which is the one `debug_offsets_blob` asks.
    let blob = unsafe { debug_offsets_blob(runtime, minor) }
        .ok_or("no _PyRuntime, or no _Py_DebugOffsets layout for it")?;
    layout_from_debug_offsets(blob, major, minor)
}

/// Checks a table layout against what the running interpreter says about
/// itself where it says anything: on 3.13+, the model built from
/// `_Py_DebugOffsets` must be the table's, field for field.
///
/// # Safety
/// As [`layout_from_runtime`]: `runtime` is this process's `_PyRuntime`
/// (what dlsym found for it) or 0; the memory there is read.
pub unsafe fn check_against_runtime(layout: &PyLayout, runtime: usize) -> Result<(), String> {
    if layout.minor < 13 {
        return Ok(());
    }
    // SAFETY: `runtime` is `_PyRuntime` or 0, this function's contract,
    // which is the one `layout_from_runtime` asks.
    let from_offsets = unsafe { layout_from_runtime(runtime, layout.major, layout.minor)? };
    match first_difference(layout, &from_offsets) {
        None => Ok(()),
        Some(field) => Err(format!("_Py_DebugOffsets disagrees with the table on {field}")),
    }
}

/// The first field (by name) in which two layouts differ.
pub fn first_difference(a: &PyLayout, b: &PyLayout) -> Option<&'static str> {
    let fields = |l: &PyLayout| -> [(&'static str, Option<usize>); 26] {
        [
            ("version", Some((l.major * 100 + l.minor) as usize)),
            ("frame model", Some(l.frames as usize)),
            ("thread_state.current_frame", Some(l.tstate_frame)),
            ("cframe.current_frame", l.cframe_current_frame),
            ("attached thread state", Some(l.attached_is_thread_local as usize)),
            ("interpreter_frame.executable", Some(l.frame_code)),
            ("interpreter_frame.previous", Some(l.frame_back)),
            ("interpreter_frame.instr_ptr", Some(l.frame_instr)),
            ("f_lasti unit", Some(l.lasti_unit_bytes as usize)),
            ("interpreter_frame.is_entry", l.frame_is_entry),
            ("interpreter_frame.owner", l.frame_owner),
            ("C entry owner", l.owner_c_entry.map(usize::from)),
            ("f_executable tags", Some(l.executable_tag_mask)),
            ("pyobject.ob_type", Some(l.ob_type)),
            ("code_object.filename", Some(l.code_filename)),
            ("code_object.name", Some(l.code_name)),
            ("code_object.qualname", l.code_qualname),
            ("code_object.firstlineno", Some(l.code_firstlineno)),
            ("code_object.linetable", Some(l.code_linetable)),
            ("code_object.co_code_adaptive", l.code_code_adaptive),
            ("code_object._co_firsttraceable", l.code_first_traceable),
            ("generator owner", l.owner_generator.map(usize::from)),
            ("line table format", Some(l.line_format as usize)),
            ("bytes_object", Some(l.bytes_size << 16 | l.bytes_data)),
            ("unicode_object", Some(l.unicode_length << 16 | l.unicode_state)),
            (
                "unicode_object sizes",
                Some(l.unicode_ascii_size << 16 | l.unicode_compact_size),
            ),
        ]
    };
    fields(a)
        .into_iter()
        .zip(fields(b))
        .find(|(x, y)| x != y)
        .map(|(x, _)| x.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::python_layouts::PY313;

    type Fields<'a> = &'a [(&'a str, u64)];

    /// A `_Py_DebugOffsets` as the interpreter holds it: cookie, version,
    /// free_threaded, then every section's u64 fields in order.
    fn blob(version: u64, free_threaded: u64, sections: &[(&str, Fields)]) -> Vec<u8> {
        let mut b = b"xdebugpy".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(free_threaded.to_le_bytes());
        for (_, fields) in sections {
            for (_, v) in fields.iter() {
                b.extend(v.to_le_bytes());
            }
        }
        b
    }
    type Sections = Vec<(&'static str, Vec<(&'static str, u64)>)>;

    /// CPython 3.14.0's `_Py_DebugOffsets`, from the test data file (its
    /// header says where each value comes from).
    fn py314_offsets() -> Sections {
        include_str!("testdata/py314_debug_offsets.txt")
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| {
                let mut words = line.split_whitespace();
                let section = words.next().unwrap();
                let fields = words
                    .map(|w| {
                        let (name, value) = w.split_once('=').unwrap();
                        (name, value.parse().unwrap())
                    })
                    .collect();
                (section, fields)
            })
            .collect()
    }

    /// The declared 3.14 layout lists exactly the header's sections and
    /// fields, in its order, and reads a captured 3.14 blob into the frame
    /// model: offsets from the blob, the rest from 3.14's known facts.
    #[test]
    fn a_3_14_blob_is_read_field_by_field() {
        let declared: Vec<(&str, Vec<&str>)> = DEBUG_OFFSETS_314
            .sections
            .iter()
            .map(|s| (s.name, s.fields.to_vec()))
            .collect();
        let py314 = py314_offsets();
        let header: Vec<(&str, Vec<&str>)> = py314
            .iter()
            .map(|(name, fields)| (*name, fields.iter().map(|f| f.0).collect()))
            .collect();
        assert_eq!(declared, header);
        let b = blob_of(0x030e_00f0, 0, &py314);
        assert_eq!(b.len(), DEBUG_OFFSETS_314.len());
        assert_eq!(b.len(), 760);

        let l = layout_from_debug_offsets(&b, 3, 14).expect("a 3.14 blob reads");
        assert_eq!((l.major, l.minor, l.frames), (3, 14, FrameModel::Interpreter314));
        assert_eq!(l.tstate_frame, 72);
        assert_eq!((l.frame_code, l.frame_back, l.frame_instr), (0, 8, 56));
        assert_eq!(l.frame_owner, Some(74));
        assert_eq!(
            (l.code_filename, l.code_name, l.code_qualname),
            (112, 120, Some(128))
        );
        assert_eq!((l.code_linetable, l.code_firstlineno), (136, 68));
        assert_eq!(l.code_code_adaptive, Some(208));
        assert_eq!(l.ob_type, 8);
        assert_eq!((l.bytes_size, l.bytes_data), (16, 32));
        assert_eq!((l.unicode_length, l.unicode_state), (16, 32));
        // Known facts of 3.14, not in the offsets:
        assert_eq!(l.code_first_traceable, Some(192), "_co_firsttraceable");
        assert_eq!(l.unicode_ascii_size, 40);
        assert_eq!(l.unicode_compact_size, 56);
        assert_eq!(l.executable_tag_mask, 3, "f_executable is a _PyStackRef");
        assert_eq!(l.owner_c_entry, Some(3), "FRAME_OWNED_BY_INTERPRETER");
        assert_eq!(l.owner_generator, Some(1));
        assert_eq!(l.line_format, LineFormat::Locations311);
        assert!(l.attached_is_thread_local);
    }

    /// 3.13's offsets, as the 3.13.0 table says they are.
    fn py313_offsets() -> Vec<(&'static str, Vec<(&'static str, u64)>)> {
        let l = &PY313;
        DEBUG_OFFSETS_313
            .sections
            .iter()
            .map(|s| {
                let value = |f: &str| -> u64 {
                    match (s.name, f) {
                        ("runtime_state", "size") => 100_000,
                        (_, "size") => 4096,
                        ("thread_state", "current_frame") => l.tstate_frame as u64,
                        ("interpreter_frame", "previous") => l.frame_back as u64,
                        ("interpreter_frame", "executable") => l.frame_code as u64,
                        ("interpreter_frame", "instr_ptr") => l.frame_instr as u64,
                        ("interpreter_frame", "owner") => 70,
                        ("code_object", "filename") => l.code_filename as u64,
                        ("code_object", "name") => l.code_name as u64,
                        ("code_object", "qualname") => 128,
                        ("code_object", "linetable") => l.code_linetable as u64,
                        ("code_object", "firstlineno") => l.code_firstlineno as u64,
                        ("code_object", "co_code_adaptive") => 200,
                        ("pyobject", "ob_type") => 8,
                        ("bytes_object", "ob_size") => 16,
                        ("bytes_object", "ob_sval") => 32,
                        ("unicode_object", "state") => 32,
                        ("unicode_object", "length") => 16,
                        ("unicode_object", "asciiobject_size") => 40,
                        _ => 0,
                    }
                };
                (s.name, s.fields.iter().map(|f| (*f, value(f))).collect())
            })
            .collect()
    }

    fn blob_of(version: u64, free: u64, sections: &[(&'static str, Vec<(&'static str, u64)>)]) -> Vec<u8> {
        let borrowed: Vec<(&str, Fields)> = sections.iter().map(|(n, f)| (*n, f.as_slice())).collect();
        blob(version, free, &borrowed)
    }

    fn set(sections: &mut [(&'static str, Vec<(&'static str, u64)>)], sec: &str, field: &str, v: u64) {
        let s = sections.iter_mut().find(|s| s.0 == sec).unwrap();
        s.1.iter_mut().find(|f| f.0 == field).unwrap().1 = v;
    }

    /// The model built from 3.13's offsets is the 3.13 table, field for
    /// field: what makes CUDALEAK_PYTHON_OFFSETS=1 on 3.13 a check of the
    /// offsets path (tests/python.rs runs both and compares the reports).
    #[test]
    fn the_3_13_offsets_give_the_3_13_table() {
        let o = py313_offsets();
        let l = layout_from_debug_offsets(&blob_of(0x030d_00f0, 0, &o), 3, 13).unwrap();
        assert_eq!(first_difference(&l, &PY313), None);
        let mut moved = o.clone();
        set(&mut moved, "code_object", "co_code_adaptive", 208);
        let l = layout_from_debug_offsets(&blob_of(0x030d_00f0, 0, &moved), 3, 13).unwrap();
        assert_eq!(first_difference(&l, &PY313), Some("code_object.co_code_adaptive"));
    }

    #[test]
    fn bad_offsets_are_refused_with_the_reason() {
        let o = py313_offsets();
        let ok = blob_of(0x030d_00f0, 0, &o);
        let refuse = |b: &[u8], minor: u32| layout_from_debug_offsets(b, 3, minor).unwrap_err();
        assert_eq!(refuse(&blob_of(0x030d_00f0, 1, &o), 13), "free-threaded build");
        assert!(refuse(&ok, 12).contains("no _Py_DebugOffsets layout"));
        assert!(refuse(&blob_of(0x030c_00f0, 0, &o), 13).contains("for version 0x30c00f0"));
        let mut bad_cookie = ok.clone();
        bad_cookie[0] = b'y';
        assert_eq!(refuse(&bad_cookie, 13), "no _Py_DebugOffsets cookie");
        assert!(refuse(&ok[..100], 13).contains("shorter"));
        // A field outside the struct the offsets size.
        let mut outside = o.clone();
        set(&mut outside, "interpreter_frame", "size", 64);
        assert_eq!(
            refuse(&blob_of(0x030d_00f0, 0, &outside), 13),
            "_Py_DebugOffsets.interpreter_frame.owner is 70, outside the 64-byte struct"
        );
        let mut no_size = o.clone();
        set(&mut no_size, "code_object", "size", 0);
        assert!(refuse(&blob_of(0x030d_00f0, 0, &no_size), 13).contains("code_object.size is 0"));
    }

    /// A newer interpreter is read with the newest known layout only while
    /// everything the walk needs is described and checks out.
    #[test]
    fn a_newer_interpreter_is_read_only_when_its_offsets_describe_the_walk() {
        let b = blob_of(0x030f_00a0, 0, &py314_offsets());
        let l = layout_from_debug_offsets(&b, 3, 15).expect("3.14-shaped offsets");
        assert_eq!((l.minor, l.code_code_adaptive), (15, Some(208)));
        // One more field early in the struct moves every section: the
        // checks refuse it rather than read the wrong words.
        let mut shifted = py314_offsets();
        shifted[1].1.push(("new_field", 123));
        let borrowed: Vec<(&str, Fields)> = shifted.iter().map(|(n, f)| (*n, f.as_slice())).collect();
        let err = layout_from_debug_offsets(&blob(0x030f_00a0, 0, &borrowed), 3, 15).unwrap_err();
        assert!(err.starts_with("_Py_DebugOffsets"), "{err}");
        assert!(layout_from_debug_offsets(&b, 4, 0).is_err());
    }
}
